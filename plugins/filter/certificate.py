# Copyright: gpuinfra maintainers
# Apache License 2.0 (see LICENSE)
"""`subject_alt_names`: the names and addresses a host's monitoring certificate covers, decided on the controller.

The CA signs what the inventory says a host is, never what the host says of itself: a host's facts or its own
resolver could name another host (the controller) or smuggle a line into the extensions file (`CA:TRUE`).
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Iterable
from typing import Any

from ansible.errors import AnsibleFilterError

_HOST_NAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*")


def _literal(value: str) -> str | None:
    try:
        return str(ipaddress.ip_address(value.strip("[]")))
    except ValueError:
        return None


def _resolved(name: str) -> list[str]:
    """The controller's own resolution of a name: its addresses, loopback left out; none when it does not resolve."""
    try:
        found = socket.getaddrinfo(name, None, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError):
        return []
    addresses = (ipaddress.ip_address(str(entry[4][0]).split("%")[0]) for entry in found)
    return [str(address) for address in addresses if not address.is_loopback]


def subject_alt_names(names: Iterable[Any]) -> str:
    """`DNS:name,...,IP:address,...` for the inventory's names of a host (its inventory name and `ansible_host`):
    names as DNS entries, IP addresses as IP entries, and the addresses the controller resolves the names to."""
    dns: list[str] = []
    ips: list[str] = []
    for raw in names:
        value = str(raw)
        literal = _literal(value)
        if literal is not None:
            ips.append(literal)
        elif len(value) <= 253 and _HOST_NAME.fullmatch(value):
            dns.append(value)
            ips.extend(_resolved(value))
        else:
            raise AnsibleFilterError(
                f"{value!r} is neither a host name nor an IP address: a monitoring certificate names only those"
            )
    entries = [f"DNS:{name}" for name in dict.fromkeys(dns)] + [f"IP:{ip}" for ip in dict.fromkeys(ips)]
    return ",".join(entries)


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"subject_alt_names": subject_alt_names}
