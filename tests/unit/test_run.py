"""Real ansible-runner runs of small playbooks on this machine (local connection), plus one unreachable SSH host."""

from __future__ import annotations

import contextlib
import os
import signal
import stat
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from test_upgrade_timeout import left_behind

from gpuinfra.progress import RunProgress, Update
from gpuinfra.run import MAX_DEFAULT_FORKS, Outcome, RunError, RunOptions, default_forks, run_playbook
from gpuinfra.targets import target_hosts

pytestmark = pytest.mark.tools  # runs Ansible or a system tool (tests/unit/tool_guard.py)

PLAYBOOKS = Path(__file__).parent / "data" / "playbooks"


def local_inventory(*names: str, unreachable: str | None = None) -> dict[str, Any]:
    hosts: dict[str, Any] = {
        name: {"ansible_connection": "local", "ansible_python_interpreter": sys.executable} for name in names
    }
    if unreachable:
        # Nothing listens on port 1: ssh is refused at once, with host key checking left on.
        hosts[unreachable] = {"ansible_host": "127.0.0.1", "ansible_port": 1, "ansible_connection": "ssh"}
    return {"all": {"hosts": hosts, "children": {"compute": {"hosts": dict.fromkeys(names)}}}}


def options(playbook: str, **kwargs: Any) -> RunOptions:
    return RunOptions(playbook=PLAYBOOKS / playbook, **kwargs)


def test_ok_run_counts_every_result(run_root: Path) -> None:
    result = run_playbook(local_inventory("n1", "n2"), options("ok.yml"))
    assert result.outcome is Outcome.OK
    assert (result.status, result.rc) == ("successful", 0)
    assert {name: (s.ok, s.changed, s.skipped, s.failed) for name, s in result.hosts.items()} == {
        "n1": (1, 0, 1, 0),
        "n2": (1, 0, 1, 0),
    }
    assert result.failures == [] and result.changes == [] and result.errors == []


def test_changed_task_is_counted_and_recorded(run_root: Path, tmp_path: Path) -> None:
    run = options("changed.yml", extra_vars={"target_dir": str(tmp_path)})
    first = run_playbook(local_inventory("n1"), run)
    assert first.outcome is Outcome.CHANGED
    assert first.hosts["n1"].changed == 1
    assert [(c.host, c.task) for c in first.changes] == [("n1", "Write the marker file")]
    assert (tmp_path / "n1.txt").read_text() == "written by a test\n"
    # Same again: nothing left to change.
    second = run_playbook(local_inventory("n1"), run)
    assert second.outcome is Outcome.OK and second.hosts["n1"].changed == 0


def test_extra_vars_reach_ansible_as_data_never_as_templates(run_root: Path, tmp_path: Path) -> None:
    """What a node reports (a health problem, an XID's process name) comes back to Ansible as an extra var, for a
    drain reason: Ansible must not evaluate it. Unwrapped, this lookup runs on the controller and `id` fills the
    reason."""
    marker = tmp_path / "ran-on-the-controller"
    reported = f"XID 13 ({{{{ lookup('pipe', 'touch {marker}') }}}}), name=,{{{{ lookup('pipe', 'id -un') }}}}"
    run = options("reported.yml", extra_vars={"target_dir": str(tmp_path), "reported_reason": reported})
    result = run_playbook(local_inventory("n1"), run)
    assert result.outcome is Outcome.CHANGED, result.failures
    assert (tmp_path / "n1.txt").read_text() == f"Reason={reported}\n"
    assert not marker.exists()


def test_check_mode_reports_pending_changes_without_making_them(run_root: Path, tmp_path: Path) -> None:
    run = options("changed.yml", check=True, diff=True, extra_vars={"target_dir": str(tmp_path)})
    result = run_playbook(local_inventory("n1"), run)
    assert result.outcome is Outcome.CHANGED and result.check
    (change,) = result.changes
    assert (change.host, change.task) == ("n1", "Write the marker file")
    assert "+written by a test" in change.diff
    assert not (tmp_path / "n1.txt").exists()


