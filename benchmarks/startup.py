"""Start-up of `gpuinfra apply` on a 10,000-host cluster: from launching the command to its first connection
attempt, with no host reachable. Prints the time to that attempt, the stages before it, and `ansible-inventory
--list` of the same hosts, from this one run.

The hosts cannot be reached: `ssh` is replaced (ANSIBLE_SSH_EXECUTABLE) by a script that records the moment it is
first called and fails as an unreachable host does. The run is stopped after that first call.

    .venv/bin/python benchmarks/startup.py [--nodes 10000]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML
from validate_render import cluster_file

from gpuinfra.collection import link_collection
from gpuinfra.render.applicable import applicable
from gpuinfra.render.inventory import inventory_yaml
from gpuinfra.run import INVENTORY_PLUGIN
from gpuinfra.targets import target_hosts
from gpuinfra.validate.load import load_cluster

ROOT = Path(__file__).resolve().parents[1]
TARGET_S = 4.0
FAKE_SSH = """#!/bin/sh
# Record the first connection attempt, then fail as an unreachable host does.
[ -e "{stamp}" ] || date +%s.%N > "{stamp}"
exit 255
"""


def _timed[T](what: str, fn: Callable[[], T]) -> T:
    began = time.perf_counter()
    value = fn()
    print(f"  {what}: {time.perf_counter() - began:.2f} s")
    return value


def stages(path: Path) -> dict[str, Any]:
    """The stages apply runs before Ansible starts, each timed in this process."""
    loaded = _timed("validate the cluster file", lambda: load_cluster(path))
    inventory = _timed("build the inventory", lambda: inventory_yaml(loaded.resolved))
    _timed("count the generated files", lambda: applicable(loaded.resolved))
    _timed("list the target hosts", lambda: target_hosts(inventory))
    return inventory


def first_attempt(path: Path, tmp: Path) -> float:
    """Seconds from launching `gpuinfra apply --yes` to its first ssh call."""
    stamp = tmp / "first-ssh"
    ssh = tmp / "ssh"
    ssh.write_text(FAKE_SSH.format(stamp=stamp))
    ssh.chmod(0o755)
    env = {**os.environ, "ANSIBLE_SSH_EXECUTABLE": str(ssh)}
    began = time.time()
    apply = subprocess.Popen(
        [sys.executable, "-m", "gpuinfra", "apply", "--yes", str(path)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        while not stamp.exists():
            if apply.poll() is not None:
                raise SystemExit(f"apply ended ({apply.returncode}) before any connection attempt")
            time.sleep(0.02)
        time.sleep(0.05)  # the stamp is written in one go, but give `date` time to close it
        return float(stamp.read_text()) - began
    finally:
        os.killpg(apply.pid, signal.SIGTERM)
        apply.wait()


def ansible_inventory(source: Path, plugin: str, collections: Path) -> float:
    command = [str(Path(sys.executable).parent / "ansible-inventory"), "-i", str(source), "--list"]
    env = {**os.environ, "ANSIBLE_INVENTORY_ENABLED": plugin, "ANSIBLE_COLLECTIONS_PATH": str(collections)}
    began = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, env=env)
    return time.perf_counter() - began


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=10_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        path = tmp / "cluster.yml"
        with path.open("w") as fh:
            YAML(typ="safe").dump(cluster_file(args.nodes), fh)
        print(f"hosts: {args.nodes}")
        print("stages before Ansible starts, timed in this process:")
        inventory = stages(path)
        inventory_file = tmp / "hosts.json"
        inventory_file.write_text(json.dumps(inventory))
        print(f"  inventory file: {inventory_file.stat().st_size / 1e6:.1f} MB")
        to_first = first_attempt(path, tmp)
        # The run's own source: the collection's plugin reading that file, as `gpuinfra apply` hands it to Ansible.
        source = tmp / "gpuinfra.yml"
        source.write_text(f"plugin: {INVENTORY_PLUGIN}\ninventory_file: {inventory_file.name}\n")
        link_collection(tmp / "collections")
        listed = ansible_inventory(source, INVENTORY_PLUGIN, tmp / "collections")
        listed_yaml = ansible_inventory(inventory_file, "ansible.builtin.yaml", tmp / "collections")
    print(
        f"gpuinfra apply to the first connection attempt: {to_first:.2f} s (target {TARGET_S:.0f} s: "
        f"{to_first / TARGET_S:.2f}x)"
    )
    print(f"ansible-inventory --list of the same hosts: {listed:.2f} s (the same file through Ansible's YAML plugin:")
    print(f"  {listed_yaml:.2f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
