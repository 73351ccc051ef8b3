"""Host rules: hostlists expand within the limits to RFC 1123 names, a host is in one group, and no two hosts
share an address. Names are checked after expansion, because a range can build what no single name shows."""

from __future__ import annotations

from ..hostlists import HostlistError, expand_hosts
from ..limits import MAX_HOSTS
from ..model import Cluster
from ..model.grammar import hostname_problem
from .diagnostics import Diagnostics


def check(model: Cluster, report: Diagnostics) -> dict[str, list[str]]:
    """Node group -> its expanded hosts, for the groups whose hosts are all valid."""
    owner: dict[str, str] = {}
    address_of: dict[str, str] = {}
    expanded: dict[str, list[str]] = {}
    budget = MAX_HOSTS
    for name, group in model.node_groups.items():
        loc = ("node_groups", name, "hosts")
        try:
            hosts = expand_hosts(group.hosts, budget)
        except HostlistError as exc:
            report.error(loc, str(exc) if budget == MAX_HOSTS else f"{exc} (the cluster's limit, with earlier groups)")
            continue
        budget -= len(hosts)
        if not hosts:
            report.error(loc, "expands to no hosts")
        bad = [(host, problem) for host in hosts if (problem := hostname_problem(host))]
        for host, problem in bad[:3]:  # a bad range repeats the same problem for every host; three say enough
            report.error(loc, f"expands to {host!r}, which is not an RFC 1123 host name: {problem}")
        if bad:
            continue
        for host in hosts:
            if host in owner and owner[host] != name:
                report.error(loc, f"host {host!r} is already in node group {owner[host]!r}; a host is in one group")
            owner.setdefault(host, name)
        for host in group.addresses:
            if host not in hosts:
                report.error(("node_groups", name, "addresses", host), f"{host!r} is not a host of this group")
        for host in hosts:
            address = group.addresses.get(host, host)
            other = address_of.setdefault(address, host)
            if other != host:
                where = ("node_groups", name, "addresses", host) if host in group.addresses else loc
                report.error(where, f"host {host!r} has the address {address!r} of host {other!r}; give each its own")
        expanded[name] = hosts
    return expanded
