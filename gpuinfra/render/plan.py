"""Render every artifact a run would write, from the roles' own templates.

Variables are layered as Ansible layers them for a play: role defaults, then the inventory's `all` vars, then the
host's vars, then the role's vars/main.yml. Ansible's own templar does the rendering, so filters, lookups of other
variables and whitespace rules are exactly those of the `template` module.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from collections import ChainMap
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from ansible.parsing.dataloader import DataLoader
from ansible.plugins.loader import init_plugin_loader
from ansible.template import Templar, trust_as_template
from ansible.utils.collection_loader import AnsibleCollectionConfig
from ruamel.yaml import YAML

from ..collection import ROOT, link_collection
from ..resolve import ResolvedCluster
from .applicable import applicable
from .artifacts import Artifact
from .inventory import group_vars, groups, host_vars, node_group_vars


class RenderError(Exception):
    """A template that failed to render; names the artifact and the cause."""


@dataclass(frozen=True)
class Rendered:
    artifact: Artifact
    host: str | None
    content: str


@cache
def _role_file(role: str, folder: str) -> dict[str, Any]:
    """The variables of a role's defaults/main.yml or vars/main.yml."""
    path = ROOT / "roles" / role / folder / "main.yml"
    if not path.exists():
        return {}
    data = YAML(typ="safe").load(path.read_text()) or {}
    return {key: _trusted(value) for key, value in data.items()}


def _trusted(value: Any) -> Any:
    """Strings from role files are templates to Ansible; mark them so its templar expands them the same way."""
    if isinstance(value, str):
        return trust_as_template(value)
    if isinstance(value, list):
        return [_trusted(v) for v in value]
    if isinstance(value, dict):
        return {k: _trusted(v) for k, v in value.items()}
    return value


@cache
def _find_the_collection() -> None:
    """Let templates call the collection's own filters (`gpuinfra.cluster.*`) here too, as under ansible-playbook:
    the collection is put where Ansible looks for a playbook's own collections."""
    folder = Path(tempfile.mkdtemp(prefix="gpuinfra-plan-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    link_collection(folder / "collections")
    if AnsibleCollectionConfig.collection_finder is None:
        init_plugin_loader()
    AnsibleCollectionConfig.playbook_paths = [str(folder)]


def render(rc: ResolvedCluster, only: list[Artifact] | None = None) -> list[Rendered]:
    """Render the artifacts that apply to this cluster."""
    _find_the_collection()
    shared = group_vars(rc)
    members = groups(rc)
    per_group = node_group_vars(rc)

    def own(name: str) -> dict[str, Any]:
        """A host's variables as the inventory gives them: its own and its node group's (slurmd's node line)."""
        host = rc.hosts[name]
        return {**host_vars(host), **per_group.get(host.group, {})}

    all_hostvars = {name: ChainMap(own(name), shared) for name in rc.hosts}
    loader = DataLoader()
    out: list[Rendered] = []
    for artifact, host in applicable(rc, only):
        variables: dict[str, Any] = {
            **_role_file(artifact.role, "defaults"),
            **shared,
            **(own(host) if host else {}),
            **_role_file(artifact.role, "vars"),
            "groups": {"all": list(rc.hosts), **members},
            "hostvars": all_hostvars,
            "inventory_hostname": host or "localhost",
        }
        source = (ROOT / "roles" / artifact.role / "templates" / artifact.template).read_text()
        try:
            content = Templar(loader=loader, variables=variables).template(trust_as_template(source))
        except Exception as exc:  # Ansible raises many types; the plan reports which artifact broke.
            raise RenderError(f"{artifact.role}/templates/{artifact.template}: {exc}") from exc
        out.append(Rendered(artifact=artifact, host=host, content=str(content)))
    return out
