"""The controller: journal before every drain, resume after a crash at any step, failure policy, the bound.

The executor here stands in for Ansible and keeps a small model of the scheduler (which nodes are out of service),
so each test checks the controller's promises against that state: the executor is the seam the real controller
has, not a copy of it.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from gpuinfra.model.grammar import duration_seconds
from gpuinfra.upgrade.journal import RUN, Journal, State
from gpuinfra.upgrade.pipeline import PHASES, Interrupted, PhaseResult, Rollout

TARGET = "535.261.03"


class Crash(Exception):
    """The controller process dies: nothing after this point is recorded."""


class Cluster:
    """What Slurm and the nodes would say: out of service or not, and the driver each node has."""

    def __init__(self, journal: Journal, nodes: list[str], max_unavailable: int) -> None:
        self.journal = journal
        self.out: set[str] = set()
        self.version = dict.fromkeys(nodes, "535.216.03")
        self.max_unavailable = max_unavailable
        self.peak = 0
        self.calls: list[tuple[str, str]] = []
        self.lock = threading.Lock()
        self.crash_at: int | None = None
        self.crash_after_work = False
        self.fail: dict[tuple[str, str], str] = {}
        self.skip: set[str] = set()

    def __call__(self, node: str, phase: str) -> PhaseResult:
        with self.lock:
            index = len(self.calls)
            self.calls.append((node, phase))
            if index == self.crash_at and not self.crash_after_work:
                raise Crash(f"before {node} {phase}")
            result = self._work(node, phase)
            if index == self.crash_at:
                raise Crash(f"after {node} {phase}")
            return result

    def _work(self, node: str, phase: str) -> PhaseResult:
        if phase == "drain":
            last = self.journal.last_states(TARGET).get(node)
            assert last is not None and last.state is State.DRAINING, f"{node} drained without a journal entry"
            if node in self.skip:
                return PhaseResult("skipped", "drain timeout: jobs still running; resumed untouched")
            self.out.add(node)
            self.peak = max(self.peak, len(self.out))
            assert len(self.out) <= self.max_unavailable, f"{sorted(self.out)} out at once"
        elif phase != "resume":  # resuming a node in service is a no-op, as in Slurm
            assert node in self.out, f"{phase} on {node}, which is in service"
        reason = self.fail.get((node, phase))
        if reason:
            return PhaseResult("failed", reason)  # the playbook keeps the node drained with the reason
        if phase == "upgrade":
            self.version[node] = TARGET
        if phase == "resume":
            self.out.discard(node)
        return PhaseResult("ok")


def nodes(count: int) -> list[str]:
    return [f"gpu{i:02d}" for i in range(1, count + 1)]


def rollout(journal: Journal, cluster: Cluster, names: list[str], **kwargs: object) -> Rollout:
    return Rollout(journal=journal, target=TARGET, nodes=names, executor=cluster, **kwargs)  # type: ignore[arg-type]


def unrecorded_out_of_service(journal: Journal, cluster: Cluster) -> set[str]:
    recorded = {e.node for e in journal.out_of_service(TARGET)}
    return cluster.out - recorded


def test_every_node_goes_through_every_phase_in_order(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "upgrade.jsonl")
    names = nodes(3)
    cluster = Cluster(journal, names, max_unavailable=1)
    report = rollout(journal, cluster, names).run()
    assert report.complete and report.states == dict.fromkeys(names, State.RESUMED)
    assert cluster.out == set() and set(cluster.version.values()) == {TARGET}
    assert [phase for node, phase in cluster.calls if node == "gpu02"] == [p.name for p in PHASES]
    states = [e.state for e in journal.entries() if e.node == "gpu02"]
    assert states == [State.DRAINING, State.DRAINED, State.UPGRADING, State.GATED, State.HEALTHY, State.RESUMED]
    assert journal.finished(TARGET)
    assert journal.entries()[-1].node == RUN


def test_a_finished_journal_never_stands_for_a_node_found_off_the_target(tmp_path: Path) -> None:
    """A cluster made again from scratch, with the journal of an earlier upgrade to the same target: the caller
    finds every node off the target, so every node goes through every phase again, whatever the journal says."""
    journal = Journal(tmp_path / "upgrade.jsonl")
    names = nodes(2)
    rollout(journal, Cluster(journal, names, max_unavailable=1), names).run()
    assert journal.finished(TARGET)
    rebuilt = Cluster(journal, names, max_unavailable=1)  # every node back at the old driver
    report = rollout(journal, rebuilt, names, off_target=names).run()
    assert report.complete and set(rebuilt.version.values()) == {TARGET}
    assert sorted(rebuilt.calls) == sorted((node, p.name) for node in names for p in PHASES)
    # Without the finding, the journal alone says the work is done: the resume-only behaviour it keeps.
    untouched = Cluster(journal, names, max_unavailable=1)
    rollout(journal, untouched, names).run()
    assert untouched.calls == []


def full_run_calls(tmp_path: Path, names: list[str], k: int) -> int:
    journal = Journal(tmp_path / "count.jsonl")
    cluster = Cluster(journal, names, k)
    rollout(journal, cluster, names, max_unavailable=k).run()
    return len(cluster.calls)


@pytest.mark.parametrize("after_work", [False, True], ids=["before-the-step", "after-the-step"])
@pytest.mark.parametrize("k", [1, 2])
def test_a_crash_at_every_step_is_resumed_by_a_rerun(tmp_path: Path, k: int, after_work: bool) -> None:
    names = nodes(4)
    steps = full_run_calls(tmp_path, names, k)
    assert steps == 4 * len(PHASES)
    for step in range(steps):
        journal = Journal(tmp_path / f"crash-{step}.jsonl")
        cluster = Cluster(journal, names, k)
        cluster.crash_at, cluster.crash_after_work = step, after_work
        with pytest.raises(Crash):
            rollout(journal, cluster, names, max_unavailable=k).run()
        # However the controller died, every node out of service has a record saying so.
        assert unrecorded_out_of_service(journal, cluster) == set(), f"step {step}"
        cluster.crash_at = None
        report = rollout(journal, cluster, names, max_unavailable=k).run()
        assert report.complete, f"step {step}: {report}"
        assert cluster.out == set() and set(cluster.version.values()) == {TARGET}
        assert cluster.peak <= k
        # The re-run only did what was left: only the nodes in flight at the crash were drained again.
        drains = [node for node, phase in cluster.calls if phase == "drain"]
        assert len(drains) - len(set(drains)) <= k, drains


@pytest.mark.parametrize("left", [State.DRAINED, State.UPGRADING])
def test_a_node_resumed_by_hand_after_a_crash_is_drained_again_before_its_upgrade(tmp_path: Path, left: State) -> None:
    names = nodes(2)
    journal = Journal(tmp_path / "upgrade.jsonl")
    # A crashed run left gpu01 here; then an operator resumed it in Slurm, so jobs may land on it again.
    for state in (State.DRAINING, State.DRAINED, State.UPGRADING)[: 2 if left is State.DRAINED else 3]:
        journal.record("gpu01", state, TARGET)
    cluster = Cluster(journal, names, max_unavailable=1)
    # The fake cluster fails the run if `upgrade` reaches a node in service.
    assert rollout(journal, cluster, names).run().complete
    assert [phase for node, phase in cluster.calls if node == "gpu01"] == [p.name for p in PHASES]


def test_failures_past_the_threshold_stop_the_run_and_stay_drained(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "upgrade.jsonl")
    # Enough nodes that some are still waiting when the second failure stops the run, however the threads are
    # scheduled (with 6, a loaded machine could start them all before gpu03's health phase failed).
    names = nodes(16)
    cluster = Cluster(journal, names, max_unavailable=3)
    cluster.fail[("gpu02", "upgrade")] = "Kernel gate blocked on gpu02: next boot 6.12.95+deb12-rt-amd64"
    cluster.fail[("gpu03", "health")] = "GPU node unhealthy (1 problem): node: nvidia-smi failed"
    report = rollout(journal, cluster, names, max_unavailable=3, max_failures=1).run()
    assert report.nodes_in(State.FAILED) == ["gpu02", "gpu03"]
    assert report.reasons["gpu02"].startswith("upgrade: Kernel gate blocked on gpu02")
    assert report.reasons["gpu03"].startswith("health: GPU node unhealthy")
    assert cluster.out == {"gpu02", "gpu03"}  # left drained, with the reason
    assert report.stopped and report.not_started and not report.complete
    assert cluster.peak <= 3
    assert not journal.finished(TARGET)


def test_a_failed_node_keeps_its_place_in_the_window(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "upgrade.jsonl")
    names = nodes(4)
    cluster = Cluster(journal, names, max_unavailable=1)
    cluster.fail[("gpu01", "upgrade")] = "dpkg lock held"
    report = rollout(journal, cluster, names, max_unavailable=1, max_failures=3).run()
    # gpu01 stays drained, so with max_unavailable 1 nothing else may go out.
    assert report.nodes_in(State.FAILED) == ["gpu01"] and report.not_started == names[1:]
    assert cluster.peak == 1


def test_retry_failed_takes_the_drained_node_through_again(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "upgrade.jsonl")
    names = nodes(2)
    cluster = Cluster(journal, names, max_unavailable=1)
    cluster.fail[("gpu01", "health")] = "GPU node unhealthy"
    rollout(journal, cluster, names).run()
    assert rollout(journal, cluster, names).run().states["gpu01"] is State.FAILED  # a plain re-run leaves it
    del cluster.fail[("gpu01", "health")]
    report = rollout(journal, cluster, names, retry_failed=True).run()
    assert report.complete and cluster.out == set()


def test_a_drain_timeout_skips_the_node_and_the_others_go_on(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "upgrade.jsonl")
    names = nodes(3)
    cluster = Cluster(journal, names, max_unavailable=1)
    cluster.skip.add("gpu01")
    report = rollout(journal, cluster, names).run()
    assert report.states["gpu01"] is State.SKIPPED and "drain timeout" in report.reasons["gpu01"]
    assert report.nodes_in(State.RESUMED) == ["gpu02", "gpu03"]
    assert not report.complete and "gpu01" not in cluster.out
    cluster.skip.clear()  # the long job ended: a re-run takes it
    assert rollout(journal, cluster, names).run().complete


def test_the_health_gate_can_be_turned_off(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "upgrade.jsonl")
    cluster = Cluster(journal, ["gpu01"], max_unavailable=1)
    report = rollout(journal, cluster, ["gpu01"], health_gate=False).run()
    assert report.complete and ("gpu01", "health") not in cluster.calls
    assert [e.reason for e in journal.entries() if e.state is State.HEALTHY] == [
        "health gate off (upgrade.health_gate: false)"
    ]


def test_cancel_stops_between_phases_and_a_rerun_finishes(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "upgrade.jsonl")
    names = nodes(3)
    cluster = Cluster(journal, names, max_unavailable=2)
    cancel = threading.Event()

    def cancelling(node: str, phase: str) -> PhaseResult:
        result = cluster(node, phase)
        if (node, phase) == ("gpu02", "upgrade"):
            cancel.set()  # Ctrl-C while gpu02 upgrades
        return result

    run = Rollout(journal=journal, target=TARGET, nodes=names, executor=cancelling, max_unavailable=2, cancel=cancel)
    with pytest.raises(Interrupted):
        run.run()
    assert unrecorded_out_of_service(journal, cluster) == set()
    assert rollout(journal, cluster, names, max_unavailable=2).run().complete


def test_a_second_controller_is_refused(tmp_path: Path) -> None:
    from gpuinfra.upgrade.journal import JournalBusy

    journal = Journal(tmp_path / "upgrade.jsonl")
    with journal.exclusive(), pytest.raises(JournalBusy), Journal(journal.path).exclusive():
        pass
    with journal.exclusive():  # released
        pass


def test_kernel_runs_resume_until_done_then_start_anew(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "upgrade.jsonl")
    assert journal.open_target("kernel@") is None
    journal.record("gpu01", State.DRAINING, "kernel@2026-11-22T10:00:00Z")
    assert journal.open_target("kernel@") == "kernel@2026-11-22T10:00:00Z"
    journal.record(RUN, State.DONE, "kernel@2026-11-22T10:00:00Z")
    assert journal.open_target("kernel@") is None


def test_durations() -> None:
    assert duration_seconds("4h") == 14400
    assert duration_seconds("1h30m") == 5400
    with pytest.raises(ValueError):
        duration_seconds("4 hours")


def test_the_pipeline_runs_the_rescue_on_every_phase() -> None:
    from ruamel.yaml import YAML

    root = Path(__file__).resolve().parents[2]
    [pipeline] = YAML(typ="safe").load((root / "roles" / "node_upgrade" / "tasks" / "main.yml").read_text())
    tags = {tag for task in pipeline["block"] for tag in task.get("tags", [])}
    assert {p.name for p in PHASES} <= tags
    assert pipeline["rescue"][0]["tags"] == ["always"]
    for playbook, kind in (("upgrade_driver.yml", "driver"), ("kernel_update.yml", "kernel")):
        [play] = YAML(typ="safe").load((root / "playbooks" / playbook).read_text())
        assert play["roles"] == [{"role": "gpuinfra.cluster.node_upgrade", "vars": {"node_upgrade_kind": kind}}]


@pytest.mark.tools
def test_a_node_given_up_on_is_reported_skipped_from_the_runs_own_data(tmp_path: Path) -> None:
    """The rescue (roles/node_upgrade/tasks/failed.yml) run for real on a local host: when the drain gave up, the run
    publishes the outcome with set_stats, and the controller reads it from there, not from a task name."""
    import sys

    from gpuinfra.run import RunOptions, run_playbook
    from gpuinfra.upgrade.executor import phase_result

    rescue = Path(__file__).resolve().parents[2] / "roles" / "node_upgrade" / "tasks" / "failed.yml"
    playbook = tmp_path / "give-up.yml"
    reason = "drain: the jobs on gpu01 outlast the drain timeout; undrained"
    playbook.write_text(
        "- hosts: all\n  gather_facts: false\n  tasks:\n"
        "    - block:\n        - ansible.builtin.fail: {msg: drain gave up}\n"
        f"      rescue:\n        - ansible.builtin.import_tasks: {rescue}\n"
        f"          vars: {{node_drain_skipped: true, __node_upgrade_failure: '{reason}'}}\n"
    )
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    result = run_playbook({"all": {"hosts": {"gpu01": local}}}, RunOptions(playbook=playbook), hosts=["gpu01"])
    assert result.artifacts == {"gpuinfra_upgrade_outcome": "skipped"}
    assert phase_result(result, "gpu01") == PhaseResult("skipped", reason)
