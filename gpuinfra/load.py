"""Load a cluster file: YAML with positions -> strict model -> cross-field checks -> per-host facts.

Any mistake in the file raises InvalidInput with every diagnostic found; warnings ride along on success.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from . import checks
from .errors import Diagnostic, InvalidInput
from .model import Cluster
from .resolve import ResolvedCluster
from .validation import diagnostics
from .yamlsource import YamlSource, read_yaml, to_plain


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
    try:
        model = Cluster.model_validate(data)
    except ValidationError as exc:
        raise InvalidInput(diagnostics(Cluster, source, data, exc)) from None
    resolved, found = checks.check(model, source, Path(path).parent)
    errors = [d for d in found if d.severity == "error"]
    if errors:
        raise InvalidInput(found)
    return LoadedCluster(Path(path), source, resolved, found)


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
    from . import mig

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
