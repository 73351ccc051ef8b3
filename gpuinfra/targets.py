"""Which hosts a run targets: by Ansible's own rules for a `--limit` pattern, over the inventory gpuinfra renders."""

from __future__ import annotations

import contextlib
import io
from collections.abc import Mapping
from typing import Any


def target_hosts(inventory: Mapping[str, Any], limit: str | None = None) -> list[str]:
    """Hosts a run would touch, in inventory order, by Ansible's own rules for `limit` (groups, globs, !, &, ~re)."""
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader

    all_group = inventory.get("all") or {}
    children = all_group.get("children") or {}
    order = dict.fromkeys(all_group.get("hosts") or {})  # a dict keeps the order and finds a host at once
    for body in children.values():
        order.update(dict.fromkeys((body or {}).get("hosts") or {}))
    if not limit:  # every host: no need to build Ansible's inventory, seconds at 10,000 hosts
        return list(order)
    manager = InventoryManager(loader=DataLoader(), sources=None, parse=False)
    for host in all_group.get("hosts") or {}:
        manager.add_host(host)
    for group, body in children.items():
        manager.add_group(group)
        for host in (body or {}).get("hosts") or {}:
            manager.add_host(host, group=group)
    manager.reconcile_inventory()
    # Ansible prints its pattern warnings itself; the run reports them again as events, so keep this quiet.
    with contextlib.redirect_stderr(io.StringIO()):
        manager.subset(limit)
        matched = {host.name for host in manager.get_hosts("all")}
    return [host for host in order if host in matched]


def matching(inventory: Mapping[str, Any], hosts: list[str], limit: str | None) -> list[str]:
    """Those of `hosts` that `limit` matches, in their order; all of them when there is no limit."""
    if not limit:
        return hosts
    wanted = set(target_hosts(inventory, limit))
    return [host for host in hosts if host in wanted]
