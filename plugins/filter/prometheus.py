# Copyright: gpuinfra maintainers
# Apache License 2.0 (see LICENSE)
"""`prometheus_static_configs`: the target groups of a scrape job, one per inventory host, for a file_sd file (or
a job's `static_configs`).

A Jinja loop over the hosts costs a hostvars lookup and several filter calls per host, which at 10,000 hosts is
seconds; this reads each host's three variables once and writes the same YAML in one call.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any


def _address(host: str, variables: Mapping[str, Any], port: int) -> str:
    address = str(variables.get("ansible_host") or host)
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


def prometheus_static_configs(
    hosts: Iterable[str], hostvars: Mapping[str, Any], port: int, gpus: bool = False, indent: int = 6
) -> str:
    """YAML lines, `indent` spaces in: each host's `host:port` target (bracketed when an IPv6 address) with its
    `instance` and `node_group` labels, and `gpus_expected` (its GPU count) when `gpus`. Every value is
    JSON-quoted, so that no inventory value can start a YAML construct of its own."""
    pad = " " * int(indent)
    lines = []
    for host in hosts:
        variables = hostvars[host]
        lines += [
            f"{pad}- targets: [{json.dumps(_address(host, variables, int(port)))}]",
            f"{pad}  labels:",
            f"{pad}    instance: {json.dumps(str(host))}",
            f"{pad}    node_group: {json.dumps(str(variables.get('gpuinfra_node_group') or ''))}",
        ]
        if gpus:
            count = int(variables.get("gpuinfra_gpu_count") or 0)
            lines.append(f"{pad}    gpus_expected: {json.dumps(str(count))}")
    return "\n".join(lines)


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"prometheus_static_configs": prometheus_static_configs}
