# Copyright: gpuinfra maintainers
# Apache License 2.0 (see LICENSE)
"""The health checks' breaker: how many nodes of a Slurm partition they may hold drained at once, counted from the
scheduler's own state (nodes drained with the health program's reason).

Standard library only, Python 3.9 or newer, no I/O: the node health program, which enforces the limit, and the
controller's admission module, which reports it to the health sweep, count with the same code.
"""

from __future__ import annotations

from typing import Any

# The start of every drain reason the node health program writes.
HEALTH_REASON_PREFIX = "gpuinfra-health:"


def drain_limit(value: Any, nodes: int) -> int:
    """`max_drained`: a count, or a percentage of the partition's nodes rounded down; never below one."""
    text = str(value).strip()
    if text.endswith("%"):
        return max(1, int(nodes * int(text[:-1]) // 100))
    return max(1, int(text))


def held_by_health(state: str, reason: str) -> bool:
    """A node the health checks hold drained: sinfo's state (drained, draining, idle+drain, ...) and its reason."""
    return "drain" in state.lower() and reason.startswith(HEALTH_REASON_PREFIX)
