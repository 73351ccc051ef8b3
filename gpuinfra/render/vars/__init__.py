"""Per-concern mappings from the model to role variables.

Each concern module here ends with its `CONCERN` (concern.py: its variables for the `all` group, per host and per
node group, its inventory groups and the files `gpuinfra plan` renders), and registry.py lists them all. Every value
is plain data: the inventory hands each string to Ansible as unsafe, so nothing here is ever evaluated as a template.
"""

from __future__ import annotations

from ...collection import module_util

_PROTOCOL = module_util("receipt_protocol")
# The roles a cluster file leaves out: each concern may give some; the inventory joins them, and the receipts' probe
# keeps every host out of their plays.
LEFT_OUT: str = _PROTOCOL.ROLES_LEFT_OUT
# The roles left out on one host only (the mig role on a GPU node without layouts), joined to the above by the probe.
HOST_LEFT_OUT: str = _PROTOCOL.HOST_ROLES_LEFT_OUT
