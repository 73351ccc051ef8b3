#!/usr/bin/python
# Copyright: gpuinfra maintainers
# Apache License 2.0 (see LICENSE)
"""Find the address a host's services listen on: its cluster address, from its inventory address."""

from __future__ import annotations

import ipaddress
import socket
from typing import Any

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
---
module: cluster_address
short_description: Find the cluster address of a host, the one address its services listen on
version_added: "0.1.0"
description:
  - When O(name) is an IP address, that address is the cluster address.
  - When it is a host name, the host resolves it (as C(getent ahosts) does, through the system's resolver and
    C(/etc/hosts)) and the first address that is an address of this host and not a loopback address is the
    cluster address.
  - Fails, naming what the name resolved to, when no such address exists, so that a service never falls back to
    an address nobody meant (such as the default route's, or C(127.0.1.1) from Debian's C(/etc/hosts)).
  - An address belongs to the host when a socket can be bound to it.
  - Never changes the host.
options:
  name:
    description: The host's inventory address (C(ansible_host)), an IP address or a name.
    type: str
    required: true
author: gpuinfra maintainers
"""

EXAMPLES = r"""
- name: Find this host's cluster address
  gpuinfra.cluster.cluster_address:
    name: "{{ ansible_host | default(inventory_hostname) }}"
  register: cluster_address
"""

RETURN = r"""
address:
  description: The cluster address, without brackets.
  type: str
  returned: success
  sample: 10.0.0.11
resolved:
  description: Every address the name resolved to, in the resolver's order (the address itself for an IP).
  type: list
  elements: str
  returned: always
"""


def _literal(name: str) -> str | None:
    try:
        return str(ipaddress.ip_address(name.strip("[]")))
    except ValueError:
        return None


def resolve(name: str) -> list[str]:
    """Addresses of `name`, in the resolver's order, without repeats."""
    try:
        infos = socket.getaddrinfo(name, None, proto=socket.IPPROTO_TCP)
    except socket.gaierror:
        return []
    out: list[str] = []
    for family, _, _, _, sockaddr in infos:
        if family in (socket.AF_INET, socket.AF_INET6):
            address = str(sockaddr[0]).split("%")[0]
            if address not in out:
                out.append(address)
    return out


def is_local(address: str) -> bool:
    """Whether this host owns `address`: binding a socket to one it does not own fails."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.bind((address, 0))
    except OSError:
        return False
    return True


def cluster_address(name: str) -> tuple[str | None, list[str]]:
    literal = _literal(name)
    if literal is not None:
        return literal, [literal]
    resolved = resolve(name)
    for address in resolved:
        if not ipaddress.ip_address(address).is_loopback and is_local(address):
            return address, resolved
    return None, resolved


def main() -> None:
    module = AnsibleModule(argument_spec={"name": {"type": "str", "required": True}}, supports_check_mode=True)
    name: str = module.params["name"]
    address, resolved = cluster_address(name)
    result: dict[str, Any] = {"changed": False, "resolved": resolved}
    if address is None:
        found = ", ".join(resolved) if resolved else "nothing"
        module.fail_json(
            msg=(
                f"{name!r} resolves to {found} on this host, and none of that is a non-loopback address of this host, "
                "so its services have no cluster address to listen on. Set ansible_host (the node's address in the "
                "cluster file) to the host's cluster IP address, or make the name resolve to it on the host "
                "(DNS or /etc/hosts); monitoring.listen: any listens on every address instead."
            ),
            **result,
        )
    module.exit_json(address=address, **result)


if __name__ == "__main__":
    main()
