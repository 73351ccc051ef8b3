"""The sliding window: which nodes may start now, so that no more than `max_unavailable` are out at once.

The first `canary` nodes run alone, one after another; once they have all succeeded, the window opens to
`max_unavailable`, and the next node starts as soon as any node finishes, not when a whole batch does. The run
stops starting nodes once failures pass `max_failures`. The same object drives real runs and the simulation.

Out of service means running (drained, being worked on) or failed: a failed node stays drained with its reason,
so it keeps its place in the window. A skipped node (its drain timed out) was resumed untouched and frees it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field


def resolve_max_unavailable(value: int | str, nodes: int) -> int:
    """A count, or a percentage of the nodes rounded down, never below one."""
    if isinstance(value, str) and value.endswith("%"):
        return max(1, math.floor(nodes * int(value[:-1]) / 100))
    return max(1, int(value))


@dataclass
class RollingWindow:
    nodes: list[str]
    max_unavailable: int
    canary: int = 1
    max_failures: int = 0
    pending: list[str] = field(init=False)
    running: set[str] = field(init=False, default_factory=set)
    succeeded: list[str] = field(init=False, default_factory=list)
    failed: list[str] = field(init=False, default_factory=list)
    skipped: list[str] = field(init=False, default_factory=list)
    resuming: list[str] = field(init=False, default_factory=list)
    """Nodes a crashed run left out of service: they go first, whatever the width, as they are out already."""

    def __post_init__(self) -> None:
        if self.max_unavailable < 1:
            raise ValueError("max_unavailable must be at least 1")
        self.pending = list(self.nodes)

    def restore(self, succeeded: Iterable[str], failed: Iterable[str], in_flight: Iterable[str] = ()) -> None:
        """Take up a journal's outcomes: finished nodes are not started again, interrupted ones go first."""
        for node in succeeded:
            self._take(node)
            self.succeeded.append(node)
        for node in failed:
            self._take(node)
            self.failed.append(node)
        for node in in_flight:
            if node in self.pending:
                self.resuming.append(node)

    def _take(self, node: str) -> None:
        if node in self.pending:
            self.pending.remove(node)

    @property
    def stopped(self) -> bool:
        """Too many failures: start nothing more (running nodes still finish)."""
        return len(self.failed) > self.max_failures

    @property
    def width(self) -> int:
        """Nodes that may be at work now: 1 while canaries are unproven, then max_unavailable."""
        return 1 if len(self.succeeded) < min(self.canary, len(self.nodes)) else self.max_unavailable

    @property
    def out_of_service(self) -> int:
        return len(self.running) + len(self.failed)

    def startable(self) -> list[str]:
        """Nodes to start now; the caller must call `started` for each."""
        if self.stopped:
            return []
        # Interrupted nodes are out of service already, so continuing them never adds to the count.
        resume = [node for node in self.resuming if node in self.pending and node not in self.running]
        # Never more than max_unavailable out of service; while canaries are unproven, one node at work at a time.
        free = min(self.max_unavailable - self.out_of_service, self.width - len(self.running)) - len(resume)
        fresh = [node for node in self.pending if node not in resume][: max(0, free)]
        return resume + fresh

    def started(self, node: str) -> None:
        self.pending.remove(node)
        self.running.add(node)

    def finished(self, node: str, ok: bool, skipped: bool = False) -> None:
        self.running.remove(node)
        if skipped:
            self.skipped.append(node)
        else:
            (self.succeeded if ok else self.failed).append(node)

    @property
    def done(self) -> bool:
        return not self.running and (not self.startable())
