"""Rolling-upgrade makespan over simulated nodes: the sliding window against ceil(N/k) x t and against fixed
batches of k that wait for their slowest node. Ratios from one run of the real scheduling code.

    .venv/bin/python benchmarks/rolling_upgrade.py [--nodes 1000] [--k 10] [--seed 1]
"""

from __future__ import annotations

import argparse
import sys

from gpuinfra.upgrade.rolling_window import RollingWindow
from gpuinfra.upgrade.simulate import draw_durations, fixed_batches, optimum, simulate


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--k", type=int, default=10, help="max_unavailable")
    parser.add_argument("--canary", type=int, default=1)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    durations = draw_durations(args.nodes, args.seed)
    mean = sum(durations) / len(durations)
    window = RollingWindow([str(i) for i in range(args.nodes)], args.k, args.canary)
    result = simulate(window, lambda n: durations[int(n)])
    best = optimum(args.nodes, args.k, mean)
    batches = fixed_batches(durations, args.k, args.canary)
    print(f"nodes={args.nodes} max_unavailable={args.k} canary={args.canary} mean node time={mean:.0f}s")
    print(f"peak out of service: {result.peak_unavailable}")
    print(f"sliding window makespan: {result.makespan:.0f}s = {result.makespan / best:.3f}x ceil(N/k)*t")
    print(f"fixed batches makespan:  {batches:.0f}s = {batches / best:.3f}x ceil(N/k)*t")
    print(f"fixed batches / sliding window: {batches / result.makespan:.3f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
