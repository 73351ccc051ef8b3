"""Validate and render the inventory of a 10,000-node cluster, against `ansible-inventory --list` on the same
hosts as a static YAML inventory. Prints the times and the ratio from this one run.

    .venv/bin/python benchmarks/validate_render.py [--nodes 10000]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ruamel.yaml import YAML

from gpuinfra.render.inventory import inventory_list, inventory_yaml
from gpuinfra.validate.load import load_cluster

GROUPS = [
    ("h200", "H200-SXM5-141GB", 8),
    ("h100", "H100-SXM5-80GB", 8),
    ("a100", "A100-SXM4-80GB", 8),
    ("l40s", "L40S", 4),
]


def cluster_file(nodes: int) -> dict[str, object]:
    per_group = (nodes - 2) // len(GROUPS)
    node_groups: dict[str, object] = {
        "head": {"hosts": "head01", "roles": ["slurm_controller", "monitoring"]},
        "dbd": {"hosts": "dbd01", "roles": ["slurm_dbd"]},
    }
    for i, (name, model, count) in enumerate(GROUPS):
        size = per_group if i < len(GROUPS) - 1 else nodes - 2 - per_group * (len(GROUPS) - 1)
        node_groups[name] = {
            "hosts": f"{name}-[00001-{size:05d}]",
            "roles": ["slurm_compute"],
            "gpu": {"model": model, "count": count, "nvswitch": count == 8},
            "cpus": 128,
            "memory_mb": 1000000,
        }
    return {
        "name": "bench",
        "node_groups": node_groups,
        "driver": {"version": "570.172.08", "source": {"type": "nvidia"}},
        "slurm": {"partitions": {g: {"node_groups": [g]} for g, _, _ in GROUPS}},
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=10_000)
    args = parser.parse_args()
    ansible_inventory = shutil.which("ansible-inventory") or str(Path(sys.executable).parent / "ansible-inventory")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "cluster.yml"
        with path.open("w") as fh:
            YAML(typ="safe").dump(cluster_file(args.nodes), fh)

        start = time.perf_counter()
        loaded = load_cluster(path)
        rendered = json.dumps(inventory_list(loaded.resolved))
        ours = time.perf_counter() - start
        assert len(loaded.resolved.hosts) == args.nodes

        static = Path(tmp) / "hosts.yml"
        with static.open("w") as fh:
            YAML(typ="safe").dump(inventory_yaml(loaded.resolved), fh)
        start = time.perf_counter()
        subprocess.run([ansible_inventory, "-i", str(static), "--list"], check=True, stdout=subprocess.DEVNULL)
        theirs = time.perf_counter() - start

    print(f"nodes: {args.nodes}")
    print(f"gpuinfra validate + render inventory: {ours:.3f} s ({len(rendered) / 1e6:.1f} MB of JSON)")
    print(f"ansible-inventory --list (static YAML): {theirs:.3f} s")
    print(f"ratio (ansible-inventory / gpuinfra): {theirs / ours:.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
