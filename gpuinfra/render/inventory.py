"""The Ansible inventory of a resolved cluster: groups from host roles, typed host and group vars.

`inventory_list` has the shape `ansible-inventory --list --export` prints; `inventory_yaml` is the same data in
the YAML inventory plugin's shape, which is what a run directory holds.

A cluster file is data, never code: both hand every string value to Ansible as unsafe (`__ansible_unsafe`, the
JSON form of `!unsafe`), so Ansible never evaluates one as a template, whatever it holds; only Ansible's own
connection settings stay plain strings (see `as_data`). The roles template their
own files with these values; `gpuinfra plan` renders the same templates with the same values, also as data.
"""

from __future__ import annotations

import shlex
from collections import Counter
from typing import Any

from ..model import ROLES
from ..resolve import Host, ResolvedCluster
from ..unsafe import as_data
from .receipts import NAMES, receipt_inputs, receipt_roles, receipt_variables
from .vars import LEFT_OUT
from .vars.registry import CONCERNS

GPU_NODES = "gpu_nodes"
FRESH_GROUP_PREFIX = "gpuinfra_fresh_"
# Roles a cluster file may leave out that record no receipt: their plays too leave out the fresh group's hosts.
OPTIONAL_ROLES = ("gpu_preflight", "kueue", "mig")
# The header every generated file starts with (templates write `{{ ansible_managed }}`): set in the inventory, so
# that a run writes exactly what `gpuinfra plan` shows.
ANSIBLE_MANAGED = "Managed by gpuinfra: changes here are overwritten on the next apply."


def host_vars(host: Host) -> dict[str, Any]:
    out = {
        "ansible_host": host.address,
        "gpuinfra_node_group": host.group,
        "gpuinfra_os": host.os,
        "gpuinfra_gpu_model": host.gpu_model,
        "gpuinfra_gpu_count": host.gpu_count,
        "gpuinfra_nvswitch": host.nvswitch,
        "gpuinfra_gpu_emulated": host.gpu_emulated,
        # JSON object keys are strings; Ansible templates see "0": "layout".
        "gpuinfra_mig_layouts": {str(index): name for index, name in sorted(host.mig_layouts.items())},
    }
    for concern in CONCERNS:
        if concern.host_vars:
            out.update(concern.host_vars(host))
    return out


def connection_vars(rc: ResolvedCluster) -> dict[str, Any]:
    conn = rc.model.connection
    out: dict[str, Any] = {
        "ansible_user": conn.user,
        "ansible_port": conn.port,
        "ansible_python_interpreter": conn.python_interpreter,
        "ansible_become": conn.user != "root",
    }
    if conn.ssh_key:
        out["ansible_ssh_private_key_file"] = conn.ssh_key
    ssh_args: list[str] = []
    if conn.known_hosts_file:
        ssh_args.append(f"-o UserKnownHostsFile={shlex.quote(conn.known_hosts_file)}")
    if not conn.host_key_checking:
        ssh_args.append("-o StrictHostKeyChecking=no")
    if conn.bastion:
        jump = f"{conn.bastion.user + '@' if conn.bastion.user else ''}{conn.bastion.host}:{conn.bastion.port}"
        ssh_args.append(f"-o ProxyJump={shlex.quote(jump)}")
    if ssh_args:
        out["ansible_ssh_common_args"] = " ".join(ssh_args)
    return out


def group_vars(rc: ResolvedCluster) -> dict[str, Any]:
    out: dict[str, Any] = {
        "gpuinfra_cluster_name": rc.model.name,
        "ansible_managed": ANSIBLE_MANAGED,
        NAMES: receipt_variables(),
        **connection_vars(rc),
    }
    left_out: list[str] = []
    for concern in CONCERNS:
        variables = concern.group_vars(rc)
        left_out += variables.pop(LEFT_OUT, [])
        out.update(variables)
    out[LEFT_OUT] = left_out
    return out


def groups(rc: ResolvedCluster) -> dict[str, list[str]]:
    """Inventory group -> hosts: one group per role (even when empty, so plays can target it), gpu_nodes and the
    groups the concerns add (slurm_config)."""
    out: dict[str, list[str]] = {role: [] for role in ROLES}
    out[GPU_NODES] = []
    # Filled during a run by playbooks/receipts.yml; present and empty, so plays that leave them out find them.
    out.update({FRESH_GROUP_PREFIX + role: [] for role in (*receipt_roles(), *OPTIONAL_ROLES)})
    for host in rc.hosts.values():
        for role in host.roles:
            out[role].append(host.name)
        if host.gpu_count:
            out[GPU_NODES].append(host.name)
    for concern in CONCERNS:
        if concern.inventory_groups:
            out.update(concern.inventory_groups(rc))
    return out


NODE_GROUP_PREFIX = "group_"


def node_group_inventory_name(name: str) -> str:
    """The inventory group of a node group: `group_<name>` (not `node_group_`: `--limit node*`
    would match it), '-' written '_' (Ansible warns of '-' in group names)."""
    return NODE_GROUP_PREFIX + name.replace("-", "_")


