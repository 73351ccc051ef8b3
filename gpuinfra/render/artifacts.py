"""Artifacts that `gpuinfra plan` shows: files a role renders from one of its own templates.

Each concern's vars module lists its artifacts. The plan renders them from the role's template with the same
variables Ansible would see (role defaults, then the inventory's vars, then the host's vars), so the file shown by
`plan` is the file a host gets.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Artifact:
    path: str
    """Where the plan writes it, e.g. `slurm/slurm.conf`."""
    role: str
    """Role whose template renders it."""
    template: str
    """Template file under roles/<role>/templates/."""
    host_role: str | None = None
    """Render it for the first host with this inventory role (None: needs no host vars)."""
