"""gpuinfra-scheduled-checks (roles/gpu_scheduled_checks/files/gpuinfra_scheduled_checks.py): which nodes get a
check job, what becomes of each job, and what the history keeps, against scontrol, sacct and sbatch answering as
Slurm 24.11 prints them. The sandbox test (tests/sandbox/test_health_loop.py) proves the same on the real daemons."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
PATH = ROOT / "roles" / "gpu_scheduled_checks" / "files" / "gpuinfra_scheduled_checks.py"
SPEC = importlib.util.spec_from_file_location("gpuinfra_scheduled_checks", PATH)
assert SPEC and SPEC.loader
program = importlib.util.module_from_spec(SPEC)
sys.modules["gpuinfra_scheduled_checks"] = program  # its dataclasses look their module up
SPEC.loader.exec_module(program)

NODES = "\n".join(
    [
        "NodeName=gpu01 Arch=x86_64 Gres=gpu:l4:2(S:0) State=IDLE Partitions=vision,gpuinfra",
        "NodeName=gpu02 Arch=x86_64 Gres=gpu:l4:2(S:0) State=MIXED Partitions=vision,gpuinfra",
        "NodeName=gpu03 Arch=x86_64 Gres=gpu:l4:2(S:0) State=IDLE+DRAIN Partitions=vision,gpuinfra Reason=x [root@t]",
        "NodeName=gpu04 Arch=x86_64 Gres=gpu:l4:2(S:0) State=IDLE+MAINT+RESERVED Partitions=vision,gpuinfra",
        "NodeName=gpu05 Arch=x86_64 Gres=gpu:l4:2(S:0) State=IDLE+NOT_RESPONDING Partitions=vision,gpuinfra",
        "NodeName=cpu01 Arch=x86_64 Gres=(null) State=IDLE Partitions=cpu",
        "NodeName=gpu06 Arch=x86_64 Gres=gpu:l4:1(S:0) State=IDLE Partitions=vision,gpuinfra",
    ]
)
NOW = 1_765_000_000.0


class Slurm:
    """scontrol, sacct and sbatch; `jobs` is what sacct knows (JobID -> (State, ExitCode))."""

    def __init__(self, jobs: dict[str, tuple[str, str]] | None = None, busy: frozenset[str] = frozenset()) -> None:
        self.nodes, self.jobs, self.busy = NODES, jobs or {}, busy
        self.calls: list[list[str]] = []
        self.next_job = 100
        self.pending: set[str] = set()

    def __call__(self, argv: list[str]) -> tuple[int, str, str]:
        self.calls.append(argv)
        if argv[:3] == ["scontrol", "show", "node"]:
            return 0, self.nodes + "\n", ""
        if argv[0] == "sacct":
            wanted = next(a for a in argv if a.startswith("--jobs=")).split("=", 1)[1].split(",")
            return 0, "".join(f"{j}|{s}|{e}\n" for j, (s, e) in self.jobs.items() if j in wanted), ""
        if argv[0] == "sbatch":  # a job for a node a user job took first stays pending
            node = next(a for a in argv if a.startswith("--nodelist=")).split("=", 1)[1]
            self.next_job += 1
            if node in self.busy:
                self.pending.add(str(self.next_job))
            return 0, f"{self.next_job}\n", ""
        if argv[0] == "squeue":
            wanted = argv[2].split("=", 1)[1].split(",")
            return 0, "".join(f"{j}|{'PENDING' if j in self.pending else 'RUNNING'}\n" for j in wanted), ""
        if argv[0] == "scancel":
            return 0, "", ""
        raise AssertionError(f"unexpected call {argv}")

    def submitted(self) -> list[list[str]]:
        return [c for c in self.calls if c[0] == "sbatch"]


def settings(tmp_path: Path, every: int = 3600) -> Any:
    return program.Settings(every=every, timeout=1800, partition="gpuinfra", qos="gpuinfra-idle",
                            program="/usr/local/sbin/gpuinfra-active-checks",
                            history=str(tmp_path / "admission" / "history.jsonl"))  # fmt: skip


def history(tmp_path: Path) -> list[dict[str, Any]]:
    path = tmp_path / "admission" / "history.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_only_idle_nodes_due_for_their_checks_get_a_job_the_whole_node_at_once(tmp_path: Path) -> None:
    slurm = Slurm()
    done = program.one_pass(slurm, settings(tmp_path), {}, NOW)
    # gpu02 runs a job, gpu03 is drained, gpu04 reserved, gpu05 not responding, cpu01 has no GPU partition.
    assert done == {"ended": [], "started": {"gpu01": "101", "gpu06": "102"}}
    assert slurm.submitted()[0] == [
        "sbatch", "--parsable", "--partition=gpuinfra", "--qos=gpuinfra-idle", "--nodelist=gpu01",
        "--nodes=1", "--ntasks=1", "--exclusive", "--time=30", "--job-name=gpuinfra-scheduled-check",
        "--output=/dev/null", "--gres=gpu:l4:2", "--wrap=exec /usr/local/sbin/gpuinfra-active-checks --json",
    ]  # fmt: skip


def test_a_node_checked_lately_at_its_admission_or_on_schedule_is_not_due(tmp_path: Path) -> None:
    path = tmp_path / "admission" / "history.jsonl"
    path.parent.mkdir()
    lines = [
        {"time": NOW - 600, "node": "gpu01", "verdict": "pass", "reason": "", "seconds": 4.0, "checks": []},
        {"time": NOW - 300, "node": "gpu06", "kind": "scheduled", "verdict": "fail", "job": "7", "seconds": 9.0},
        {"time": NOW - 100, "node": "gpu06", "kind": "scheduled", "verdict": "preempted", "job": "8"},
    ]
    path.write_text("not json\n" + "".join(json.dumps(line) + "\n" for line in lines))
    slurm = Slurm()
    assert program.one_pass(slurm, settings(tmp_path), {}, NOW)["started"] == {}
    # An hour on, both are due again; a preempted run never counted.
    assert program.one_pass(slurm, settings(tmp_path, every=600), {}, NOW)["started"] == {"gpu01": "101"}


def test_a_check_job_that_cannot_start_at_once_is_cancelled(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A user job took gpu01 between the look and the submission: its check job, pending, is cancelled within the
    wait, and the node is left for the next pass."""
    monkeypatch.setattr(program, "START_WAIT", 0)
    slurm = Slurm(busy=frozenset({"gpu01"}))
    state: dict[str, Any] = {}
    assert program.one_pass(slurm, settings(tmp_path), state, NOW)["started"] == {"gpu06": "102"}
    assert ["scancel", "101"] in slurm.calls
    assert state == {"jobs": {"102": {"node": "gpu06", "submitted": NOW}}}