def node_group_vars(rc: ResolvedCluster) -> dict[str, dict[str, Any]]:
    """Node group -> the settings the concerns give all its hosts (slurmd's node definition, ...)."""
    per_group: dict[str, dict[str, Any]] = {}
    for concern in CONCERNS:
        if concern.node_group_vars:
            for group, variables in concern.node_group_vars(rc).items():
                per_group.setdefault(group, {}).update(variables)
    return per_group


def split_host_vars(
    rc: ResolvedCluster, cluster_vars: dict[str, Any]
) -> tuple[dict[str, tuple[list[str], dict[str, Any]]], dict[str, Any]]:
    """Each host's variables, those its whole node group shares moved to the node group's inventory group.

    Returns (inventory group -> (hosts, shared variables), host -> its own variables). Nearly every host variable
    comes from the node group, so a host keeps little more than `ansible_host`: Ansible then loads a 10,000-host
    inventory several times faster (it copies and tags every value of the file). Node groups whose names meet in
    one inventory name (`a-b`, `a_b`) get no group: their hosts keep every variable. `cluster_vars` are the `all`
    group's (group_vars), which the receipts' digests cover too."""
    per_group = node_group_vars(rc)
    own = {name: {**host_vars(host), **per_group.get(host.group, {})} for name, host in rc.hosts.items()}
    members: dict[str, list[str]] = {}
    for name, resolved in rc.hosts.items():
        members.setdefault(resolved.group, []).append(name)
    names = Counter(node_group_inventory_name(group) for group in members)
    shared: dict[str, tuple[list[str], dict[str, Any]]] = {}
    for group, hosts in members.items():
        inventory_name = node_group_inventory_name(group)
        if names[inventory_name] > 1:
            continue
        first = own[hosts[0]]
        common = {
            key: value
            for key, value in first.items()
            if key != "ansible_host" and all(_same(own[host].get(key, _MISSING), value) for host in hosts[1:])
        }
        shared[inventory_name] = (hosts, common)
        for host in hosts:
            own[host] = {key: value for key, value in own[host].items() if key not in common}
    _add_receipt_inputs(rc, cluster_vars, shared, own)
    return shared, own


def _add_receipt_inputs(
    rc: ResolvedCluster,
    cluster_vars: dict[str, Any],
    shared: dict[str, tuple[list[str], dict[str, Any]]],
    own: dict[str, dict[str, Any]],
) -> None:
    """Each role's inputs digest: in the node group's vars where all its hosts have the same, else the host's."""
    digests = receipt_inputs(cluster_vars, shared, own, groups(rc))
    for hosts, variables in shared.values():
        for key in list(digests[hosts[0]]):
            if all(digests[host][key] == digests[hosts[0]][key] for host in hosts):
                variables[key] = digests[hosts[0]][key]
                for host in hosts:
                    del digests[host][key]
    for host, remaining in digests.items():
        own[host].update(remaining)


_MISSING = object()


def _same(a: Any, b: Any) -> bool:
    """Equal as data: of the same types all the way down (True is not 1 here)."""
    if a is b:  # most of a node group's values are one object, shared by its hosts
        return True
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[key], b[key]) for key in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(map(_same, a, b))
    return bool(a == b)


def inventory_list(rc: ResolvedCluster) -> dict[str, Any]:
    """The inventory exactly as `ansible-inventory --list --export` prints it: every group is a child of `all`,
    but only groups with hosts get an entry of their own."""
    members = groups(rc)
    cluster_vars = group_vars(rc)
    node_groups, own = split_host_vars(rc, cluster_vars)
    grouped = {host for hosts in members.values() for host in hosts}
    ungrouped = [host for host in rc.hosts if host not in grouped]
    out: dict[str, Any] = {
        "_meta": {
            "hostvars": {name: as_data(variables) for name, variables in own.items() if variables},
            "profile": "inventory_legacy",
        },
        "all": {"children": ["ungrouped", *members, *node_groups], "vars": as_data(cluster_vars)},
    }
    if ungrouped:
        out["ungrouped"] = {"hosts": ungrouped}
    for name, hosts in members.items():
        if hosts:
            out[name] = {"hosts": hosts}
    for name, (hosts, variables) in node_groups.items():
        out[name] = {"hosts": hosts, **({"vars": as_data(variables)} if variables else {})}
    return out


def inventory_yaml(rc: ResolvedCluster) -> dict[str, Any]:
    members = groups(rc)
    cluster_vars = group_vars(rc)
    node_groups, own = split_host_vars(rc, cluster_vars)
    children: dict[str, Any] = {name: {"hosts": dict.fromkeys(hosts, None)} for name, hosts in members.items()}
    for name, (hosts, variables) in node_groups.items():
        children[name] = {"hosts": dict.fromkeys(hosts, None), "vars": as_data(variables)}
    return {
        "all": {
            "vars": as_data(cluster_vars),
            "hosts": {name: as_data(variables) for name, variables in own.items()},
            "children": children,
        }
    }
