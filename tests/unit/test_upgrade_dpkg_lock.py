"""The upgrade's wait for the package manager: a real fcntl lock (the kind dpkg and apt take) held by another
process is waited for, then its holder is named; a lock released in time lets the upgrade go on.

The node_upgrade role's preparation (roles/node_upgrade/tasks/prepare.yml) runs through ansible-runner on this
machine, with a lock file of the test's own instead of dpkg's, and with services and modules left alone.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuinfra.run import Outcome, RunOptions, run_playbook

pytestmark = [
    pytest.mark.tools,  # runs Ansible or a system tool (tests/unit/tool_guard.py)
    pytest.mark.skipif(shutil.which("lslocks") is None, reason="lslocks (util-linux) is not installed"),
]

HOLDER = """
import fcntl, sys, time
shared = sys.argv[3] == "read"
handle = open(sys.argv[1], "r" if shared else "w")
fcntl.lockf(handle, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
print("locked", flush=True)
time.sleep(float(sys.argv[2]))
"""


@pytest.fixture
def lock_file(tmp_path: Path) -> Path:
    path = tmp_path / "dpkg" / "lock-frontend"
    path.parent.mkdir()
    path.touch()
    return path


@contextlib.contextmanager
def hold(path: Path, seconds: float, mode: str = "write") -> Iterator[subprocess.Popen[str]]:
    """A process that takes an fcntl lock on `path` (a write lock, as dpkg does, or a read lock) for `seconds`."""
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(path), str(seconds), mode], stdout=subprocess.PIPE, text=True
    )
    assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
    try:
        yield holder
    finally:
        holder.kill()
        holder.wait()


def prepare(tmp_path: Path, lock_file: Path, timeout: int) -> Any:
    playbook = tmp_path / "prepare.yml"
    playbook.write_text(
        "- name: Prepare the node for its upgrade\n"
        "  hosts: all\n"
        "  tasks:\n"
        "    - name: Run the upgrade's preparation\n"
        "      ansible.builtin.include_role:\n"
        "        name: gpuinfra.cluster.node_upgrade\n"
        "        tasks_from: prepare.yml\n"
    )
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    inventory = {"all": {"hosts": {"node": local}}}
    extra = {
        "node_upgrade_locks": [str(lock_file)],
        "node_upgrade_lock_timeout": timeout,
        "node_upgrade_gpu_clients": [],
        "node_upgrade_service_manage": False,
    }
    return run_playbook(inventory, RunOptions(playbook=playbook, extra_vars=extra), hosts=["node"])


def test_a_held_lock_is_waited_for_then_its_holder_is_named(tmp_path: Path, run_root: Path, lock_file: Path) -> None:
    with hold(lock_file, 120) as holder:
        command = Path(f"/proc/{holder.pid}/comm").read_text().strip()
        result = prepare(tmp_path, lock_file, timeout=10)
    assert result.outcome is Outcome.FAILED
    [failure] = result.failures
    assert failure.task.endswith("Name the process that holds the package manager's lock"), failure.task
    assert "The package manager is busy for more than 10s" in failure.message
    assert re.search(rf"{re.escape(command)} \(PID {holder.pid}\) holds {re.escape(str(lock_file))}", failure.message)
    assert "unattended-upgrades" in failure.message  # says what usually holds it, and what to do


def test_a_lock_released_in_time_lets_the_upgrade_go_on(tmp_path: Path, run_root: Path, lock_file: Path) -> None:
    with hold(lock_file, 3):
        result = prepare(tmp_path, lock_file, timeout=120)
    assert result.outcome in (Outcome.OK, Outcome.CHANGED), result.failures


def test_other_locks_do_not_count(tmp_path: Path, run_root: Path, lock_file: Path) -> None:
    other = tmp_path / "unrelated.lock"
    other.touch()
    with hold(other, 120):
        result = prepare(tmp_path, lock_file, timeout=5)
    assert result.outcome in (Outcome.OK, Outcome.CHANGED), result.failures


def test_a_read_lock_does_not_hold_the_upgrade(tmp_path: Path, run_root: Path, lock_file: Path) -> None:
    """Any user may open rpm's lock file (0644) and take a read lock on it: that must not stop every upgrade."""
    with hold(lock_file, 120, mode="read"):
        result = prepare(tmp_path, lock_file, timeout=5)
    assert result.outcome in (Outcome.OK, Outcome.CHANGED), result.failures
