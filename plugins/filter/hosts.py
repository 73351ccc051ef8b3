# Copyright: gpuinfra maintainers
# Apache License 2.0 (see LICENSE)
"""`matched_hosts`: the hosts that any of several host patterns match, each pattern on its own, by Ansible's own
pattern rules, against a run's groups (`groups`, with those the run added).

The builtin `inventory_hostnames` lookup would not do: a list of patterns is one pattern to it (an exclusion in one
takes hosts out of all), and a pattern it cannot match answers [] instead of an error, which here would read as
"nothing to do"."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ansible.errors import AnsibleFilterError
from ansible.inventory.manager import InventoryManager
from ansible.parsing.dataloader import DataLoader


def matched_hosts(groups: Mapping[str, list[str]], patterns: list[str]) -> list[str]:
    """Every host some pattern of `patterns` matches, in the order of `groups['all']`."""
    if not isinstance(groups, Mapping) or not isinstance(patterns, list):
        raise AnsibleFilterError("matched_hosts takes the groups (a mapping) and a list of host patterns")
    manager = InventoryManager(loader=DataLoader(), sources=None, parse=False)
    for group, hosts in groups.items():
        manager.add_group(str(group))
        for host in hosts:
            manager.add_host(str(host), group=str(group))
    matched: set[str] = set()
    for pattern in patterns:
        try:
            matched.update(host.name for host in manager.get_hosts(pattern=str(pattern)))
        except Exception as exc:  # Ansible raises several types for a pattern it cannot read
            raise AnsibleFilterError(f"cannot match the host pattern {pattern!r}: {exc}") from exc
    return [str(host) for host in groups.get("all", []) if str(host) in matched]


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"matched_hosts": matched_hosts}
