"""A hung upgrade phase is stopped after the policy's phase_timeout and its node reported failed, instead of
holding the rollout (and its window) forever; nothing the phase started runs on after it. The drain phase gets the
drain timeout on top, as it waits for jobs."""

from __future__ import annotations

import sys
from pathlib import Path

import psutil
import pytest

from gpuinfra.upgrade.executor import AnsibleExecutor
from gpuinfra.validate.load import load_cluster

pytestmark = pytest.mark.tools  # runs Ansible or a system tool (tests/unit/tool_guard.py)

PLAYBOOK = Path(__file__).parent / "data" / "playbooks" / "hung_phase.yml"
ROOT = Path(__file__).resolve().parents[2]
INVENTORY = {
    "all": {"hosts": {"gpu01": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}}},
}


def test_a_hung_phase_times_out_and_fails_its_node() -> None:
    executor = AnsibleExecutor(inventory=INVENTORY, playbook=str(PLAYBOOK), phase_timeout=3, drain_timeout=600)
    # Without the timeout the 300 s task would end and the phase pass.
    result = executor("gpu01", "upgrade")
    assert result.status == "failed" and "longer than" in result.reason and "stopped" in result.reason
    assert left_behind("sleep 301", str(PLAYBOOK)) == []


def left_behind(*marks: str) -> list[str]:
    """Command lines of the processes still running that hold any of these strings."""
    found = []
    for process in psutil.process_iter(["cmdline"]):
        line = " ".join(process.info["cmdline"] or [])
        if any(mark in line for mark in marks):
            found.append(line)
    return found


def test_the_drain_phase_gets_the_drain_timeout_on_top() -> None:
    executor = AnsibleExecutor(inventory=INVENTORY, playbook=str(PLAYBOOK), phase_timeout=3, drain_timeout=600)
    assert (executor.timeout("drain"), executor.timeout("upgrade"), executor.timeout("health")) == (603, 3, 3)
    assert executor("gpu01", "drain").status == "ok"
    assert AnsibleExecutor(inventory=INVENTORY, playbook=str(PLAYBOOK)).timeout("upgrade") is None


def test_the_policy_sets_an_hour_per_phase_by_default() -> None:
    policy = load_cluster(ROOT / "inventories" / "slurm-small" / "cluster.yml").model.upgrade
    assert policy.phase_timeout == "1h"
