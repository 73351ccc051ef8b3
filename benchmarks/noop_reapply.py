"""No-op re-apply of the whole stack on the 3-node sandbox, against the floor of reaching the same hosts.

What users run many times a day: `gpuinfra apply` of a cluster that already matches its file. The sandbox is
started and converged first when it is not (not timed). Then, in this one run:
- the re-apply: validate, render and `playbooks/site.yml` through ansible-runner, exactly as `gpuinfra apply --yes`
  runs it; it must change nothing;
- the floor: one `ping` task per host through the same runner, inventory and SSH settings, which is the least any
  run against these hosts costs.
Prints both wall times, the changed count, and the ratios against the floor and against the 10 s target.

    .venv/bin/python benchmarks/noop_reapply.py [--cluster inventories/sandbox/cluster.yml]
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gpuinfra.apply import apply
from gpuinfra.render.inventory import inventory_yaml
from gpuinfra.render.plan import render
from gpuinfra.run import RunOptions, RunResult, run_playbook
from gpuinfra.targets import target_hosts
from gpuinfra.validate.load import load_cluster

ROOT = Path(__file__).resolve().parents[1]
TARGET_S = 10.0
FLOOR_PLAYBOOK = """---
- name: Reach every host once
  hosts: all
  gather_facts: false
  tasks:
    - name: Reach the host
      ansible.builtin.ping:
"""


def children_cpu_s() -> float:
    """CPU seconds of this process's finished children: ansible-playbook, its workers and their ssh clients, that
    is the controller's side of a run. The sandbox's hosts are containers outside this process tree, so the
    host's side of each task is not in it."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def reapply(cluster: Path, forks: int | None = None) -> tuple[float, RunResult]:
    """What `gpuinfra apply --yes FILE` does, timed from loading the file to the end of the run."""
    began = time.monotonic()
    loaded = load_cluster(cluster)
    render(loaded.resolved)  # apply renders the plan before it runs
    inventory = inventory_yaml(loaded.resolved)
    result = apply(inventory, RunOptions(forks=forks), hosts=target_hosts(inventory))
    return time.monotonic() - began, result


def floor(cluster: Path, forks: int | None = None) -> float:
    inventory = inventory_yaml(load_cluster(cluster).resolved)
    with tempfile.TemporaryDirectory() as tmp:
        playbook = Path(tmp) / "ping.yml"
        playbook.write_text(FLOOR_PLAYBOOK)
        began = time.monotonic()
        result = run_playbook(inventory, RunOptions(playbook=playbook, forks=forks), hosts=target_hosts(inventory))
        elapsed = time.monotonic() - began
    if result.outcome.value != "ok":
        raise SystemExit(f"the floor run did not succeed: {result.outcome.value} {result.errors}")
    return elapsed


def gpuinfra(*args: str) -> None:
    done = subprocess.run([sys.executable, "-m", "gpuinfra", *args], cwd=ROOT, check=False)
    if done.returncode != 0:
        raise SystemExit(f"gpuinfra {' '.join(args)} failed ({done.returncode})")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cluster", type=Path, default=ROOT / "inventories" / "sandbox" / "cluster.yml")
    args = parser.parse_args()
    # Not timed: bring the sandbox up and converge it (both are no-ops when already done).
    gpuinfra("sandbox", "up", str(args.cluster))
    gpuinfra("apply", "--yes", str(args.cluster))

    cpu_before = children_cpu_s()
    reapply_s, result = reapply(args.cluster)
    cpu_s = children_cpu_s() - cpu_before
    floor_s = floor(args.cluster)
    changed = sum(stats.changed for stats in result.hosts.values())
    tasks = sum(stats.ok + stats.skipped for stats in result.hosts.values())
    print(f"hosts: {len(result.hosts)}; re-apply outcome: {result.outcome.value}; changed: {changed}")
    print(f"  no-op re-apply (validate, plan, site.yml): {reapply_s:6.1f} s  ({tasks} task results)")
    print(f"    of which controller CPU (Ansible and ssh):  {cpu_s:6.1f} s")
    print(f"  floor (one ping per host, same runner):    {floor_s:6.1f} s")
    print(f"  ratio to the floor: {reapply_s / floor_s:.1f}x")
    print(f"  ratio to the {TARGET_S:.0f} s target: {reapply_s / TARGET_S:.2f}x")
    return 0 if changed == 0 and result.outcome.value == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
