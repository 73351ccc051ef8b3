"""Slurm-style hostlist expressions (`gpu[01-16]`), expanded within the cluster's host limit."""

from __future__ import annotations

import hostlist

from .limits import MAX_HOSTS


class HostlistError(ValueError):
    """A hostlist expression that cannot be expanded."""


def expand_hosts(hosts: str | list[str], budget: int = MAX_HOSTS) -> list[str]:
    """Expand Slurm-style hostlist expressions (`gpu[01-16]`) into host names, in order, refusing to build more
    than `budget` names (python-hostlist refuses a single range beyond its own cap before building it)."""
    exprs = [hosts] if isinstance(hosts, str) else hosts
    names: list[str] = []
    for expr in exprs:
        try:
            names.extend(hostlist.expand_hostlist(expr))
        except hostlist.BadHostlist as exc:
            raise HostlistError(f"bad hostlist expression {expr!r}: {exc}") from None
        if len(names) > budget:
            raise HostlistError(f"expands to more than {budget} hosts")
    return names
