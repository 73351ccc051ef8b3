"""Load a cluster file: YAML with positions and limits -> strict model -> cross-field rules -> per-host facts.

Any mistake in the file raises InvalidInput with every diagnostic found; warnings ride along on success. Paths on
the controller come back absolute, taken from the cluster file's folder, so every later step reads the same file
whatever the current directory.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, get_args

from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo

from .. import mig_layouts as mig
from ..errors import Diagnostic, InvalidInput
from ..model import Cluster
from ..model.grammar import ControllerPath
from ..resolve import ResolvedCluster
from . import rules
from .schema_errors import diagnostics
from .source import YamlSource, read_yaml, to_plain

EXTENSION_PREFIX = "x-"


@dataclass(frozen=True)
class LoadedCluster:
    path: Path
    source: YamlSource
    resolved: ResolvedCluster
    warnings: list[Diagnostic]

    @property
    def model(self) -> Cluster:
        return self.resolved.model


def load_cluster(path: str | Path) -> LoadedCluster:
    source = read_yaml(path)
    data = to_plain(source.data)
    if not isinstance(data, dict):
        raise InvalidInput([source.diagnostic((), "", "a cluster file is a mapping with `name` and `node_groups`")])
    # `x-` keys at the top are extension fields, as in the Compose format: a place for anchors that merge keys use.
    data = {key: value for key, value in data.items() if not str(key).startswith(EXTENSION_PREFIX)}
    try:
        model = Cluster.model_validate(data)
    except ValidationError as exc:
        raise InvalidInput(diagnostics(Cluster, source, data, exc)) from None
    base_dir = Path(path).resolve().parent
    absolute = absolute_paths(model, base_dir)
    templated = [source.diagnostic(loc, ".".join(loc), _TEMPLATED.format(value)) for loc, value in _templated(absolute)]
    if templated:
        raise InvalidInput(templated)
    resolved, found = rules.check(absolute, source)
    if any(d.severity == "error" for d in found):
        raise InvalidInput(found)
    return LoadedCluster(Path(path), source, resolved, found)


_CONTROLLER_PATH = get_args(ControllerPath)[1]


def absolute_paths(model: Any, base_dir: Path) -> Any:
    """The model with every controller-side path absolute: `~/` from the home folder, relative paths from
    `base_dir`. Fields are found by their type, so a new path field is covered without being listed here."""
    if not isinstance(model, BaseModel):
        return model
    update: dict[str, Any] = {}
    for name, field in type(model).model_fields.items():
        value = getattr(model, name)
        if isinstance(value, str) and _is_controller_path(field):
            update[name] = os.path.normpath(base_dir / Path(value).expanduser())
        elif isinstance(value, BaseModel):
            update[name] = absolute_paths(value, base_dir)
    return model.model_copy(update=update)


# The cluster file's values admit no template delimiter (grammar.py), but the folders a path is taken from are not
# the file's: a folder named `site{{ 6 * 7 }}` would reach Ansible's connection settings, which stay plain strings
# for the tools that read the inventory.
_TEMPLATE_STARTS = ("{{", "{%", "{#")
_TEMPLATED = "the path {!r} holds a template delimiter, from a folder's name, which Ansible would run: move the file"


def _templated(model: Any, loc: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], str]]:
    """Every controller-side path of `model` (made absolute) that holds `{{`, `{%` or `{#`, with its location."""
    found: list[tuple[tuple[str, ...], str]] = []
    for name, field in type(model).model_fields.items():
        value = getattr(model, name)
        if isinstance(value, str) and _is_controller_path(field):
            if any(start in value for start in _TEMPLATE_STARTS):
                found.append(((*loc, name), value))
        elif isinstance(value, BaseModel):
            found.extend(_templated(value, (*loc, name)))
    return found


def _is_controller_path(field: FieldInfo) -> bool:
    """Pydantic keeps the metadata of a plain `ControllerPath` field on the field, and of `ControllerPath | None`
    on the union's member."""
    return _CONTROLLER_PATH in field.metadata or _CONTROLLER_PATH in _metadata(field.annotation)


def _metadata(annotation: Any) -> list[Any]:
    """Metadata of an annotation and of the members of a union (`ControllerPath | None`)."""
    out = list(getattr(annotation, "__metadata__", ()))
    for arg in getattr(annotation, "__args__", ()):
        out.extend(getattr(arg, "__metadata__", ()))
    return out


def is_mig_parted(path: str | Path) -> bool:
    """A mig-parted v1 file rather than a cluster file (it has `mig-configs` at the top)."""
    try:
        data = to_plain(read_yaml(path).data)
    except InvalidInput:
        return False
    return isinstance(data, dict) and "mig-configs" in data


def load_mig_parted(path: str | Path) -> list[Diagnostic]:
    """Check a mig-parted v1 file on its own: form everywhere, and every layout with a device filter against
    the catalogued GPUs its PCI IDs name. Returns the warnings; raises InvalidInput on errors."""
    source = read_yaml(path)
    _configs, problems = mig.parse_parted(to_plain(source.data))
    found = [source.diagnostic(p.path, _parted_path(p.path), p.message, p.severity) for p in problems]
    if any(d.severity == "error" for d in found):
        raise InvalidInput(found)
    return found


def _parted_path(loc: tuple[str | int, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) or out.endswith("mig-configs") else (f".{part}" if out else part)
    return out
