"""Adding one GPU node to a converged sandbox, against converging one fresh GPU node on its own.

The sandbox's cluster file is resized from N to N+2 GPU nodes and both new containers are started. Then, in this
one run:
- the addition: `gpuinfra apply` of every host but the last new one. The first new node runs its roles in full;
  of the converged hosts, only the controller runs roles (slurm.conf, Prometheus' targets): the GPU nodes fetch
  their Slurm configuration from slurmctld (configless), so no role of theirs reads the node list;
- the single node: `gpuinfra apply --limit` the last new node, whose place in slurm.conf and Prometheus the
  addition already wrote: one GPU node converged from its container image alone.
Prints both wall times, their ratio against the 1.2 target, and which hosts changed in the addition (the target:
the controller and the new node only).

    .venv/bin/python benchmarks/add_node.py [--image localhost/gpuinfra-debian12-nvidia]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from noop_reapply import gpuinfra
from noop_scaling import SANDBOX

from gpuinfra.apply import apply
from gpuinfra.render.inventory import inventory_yaml
from gpuinfra.run import RunOptions, RunResult
from gpuinfra.sandbox import DEFAULT_IMAGE, resized
from gpuinfra.targets import target_hosts
from gpuinfra.validate.load import load_cluster

TARGET_RATIO = 1.2


def timed_apply(cluster: Path, limit: str) -> tuple[float, RunResult]:
    began = time.monotonic()
    inventory = inventory_yaml(load_cluster(cluster).resolved)
    result = apply(inventory, RunOptions(limit=limit), hosts=target_hosts(inventory, limit))
    return time.monotonic() - began, result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpu-nodes", type=int, default=2, help="GPU nodes of the converged sandbox (N)")
    parser.add_argument("--image", default=os.environ.get("GPUINFRA_NODE_IMAGE") or DEFAULT_IMAGE)
    args = parser.parse_args()
    before = resized(SANDBOX, args.gpu_nodes, args.image)
    gpuinfra("sandbox", "up", "--image", args.image, str(before))  # not timed
    gpuinfra("apply", "--yes", str(before))  # not timed: the converged cluster of N GPU nodes
    after = resized(SANDBOX, args.gpu_nodes + 2, args.image)
    gpuinfra("sandbox", "up", "--image", args.image, str(after))  # not timed: starts the two new containers
    last = f"gpu{args.gpu_nodes + 2:02d}"

    add_s, added = timed_apply(after, f"all:!{last}")
    single_s, single = timed_apply(after, last)
    for name, result in (("addition", added), ("single node", single)):
        if result.outcome.value not in ("ok", "changed"):
            print(f"the {name} failed: {result.outcome.value}")
            return 1
    changed = {host: stats.changed for host, stats in added.hosts.items() if stats.changed}
    print(f"adding gpu{args.gpu_nodes + 1:02d} to {args.gpu_nodes} GPU nodes: {add_s:.1f} s")
    print(f"  tasks changed per host: {changed}")
    print(f"converging {last} alone: {single_s:.1f} s")
    print(f"ratio: {add_s / single_s:.2f} (target {TARGET_RATIO})")
    others = sorted(set(changed) - {"ctl01", f"gpu{args.gpu_nodes + 1:02d}"})
    print(f"hosts changed besides the controller and the new node: {others or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