def test_failing_task_names_host_task_and_message(run_root: Path) -> None:
    result = run_playbook(local_inventory("n1"), options("fail.yml"))
    assert result.outcome is Outcome.FAILED
    assert result.hosts["n1"].failed == 1
    (failure,) = result.failures
    assert (failure.host, failure.task, failure.unreachable) == ("n1", "Check the disk", False)
    assert "disk /dev/sdz is full" in failure.message


def test_unreachable_host_fails_the_run_and_is_named(run_root: Path) -> None:
    result = run_playbook(local_inventory("n1", unreachable="dead1"), options("ok.yml"))
    assert result.outcome is Outcome.FAILED
    assert result.hosts["dead1"].unreachable == 1
    assert result.hosts["n1"].failed == 0 and result.hosts["n1"].ok == 1
    (failure,) = result.failures
    assert failure.host == "dead1" and failure.unreachable
    assert "Connection refused" in failure.message


def test_timeout_stops_the_run(run_root: Path) -> None:
    started = time.monotonic()
    result = run_playbook(local_inventory("n1"), options("sleep.yml", timeout=1))
    assert result.outcome is Outcome.TIMEOUT and result.status == "timeout"
    assert time.monotonic() - started < 30
    assert left_behind("sleep 61") == []


def test_cancel_callback_stops_the_run(run_root: Path) -> None:
    seen: list[Update] = []

    def on_update(update: Update, progress: RunProgress) -> None:
        seen.append(update)

    # Cancel once the long task has started on the host.
    result = run_playbook(
        local_inventory("n1"),
        options("sleep.yml"),
        on_update=on_update,
        cancel=lambda: any(u.kind == "task" for u in seen),
    )
    assert result.outcome is Outcome.CANCELLED and result.status == "canceled"
    # The task's command stopped with the run (ansible-playbook's workers lead process groups of their own).
    assert left_behind("sleep 61") == []


