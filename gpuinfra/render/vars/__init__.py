"""Per-concern mappings from the model to role variables.

Each module here exposes `group_vars(rc) -> dict` (role-prefixed variables for the `all` group), optionally
`host_vars(host) -> dict` (settings that differ per host), `node_group_vars(rc) -> {node group: dict}` (settings
that differ per node group), `inventory_groups(rc) -> {group: hosts}` (groups beyond one per role), and
`ARTIFACTS` (files `gpuinfra plan` renders from that concern's role templates). Every value is plain data: the
inventory hands each string to Ansible as unsafe, so nothing here is ever evaluated as a template.
"""

from __future__ import annotations

import functools
import importlib
from types import ModuleType

from ...collection import module_util

_PROTOCOL = module_util("receipt_protocol")
# The roles a cluster file leaves out: each concern may give some; the inventory joins them, and the receipts' probe
# keeps every host out of their plays.
LEFT_OUT: str = _PROTOCOL.ROLES_LEFT_OUT
# The roles left out on one host only (the mig role on a GPU node without layouts), joined to the above by the probe.
HOST_LEFT_OUT: str = _PROTOCOL.HOST_ROLES_LEFT_OUT
# Concern modules, in the order their variables are merged.
CONCERNS: tuple[str, ...] = ("driver", "toolkit", "health", "mig", "kubernetes", "slurm", "monitoring")


@functools.cache  # called per host: an import's lookup costs more than the host's variables
def concern_modules() -> tuple[ModuleType, ...]:
    return tuple(importlib.import_module(f"{__name__}.{name}") for name in CONCERNS)
