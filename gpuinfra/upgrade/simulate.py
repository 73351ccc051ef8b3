"""Discrete-event simulation of a rolling run: the real RollingWindow, with node durations drawn at random.

Time is simulated, not slept, so 1,000 nodes take milliseconds; the scheduling code is the one real runs use.
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Callable
from dataclasses import dataclass

from .rolling_window import RollingWindow


@dataclass(frozen=True)
class SimResult:
    makespan: float
    peak_unavailable: int
    """Most nodes out of service at once: running, plus failed ones left drained."""
    succeeded: int
    failed: int


def simulate(
    window: RollingWindow,
    duration: Callable[[str], float],
    fails: Callable[[str], bool] = lambda _: False,
) -> SimResult:
    clock = 0.0
    events: list[tuple[float, str]] = []
    peak = 0
    while not window.done:
        for node in window.startable():
            window.started(node)
            heapq.heappush(events, (clock + duration(node), node))
        peak = max(peak, window.out_of_service)
        if not events:
            break
        clock, node = heapq.heappop(events)
        window.finished(node, ok=not fails(node))
    return SimResult(clock, peak, len(window.succeeded), len(window.failed))


def fixed_batches(durations: list[float], k: int, canary: int = 1) -> float:
    """Makespan of kubespray-style batches: canaries one by one, then batches of k that wait for their slowest."""
    head, rest = durations[:canary], durations[canary:]
    return sum(head) + sum(max(rest[i : i + k]) for i in range(0, len(rest), k))


def optimum(nodes: int, k: int, mean: float) -> float:
    """The bound the issue measures against: ceil(N/k) x t for a typical node time t."""
    return math.ceil(nodes / k) * mean


def draw_durations(nodes: int, seed: int, mean: float = 600.0, spread: float = 0.3) -> list[float]:
    """Node times around `mean` seconds: drain waits, reboots and DKMS builds vary from node to node."""
    rng = random.Random(seed)
    return [max(mean * 0.2, rng.gauss(mean, mean * spread)) for _ in range(nodes)]