def test_ctrl_c_cancels_the_run(run_root: Path) -> None:
    before = signal.getsignal(signal.SIGINT)
    timer = threading.Timer(3.0, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    try:
        result = run_playbook(local_inventory("n1"), options("sleep.yml", timeout=50))
    finally:
        timer.cancel()
    assert result.outcome is Outcome.CANCELLED
    assert left_behind("sleep 61") == []
    # The previous handler is back once the run is over (Python's own, or what the shell that started the tests
    # gave it: a job started in the background by a script ignores Ctrl-C).
    assert signal.getsignal(signal.SIGINT) is before


def test_run_directory_is_private_holds_no_secrets_and_is_removed(run_root: Path) -> None:
    snapshots: list[dict[str, int]] = []

    def on_update(update: Update, progress: RunProgress) -> None:
        if update.kind == "task":
            (run_dir,) = run_root.iterdir()
            files = {}
            for path in run_dir.rglob("*"):
                with contextlib.suppress(FileNotFoundError):  # runner deletes its event files as it reads them
                    files[str(path.relative_to(run_dir))] = path.lstat().st_mode
            snapshots.append({".": run_dir.stat().st_mode, **files})

    result = run_playbook(local_inventory("n1"), options("ok.yml", extra_vars={"x": 1}), on_update=on_update)
    assert result.outcome is Outcome.OK
    assert snapshots
    seen = snapshots[0]
    assert stat.S_IMODE(seen["."]) == 0o700
    assert stat.S_IMODE(seen["inventory/hosts.json"]) == 0o600
    assert stat.S_ISLNK(seen["ansible_collections/gpuinfra/cluster"])
    for name in ("passwords", "envvars", "extravars", "ssh_key", "cmdline"):
        assert f"env/{name}" not in seen
    assert not any(path.endswith(("/stdout", "/stderr")) for path in seen)
    # Runner's callback hands each event over in a partial file (written as .tmp, then renamed) it deletes at once;
    # none is kept.
    kept = [p for p in seen if "/job_events/" in p and not p.endswith(("-partial.json", "-partial.json.tmp"))]
    assert not kept
    assert list(run_root.iterdir()) == []


def test_repository_resolves_as_collection_gpuinfra_cluster(run_root: Path) -> None:
    result = run_playbook(local_inventory("n1"), options("collection.yml"))
    assert result.outcome is Outcome.OK, result.failures


def test_limit_and_tags_reach_ansible(run_root: Path) -> None:
    result = run_playbook(local_inventory("n1", "n2"), options("ok.yml", limit="n2", tags=("never",)))
    assert result.outcome is Outcome.OK
    # Only n2 is targeted, and no task carries the tag, so it only shows up in the stats if at all.
    assert result.hosts.get("n1") is None or result.hosts["n1"].ok == 0
    assert sum(s.ok for s in result.hosts.values()) == 0


def test_forks_default_to_one_per_host_and_follow_the_option(run_root: Path) -> None:
    inventory = local_inventory("n1", "n2", "n3")
    hosts = ["n1", "n2", "n3"]
    assert run_playbook(inventory, options("forks.yml"), hosts=hosts).artifacts["forks"] == 3
    assert run_playbook(inventory, options("forks.yml", forks=2), hosts=hosts).artifacts["forks"] == 2


def test_a_run_polls_its_workers_every_10_ms_unless_the_user_has_a_configuration(
    run_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ANSIBLE_CONFIG", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    inventory = local_inventory("n1")
    assert run_playbook(inventory, options("poll_interval.yml")).artifacts["poll"] == 0.01
    (tmp_path / ".ansible.cfg").write_text("[defaults]\nforks = 7\n")
    assert run_playbook(inventory, options("poll_interval.yml")).artifacts["poll"] == 0.001  # Ansible's own


def test_the_default_forks_stop_at_their_ceiling_and_leave_an_unknown_count_to_ansible() -> None:
    assert default_forks(1) == 1
    assert default_forks(MAX_DEFAULT_FORKS + 1) == MAX_DEFAULT_FORKS
    assert default_forks(0) is None


def test_ansible_errors_before_any_task_are_reported(run_root: Path) -> None:
    result = run_playbook(local_inventory("n1"), options("ok.yml", limit="no-such-host"))
    assert result.outcome is Outcome.FAILED
    assert any("no hosts" in error for error in result.errors)


def test_a_missing_playbook_is_a_run_error() -> None:
    with pytest.raises(RunError, match="playbook not found"):
        run_playbook(local_inventory("n1"), RunOptions(playbook="no-such-playbook.yml"))


def test_target_hosts_follows_ansible_patterns() -> None:
    inventory = local_inventory("n1", "n2", unreachable="dead1")
    assert target_hosts(inventory) == ["n1", "n2", "dead1"]
    assert target_hosts(inventory, "compute") == ["n1", "n2"]
    assert target_hosts(inventory, "all:!n1") == ["n2", "dead1"]
    assert target_hosts(inventory, "n*") == ["n1", "n2"]
    assert target_hosts(inventory, "nothing-here") == []


def test_rescued_ignored_loop_and_no_log_failures(run_root: Path) -> None:
    result = run_playbook(local_inventory("n1", "n2"), options("edge.yml"))
    assert result.outcome is Outcome.FAILED
    n1, n2 = result.hosts["n1"], result.hosts["n2"]
    assert (n1.rescued, n1.ignored, n1.failed) == (1, 1, 1)
    assert (n2.rescued, n2.ignored, n2.failed) == (1, 1, 1)
    # The rescued and the ignored failures are not reported; the loop names its failing item; no_log hides output.
    loop, secret = result.failures
    assert (loop.host, loop.task) == ("n1", "Fail on one item of a loop")
    assert "item bad:" in loop.message and "item is bad" in loop.message and "good" not in loop.message
    assert (secret.host, secret.task) == ("n2", "Fail with a secret")
    assert "no_log" in secret.message and "hunter2" not in secret.message
