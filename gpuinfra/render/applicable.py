"""Which of the concerns' artifacts a cluster gets, and the host each is rendered for.

Kept apart from plan.py, which imports Ansible's templar: `gpuinfra apply` counts these files before it starts
ansible-playbook, and that import would only add to its start-up."""

from __future__ import annotations

from ..resolve import ResolvedCluster
from .artifacts import Artifact
from .inventory import groups
from .vars.registry import CONCERNS


def artifacts() -> list[Artifact]:
    return [artifact for concern in CONCERNS for artifact in concern.artifacts]


def applicable(rc: ResolvedCluster, only: list[Artifact] | None = None) -> list[tuple[Artifact, str | None]]:
    """The artifacts that apply to this cluster, each with the host it is rendered for (the first of its host
    role; None for one rendered on the controller). Those whose host role has no host are left out."""
    members = groups(rc)
    out: list[tuple[Artifact, str | None]] = []
    for artifact in only if only is not None else artifacts():
        if not artifact.host_role:
            out.append((artifact, None))
        elif members.get(artifact.host_role):
            out.append((artifact, members[artifact.host_role][0]))
    return out
