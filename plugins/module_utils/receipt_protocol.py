# Copyright: gpuinfra maintainers
# Apache License 2.0 (see LICENSE)
"""The names the inventory and the receipt's action plugin agree on. Defined here once: the action plugin imports
this file, and gpuinfra (which writes the inventory) loads it from the collection (gpuinfra/collection.py)."""

from __future__ import annotations

INPUTS_PREFIX = "gpuinfra_receipt_"
"""Inventory variable `gpuinfra_receipt_<role>`: the digest of that role's inputs on that host. An inventory without
them (a role applied by hand, Molecule) records and skips nothing."""
HOST_INPUTS = "gpuinfra_receipts_host"
"""Inventory variable: the digest of the variables a host holds on its own (its address, ...)."""
HOST_MARK = "+host"
"""The end of a role's digest that also covers the host's own variables: the action plugin completes it with the
host's HOST_INPUTS."""
NAMES = "gpuinfra_receipt_variables"
"""Inventory variable: role -> the public role variables its files read. Their values in the run, from any source
(the inventory, group_vars and host_vars, ansible-vault, -e, an AWX survey), are inputs too."""
ROLES_LEFT_OUT = "gpuinfra_roles_left_out"
"""Inventory variable: the roles the cluster file leaves out; the probe skips them on every host, as if fresh."""
HOST_ROLES_LEFT_OUT = "gpuinfra_host_roles_left_out"
"""Inventory variable: the roles left out on one host only (the mig role on a GPU node without layouts)."""
