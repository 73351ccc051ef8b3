"""What one more host costs a no-op apply: the sandbox's no-op re-apply at 2, 8, 16 and 32 GPU nodes.

For each size N, in one run: `gpuinfra sandbox up --gpu-nodes N` grows the sandbox (containers that already match are
kept) and `gpuinfra apply --yes` converges the new nodes (neither is timed); then the no-op re-apply and its floor
(one ping per host through the same runner) are timed as in noop_reapply.py, with the controller's CPU of each,
and each GPU node container's memory is read from `podman stats`. Prints the figures per size, the controller's
CPU per host of the no-op against the ping's (target: 1.5x or less at every size), the marginal cost per host
(t(32) - t(2)) / 30 against the 0.1 s target, and a straight-line extrapolation to 1,000 hosts at the same forks.

GPU nodes start from the image given by --image (default $GPUINFRA_NODE_IMAGE, else the base image). Give it the
DKMS-built driver image from molecule/shared/build-driver-image, so that no node builds the module again.

    .venv/bin/python benchmarks/noop_scaling.py [--sizes 2 8 16 32] [--forks N] [--image NAME]
"""

from __future__ import annotations

import argparse
import os
import re
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
FLEET = 1000
UNITS = {"B": 1, "kB": 1e3, "KB": 1e3, "MB": 1e6, "GB": 1e9, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}


@dataclass(frozen=True)
class Size:
    gpu_nodes: int
    hosts: int
    noop_s: float
    cpu_s: float
    """The controller's CPU seconds in the no-op (noop_reapply.children_cpu_s)."""
    floor_s: float
    floor_cpu_s: float
    """The controller's CPU seconds of the ping run."""


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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[2, 8, 16, 32], help="GPU node counts, ascending")
    parser.add_argument("--forks", type=int, help="forks of the timed runs (default: gpuinfra's)")
    parser.add_argument("--image", default=os.environ.get("GPUINFRA_NODE_IMAGE") or DEFAULT_IMAGE)
    args = parser.parse_args()
    rows: list[Size] = []
    for size in args.sizes:
        cluster = resized(SANDBOX, size, args.image)
        gpuinfra("sandbox", "up", "--image", args.image, str(cluster))  # not timed
        gpuinfra("apply", "--yes", str(cluster))  # not timed: converges the nodes this size added
        cpu_before = children_cpu_s()
        noop_s, result = reapply(cluster, args.forks)
        cpu_after = children_cpu_s()
        floor_s = floor(cluster, args.forks)
        row = Size(size, len(result.hosts), noop_s, cpu_after - cpu_before, floor_s, children_cpu_s() - cpu_after)
        spec = sandbox_spec(load_cluster(cluster), args.image)
        gpu_mb = memory_mb([c.name for c in spec.containers if c.gpus])
        changed = sum(stats.changed for stats in result.hosts.values())
        print(
            f"N={size:3d} GPU nodes ({row.hosts} hosts): no-op {row.noop_s:6.1f} s "
            f"(controller CPU {row.cpu_s:5.1f} s), floor {row.floor_s:5.1f} s (CPU {row.floor_cpu_s:5.1f} s), "
            f"CPU per host {row.cpu_s / row.hosts:.2f} s against the ping's {row.floor_cpu_s / row.hosts:.2f} s: "
            f"{row.cpu_s / row.floor_cpu_s:.2f}x (target {TARGET_CPU_RATIO}x), "
            f"changed {changed}, outcome {result.outcome.value}; memory per GPU node "
            f"{sum(gpu_mb) / len(gpu_mb):.0f} MB mean, {max(gpu_mb):.0f} MB max",
            flush=True,
        )
        if changed or result.outcome.value != "ok":
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
