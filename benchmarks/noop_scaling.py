"""What one more host costs a no-op apply: the sandbox's no-op re-apply at 2, 8, 16 and 32 GPU nodes.

For each size N, in one run: `gpuinfra sandbox up --gpu-nodes N` grows the sandbox (containers that already match are
kept), `gpuinfra apply --yes` converges the new nodes and one no-op lets them settle (none of these is timed); then
the no-op re-apply and its floor (one ping per host through the same runner) are timed as in noop_reapply.py, with
the controller's CPU of each, in PAIRS alternated pairs, and each GPU node container's memory is read from `podman
stats`. Prints the medians per size, the controller's CPU per host of the no-op against the ping's (target: 1.5x or
less at every size), the marginal cost per host (t(32) - t(2)) / 30 against the 0.1 s target, and a straight-line
extrapolation to 1,000 hosts at the same forks.

Why the settling no-op and the pairs: on these 2 cores the same run costs more CPU time on a busier machine. Right
after a converge the new nodes are still busy for a minute, and a no-op timed at once, before its ping, paid for
that: 2.7 s of controller CPU at 16 GPU nodes, against 1.6-1.8 s for the same no-op on the settled sandbox, whose
ping took 1.4-1.5 s either way. Alternating takes the order out of the ratio.

GPU nodes start from the image given by --image (default $GPUINFRA_NODE_IMAGE, else the base image). Give it the
DKMS-built driver image from molecule/shared/build-driver-image, so that no node builds the module again.

    .venv/bin/python benchmarks/noop_scaling.py [--sizes 2 8 16 32] [--forks N] [--pairs 3] [--image NAME]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from noop_reapply import children_cpu_s, floor, gpuinfra, reapply

from gpuinfra.sandbox import DEFAULT_IMAGE, resized, sandbox_spec
from gpuinfra.validate.load import load_cluster

ROOT = Path(__file__).resolve().parents[1]
SANDBOX = ROOT / "inventories" / "sandbox" / "cluster.yml"
TARGET_PER_HOST_S = 0.1
TARGET_CPU_RATIO = 1.5
PAIRS = 3
FLEET = 1000
UNITS = {"B": 1, "kB": 1e3, "KB": 1e3, "MB": 1e6, "GB": 1e9, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}


@dataclass(frozen=True)
class Size:
    """The medians of one size's alternated pairs."""

    gpu_nodes: int
    hosts: int
    noop_s: float
    cpu_s: float
    """The controller's CPU seconds in the no-op (noop_reapply.children_cpu_s)."""
    floor_s: float
    floor_cpu_s: float
    """The controller's CPU seconds of the ping run."""
    changed: int
    """Tasks changed over every timed no-op: 0, or the cluster was not converged."""


def memory_mb(containers: list[str]) -> list[float]:
    """Each container's memory use as `podman stats` reports it (its cgroup's usage), in MB."""
    done = subprocess.run(
        ["podman", "stats", "--no-stream", "--format", "{{.MemUsage}}", *containers],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    sizes = []
    for line in done.stdout.splitlines():  # "512.3MB / 25.28GB"
        match = re.match(r"\s*([\d.]+)\s*([A-Za-z]+)", line)
        if match is None:
            raise SystemExit(f"podman stats printed {line!r}, not a memory size")
        sizes.append(float(match[1]) * UNITS[match[2]] / 1e6)
    return sizes


def measured(cluster: Path, gpu_nodes: int, forks: int | None, pairs: int) -> Size:
    """One untimed no-op, then `pairs` of (no-op, ping), each with the controller's CPU; their medians."""
    reapply(cluster, forks)  # lets the nodes just converged settle; not timed
    noops, floors, changed = [], [], 0
    for _ in range(pairs):
        cpu_before = children_cpu_s()
        noop_s, result = reapply(cluster, forks)
        cpu_after = children_cpu_s()
        if result.outcome.value != "ok":
            raise SystemExit(f"the no-op at {gpu_nodes} GPU nodes did not succeed: {result.outcome.value}")
        noops.append((noop_s, cpu_after - cpu_before))
        floor_s = floor(cluster, forks)
        floors.append((floor_s, children_cpu_s() - cpu_after))
        changed += sum(stats.changed for stats in result.hosts.values())
    median = statistics.median
    return Size(
        gpu_nodes, len(result.hosts),
        median(t for t, _ in noops), median(c for _, c in noops),
        median(t for t, _ in floors), median(c for _, c in floors),
        changed,
    )  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[2, 8, 16, 32], help="GPU node counts, ascending")
    parser.add_argument("--forks", type=int, help="forks of the timed runs (default: gpuinfra's)")
    parser.add_argument("--pairs", type=int, default=PAIRS, help="alternated (no-op, ping) pairs per size")
    parser.add_argument("--image", default=os.environ.get("GPUINFRA_NODE_IMAGE") or DEFAULT_IMAGE)
    args = parser.parse_args()
    rows: list[Size] = []
    for size in args.sizes:
        cluster = resized(SANDBOX, size, args.image)
        gpuinfra("sandbox", "up", "--image", args.image, str(cluster))  # not timed
        gpuinfra("apply", "--yes", str(cluster))  # not timed: converges the nodes this size added
        row = measured(cluster, size, args.forks, args.pairs)
        spec = sandbox_spec(load_cluster(cluster), args.image)
        gpu_mb = memory_mb([c.name for c in spec.containers if c.gpus])
        print(
            f"N={size:3d} GPU nodes ({row.hosts} hosts), medians of {args.pairs}: no-op {row.noop_s:6.1f} s "
            f"(controller CPU {row.cpu_s:5.1f} s), floor {row.floor_s:5.1f} s (CPU {row.floor_cpu_s:5.1f} s), "
            f"CPU per host {row.cpu_s / row.hosts:.2f} s against the ping's {row.floor_cpu_s / row.hosts:.2f} s: "
            f"{row.cpu_s / row.floor_cpu_s:.2f}x (target {TARGET_CPU_RATIO}x), "
            f"changed {row.changed}; memory per GPU node {sum(gpu_mb) / len(gpu_mb):.0f} MB mean, "
            f"{max(gpu_mb):.0f} MB max",
            flush=True,
        )
        if row.changed:
            return 1
        rows.append(row)
    if len(rows) > 1:
        small, large = rows[0], rows[-1]
        added = large.hosts - small.hosts
        per_host, floor_per_host = (large.noop_s - small.noop_s) / added, (large.floor_s - small.floor_s) / added
        print(f"marginal cost per host, (t({large.gpu_nodes}) - t({small.gpu_nodes})) / {added}:")
        print(
            f"  no-op {per_host:.2f} s (floor {floor_per_host:.2f} s): {per_host / TARGET_PER_HOST_S:.1f}x the target"
        )
        cpu_per_host = (large.cpu_s - small.cpu_s) / added
        print(f"  controller CPU {cpu_per_host:.2f} s per host: what a fleet costs a controller's cores, whose hosts")
        print("  run their own side of each task on their own CPUs (here the hosts share this machine's)")
        fleet_s = small.noop_s + per_host * (FLEET - small.hosts)
        fleet_floor_s = small.floor_s + floor_per_host * (FLEET - small.hosts)
        print(f"  straight line to {FLEET} hosts at the same forks: {fleet_s:.0f} s (floor {fleet_floor_s:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