@pytest.mark.parametrize(
    ("state", "exit_code", "verdict"),
    [
        ("COMPLETED", "0:0", "pass"),
        ("FAILED", "1:0", "fail"),
        ("FAILED", "3:0", "unknown"),
        ("PREEMPTED", "0:15", "preempted"),
        ("CANCELLED by 0", "0:15", "preempted"),
        ("TIMEOUT", "0:0", "unknown"),
        ("FAILED", "2:0", "error"),
        ("NODE_FAIL", "0:0", "error"),
    ],
)
def test_an_ended_job_is_recorded_with_its_verdict(tmp_path: Path, state: str, exit_code: str, verdict: str) -> None:
    slurm = Slurm(jobs={"101": (state, exit_code)})
    jobs = {"jobs": {"101": {"node": "gpu01", "submitted": NOW - 90}}}
    done = program.one_pass(slurm, settings(tmp_path), jobs, NOW)
    entry = {"time": NOW, "node": "gpu01", "kind": "scheduled", "job": "101", "verdict": verdict, "seconds": 90.0}
    assert done["ended"] == [entry] and history(tmp_path) == [entry]
    # The node's next check: at once after a run that did not count, an interval on after one that did.
    counted = verdict in ("pass", "fail", "unknown")
    assert ("gpu01" in done["started"]) is not counted


def test_a_running_job_holds_its_node_and_stays_followed(tmp_path: Path) -> None:
    slurm = Slurm(jobs={"91": ("RUNNING", "0:0")})
    state = {"jobs": {"91": {"node": "gpu01", "submitted": NOW - 30}}}
    assert program.one_pass(slurm, settings(tmp_path), state, NOW) == {"ended": [], "started": {"gpu06": "101"}}
    assert {job: record["node"] for job, record in state["jobs"].items()} == {"91": "gpu01", "101": "gpu06"}


def test_settings_and_state_are_read_as_data(tmp_path: Path) -> None:
    config = tmp_path / "scheduled-checks.json"
    config.write_text(json.dumps({"every": 60, "timeout": 60, "partition": "gpuinfra", "qos": "gpuinfra-idle",
                                  "program": "gpuinfra-active-checks", "history": "/x"}))  # fmt: skip
    with pytest.raises(program.Failure, match="absolute path"):
        program.settings_of(str(config))
    state = tmp_path / "scheduled.json"
    state.write_text(json.dumps({"jobs": {"101": {"node": "gpu01", "submitted": 1.0}, "x; rm": {"node": 1}}}))
    assert program.load_state(str(state)) == {"jobs": {"101": {"node": "gpu01", "submitted": 1.0}}}
    state.write_text("[")
    assert program.load_state(str(state)) == {}
