"""The admission gate's steps (plugins/modules/gpu_admission.py) against a Slurm double that keeps nodes, their drain
reasons, reservations and jobs in memory and answers scontrol and squeue as Slurm 24.11 prints them. The check job
is a real process printing what the node's program would. The sandbox test (tests/sandbox/test_health_loop.py)
proves the same against the real slurmctld."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
# The module imports the collection's module_utils as Ansible lays them out; those modules are loaded from this
# checkout under their full names for the import, and taken out again, so Ansible's own collection loader (other
# tests run it in this process) never meets a half-made gpuinfra.cluster package.
UTILS = {
    f"ansible_collections.gpuinfra.cluster.plugins.module_utils.{name}": name for name in ("active_checks", "breaker")
}
for _full, _name in UTILS.items():
    _spec = importlib.util.spec_from_file_location(_full, ROOT / "plugins" / "module_utils" / f"{_name}.py")
    assert _spec and _spec.loader
    sys.modules[_full] = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(sys.modules[_full])
SPEC = importlib.util.spec_from_file_location("gpu_admission", ROOT / "plugins" / "modules" / "gpu_admission.py")
assert SPEC and SPEC.loader
gate_module = importlib.util.module_from_spec(SPEC)
sys.modules["gpu_admission"] = gate_module  # its dataclasses look their module up
SPEC.loader.exec_module(gate_module)
for _full in UTILS:
    del sys.modules[_full]

PASSED = {"verdict": "pass", "reason": "gpuinfra admission: passed dcgm diag -r 2 passed (software)", "checks": []}
SLOW = {
    "verdict": "fail",
    "reason": "gpuinfra admission: nccl all_reduce busbw 4.6 GB/s below the 7.8 GB/s floor of L4 at PCIe Gen4",
    "checks": [{"check": "nccl_all_reduce", "verdict": "fail", "reason": "...", "figures": {"busbw_gbps": 4.6}}],
}


@dataclass
class Node:
    state: str = "IDLE"
    drain: bool = False
    reason: str = ""
    jobs: int = 0  # user jobs still running


@dataclass
class Slurm:
    nodes: dict[str, Node]
    reservations: set[str] = field(default_factory=set)
    calls: list[list[str]] = field(default_factory=list)
    on_call: Any = None  # called with each argv, to change the state mid-way

    def __call__(self, argv: list[str]) -> tuple[int, str, str]:
        self.calls.append(argv)
        if self.on_call:
            self.on_call(self, argv)
        tool, args = argv[0], argv[1:]
        if tool == "squeue":
            if any(a.startswith("--nodelist=") for a in args):
                node = self.nodes[args[1].split("=", 1)[1]]
                node.jobs = max(0, node.jobs - 1)  # one job ends at each look
                return 0, "1234\n" if node.jobs else "", ""
            return 0, "RUNNING\n", ""
        if tool == "scancel":
            return 0, "", ""
        if tool == "sinfo":  # --noheader --Node --partition=P --format=%N|%T|%E: every node is in each partition
            rows = [f"{name}|{n.state.lower()}{'+drain' if n.drain else ''}|{n.reason or 'none'}"
                    for name, n in self.nodes.items()]  # fmt: skip
            return 0, "".join(f"{row}\n" for row in rows), ""
        if args[:2] == ["show", "node"]:
            if args[2] not in self.nodes:
                return 1, "", f"Node {args[2]} not found"
            n = self.nodes[args[2]]
            state = n.state + ("+DRAIN" if n.drain else "")
            reason = f" Reason={n.reason} [root@2026-12-07T01:00:00]" if n.reason else ""
            return 0, f"NodeName={args[2]} Arch=x86_64 Gres=gpu:l4:2(S:0) State={state} Partitions=vision{reason}\n", ""
        if args[0] == "update":
            node = self.nodes[args[1].split("=", 1)[1]]
            if args[2] == "State=DRAIN":
                node.drain, node.reason = True, args[3].split("=", 1)[1]
            elif args[2] == "State=RESUME":
                if not node.drain:
                    return 1, "", "Invalid node state specified"
                node.drain, node.reason = False, ""
            return 0, "", ""
        if args[:2] == ["show", "reservation"]:
            return (0, "", "") if args[2] in self.reservations else (1, "", "Reservation not found")
        if args[:2] == ["create", "reservation"]:
            self.reservations.add(args[2].split("=", 1)[1])
            return 0, "", ""
        if args[0] == "delete":
            self.reservations.discard(args[1].split("=", 1)[1])
            return 0, "", ""
        raise AssertionError(f"unexpected call {argv}")

    def updates(self) -> list[list[str]]:
        return [c[2:] for c in self.calls if c[:2] == ["scontrol", "update"]]


class Gate(gate_module.Gate):  # type: ignore[name-defined,misc]
    """The check job is a local process printing `answer` and exiting with `rc`, as srun passes on the program's
    (the real srun command line is checked in test_the_check_job_is_the_whole_node_in_its_reservation)."""

    def __init__(self, slurm: Slurm, answer: Any, rc: int = 0, timeout: int = 60, sleep: float = 0) -> None:
        super().__init__(slurm, "/usr/local/sbin/gpuinfra-active-checks", timeout)
        self.answer, self.rc, self.sleep = answer, rc, sleep

    def start_check(self, node: str, state: Any, output: Any) -> subprocess.Popen[bytes]:
        text = self.answer if isinstance(self.answer, str) else json.dumps(self.answer)
        script = f"import sys, time; time.sleep({self.sleep}); print({text!r}); sys.exit({self.rc})"
        return subprocess.Popen([sys.executable, "-c", script], stdout=output, stderr=subprocess.STDOUT)


def admit(gate: Gate, nodes: list[str], take_over: bool = False) -> list[Any]:
    return list(gate_module.admit(gate, nodes, poll=0.05, take_over=take_over))


def test_a_node_that_passes_is_put_back_in_service() -> None:
    slurm = Slurm({"gpu03": Node(drain=True, reason="gpuinfra: driver upgrade")})
    [a] = admit(Gate(slurm, PASSED), ["gpu03"])
    assert (a.verdict, slurm.nodes["gpu03"].drain, slurm.reservations) == ("pass", False, set())
    updates = slurm.updates()
    assert updates[0] == ["NodeName=gpu03", "State=DRAIN", "Reason=gpuinfra: admission"]
    assert updates[1] == ["NodeName=gpu03", "State=RESUME"]  # into the reservation, for the check job alone
    assert updates[-1] == ["NodeName=gpu03", "State=RESUME"]
    created = next(c for c in slurm.calls if c[1:3] == ["create", "reservation"])
    assert created[3:] == [
        "ReservationName=gpuinfra-admission-gpu03", "Nodes=gpu03", "Users=root", "StartTime=now",
        "Duration=infinite", "Flags=MAINT,IGNORE_JOBS",
    ]  # fmt: skip
    # The reservation is made before the node is resumed: no moment where a user job could take it.
    order = [c[1] for c in slurm.calls if c[0] == "scontrol" and c[1] in ("create", "update")]
    assert order[:3] == ["update", "create", "update"]


def test_a_failing_check_keeps_the_node_drained_with_its_figure() -> None:
    slurm = Slurm({"gpu03": Node()})
    [a] = admit(Gate(slurm, SLOW, rc=1), ["gpu03"])
    node = slurm.nodes["gpu03"]
    assert (a.verdict, node.drain, node.reason) == ("fail", True, SLOW["reason"])
    assert a.checks == SLOW["checks"] and slurm.reservations == set()


@pytest.mark.parametrize(
    ("answer", "rc", "reason"),
    [
        ("srun: error: Unable to create step for job 7: Job/step already completing", 1,
         "gpuinfra admission: check job failed (exit 1): srun: error: Unable to create step for job 7"),
        ({"verdict": "pass", "reason": "x"}, 137,
         "gpuinfra admission: check job failed (exit 137): its checks said pass"),
        ({"verdict": "fail", "reason": "nccl slow"}, 1, "gpuinfra admission: fail: nccl slow"),
        ({"verdict": "unknown", "reason": "gpuinfra admission: dcgm diag could not be judged: not installed"}, 3,
         "gpuinfra admission: dcgm diag could not be judged: not installed"),
        ({"verdict": "fail", "reason": "gpuinfra admission: bad\x1b[31m\nline\u2028two"}, 1,
         "gpuinfra admission: bad [31m line two"),
    ],
)  # fmt: skip
def test_anything_but_a_clean_pass_keeps_the_node_drained(answer: Any, rc: int, reason: str) -> None:
    slurm = Slurm({"gpu03": Node()})
    [a] = admit(Gate(slurm, answer, rc=rc), ["gpu03"])
    node = slurm.nodes["gpu03"]
    assert (a.verdict != "pass", node.drain) == (True, True)
    assert node.reason.startswith(reason), node.reason
    assert node.reason.isprintable() and len(node.reason) <= 240


def test_an_operators_drain_is_left_alone_unless_taken_over() -> None:
    slurm = Slurm({"gpu03": Node(drain=True, reason="disk replacement, ticket 4711")})
    [a] = admit(Gate(slurm, PASSED), ["gpu03"])
    assert (a.verdict, slurm.updates(), slurm.nodes["gpu03"].reason) == ("fail", [], "disk replacement, ticket 4711")
    assert "left drained by someone else (disk replacement, ticket 4711)" in a.reason
    [a] = admit(Gate(slurm, PASSED), ["gpu03"], take_over=True)
    assert (a.verdict, slurm.nodes["gpu03"].drain) == ("pass", False)


def test_a_drain_by_the_health_check_meanwhile_is_kept() -> None:
    """The node's own health check (the prolog of the check job, say) drains it while it is checked: its reason
    stays, and the node is refused."""

    def health_drains(slurm: Slurm, argv: list[str]) -> None:
        if argv[0] == "squeue" and "--format=%T" in argv:
            slurm.nodes["gpu03"].drain, slurm.nodes["gpu03"].reason = True, "gpuinfra-health: 1 of 2 GPUs visible"

    slurm = Slurm({"gpu03": Node()}, on_call=health_drains)
    [a] = admit(Gate(slurm, PASSED, sleep=0.3), ["gpu03"])
    assert (a.verdict, slurm.nodes["gpu03"].reason) == ("fail", "gpuinfra-health: 1 of 2 GPUs visible")
    assert a.reason == "gpuinfra admission: drained meanwhile: gpuinfra-health: 1 of 2 GPUs visible"


def test_the_checks_wait_for_running_jobs_to_end() -> None:
    slurm = Slurm({"gpu03": Node(state="MIXED", jobs=3)})
    [a] = admit(Gate(slurm, PASSED), ["gpu03"])
    looks = [c for c in slurm.calls if c[0] == "squeue" and c[2].startswith("--nodelist")]
    created = next(i for i, c in enumerate(slurm.calls) if c[1:3] == ["create", "reservation"])
    assert len(looks) == 3 and slurm.calls.index(looks[-1]) < created
    assert a.verdict == "pass"


def test_a_node_not_done_within_the_timeout_stays_drained_and_its_job_is_stopped() -> None:
    slurm = Slurm({"gpu03": Node()})
    gate = Gate(slurm, PASSED, sleep=30, timeout=1)
    [a] = admit(gate, ["gpu03"])
    assert (a.verdict, slurm.nodes["gpu03"].drain) == ("fail", True)
    assert slurm.nodes["gpu03"].reason == "gpuinfra admission: not done within 1 s (checking)"
    assert slurm.reservations == set()


def test_every_node_is_checked_at_once_and_judged_alone() -> None:
    slurm = Slurm({"gpu03": Node(), "gpu04": Node(), "gpu05": Node()})
    results = admit(Gate(slurm, PASSED, sleep=0.5), ["gpu03", "gpu04", "gpu05", "gpu99"])
    assert {a.node: a.verdict for a in results} == {"gpu03": "pass", "gpu04": "pass", "gpu05": "pass", "gpu99": "fail"}
    assert max(a.ended - a.started for a in results) < 5  # three 0.5 s jobs side by side, not one after another
    assert [a.reason for a in results if a.node == "gpu99"] == ["gpuinfra admission: Slurm does not know gpu99"]


def test_the_check_job_is_the_whole_node_in_its_reservation(tmp_path: Path) -> None:
    state = gate_module.parse_node(
        "NodeName=gpu03 Arch=x86_64 Gres=gpu:l4:2(S:0),shard:8 State=IDLE+DRAIN Partitions=vision,gpuinfra "
        "Reason=gpuinfra: admission [root@2026-12-07T01:00:00]"
    )
    assert (state.gres, state.partitions, state.reason, state.drained) == (
        "gpu:l4:2", ["vision", "gpuinfra"], "gpuinfra: admission", True)  # fmt: skip
    seen = tmp_path / "argv"
    srun = tmp_path / "srun"
    srun.write_text(f"#!/bin/sh\nprintf '%s\\n' \"$@\" > {seen}\n")
    srun.chmod(0o755)
    program = "/usr/local/sbin/gpuinfra-active-checks"
    gate = gate_module.Gate(lambda argv: (0, "", ""), program, 1800, "gpuinfra", "gpuinfra")
    with open(tmp_path / "out", "w+b") as output, pytest.MonkeyPatch.context() as patch:
        patch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
        assert gate.start_check("gpu03", state, output).wait(10) == 0
    assert seen.read_text().splitlines() == [
        "--reservation=gpuinfra-admission-gpu03", "--partition=gpuinfra", "--nodelist=gpu03", "--nodes=1",
        "--ntasks=1", "--exclusive", "--time=30", "--job-name=gpuinfra-admission", "--quiet", "--gres=gpu:l4:2",
        "--qos=gpuinfra", program, "--json",
    ]  # fmt: skip


def test_history_is_kept_private_one_line_per_node(tmp_path: Path) -> None:
    slurm = Slurm({"gpu03": Node()})
    results = admit(Gate(slurm, SLOW, rc=1), ["gpu03"])
    path = tmp_path / "admission" / "history.jsonl"
    gate_module.keep_history(str(path), results, 1765000000.0)
    [line] = path.read_text().splitlines()
    assert json.loads(line)["reason"] == SLOW["reason"] and path.stat().st_mode & 0o777 == 0o600


def test_a_node_outside_the_checks_partition_is_refused_before_anything_runs() -> None:
    slurm = Slurm({"gpu03": Node()})  # in partition vision only
    gate = Gate(slurm, PASSED)
    gate.partition = "gpuinfra"
    [a] = admit(gate, ["gpu03"])
    assert a.reason == "gpuinfra admission: gpu03 is not in the Slurm partition gpuinfra for its check job"
    assert (slurm.nodes["gpu03"].drain, slurm.reservations) == (True, set())


def test_the_end_of_an_apply_admits_only_the_nodes_that_wait_for_it() -> None:
    """A machine that joined (drained with the gate's reason) or one a stopped run left in the gate's reservation;
    never a node in service, one drained for another reason, or one whose admission failed."""
    slurm = Slurm(
        {
            "gpu01": Node(),
            "gpu02": Node(drain=True, reason="gpuinfra: admission"),
            "gpu03": Node(),  # resumed into its reservation when the run stopped
            "gpu04": Node(drain=True, reason="gpuinfra: driver upgrade to 580.95.05"),
            "gpu05": Node(drain=True, reason=str(SLOW["reason"])),
            "gpu06": Node(drain=True, reason="fan replaced, do not use"),
        },
        reservations={"gpuinfra-admission-gpu03"},
    )
    gate = Gate(slurm, PASSED)
    assert gate_module.waiting(gate, [*slurm.nodes, "gpu99"]) == ["gpu02", "gpu03"]
    assert [a.verdict for a in admit(gate, ["gpu02", "gpu03"])] == ["pass", "pass"]
    assert gate_module.waiting(gate, list(slurm.nodes)) == []


def test_the_report_shows_each_nodes_drain_its_admission_and_the_breaker(tmp_path: Path) -> None:
    """Read-only: Slurm's state and reason, the gate's place (waiting, checking), the last admission from the
    history (a line of junk and an older record skipped), and the partition's health drains against its limit."""
    slurm = Slurm({
        "gpu01": Node(drain=True, reason="gpuinfra-health: xid 79 on GPU 1: reboot"),
        "gpu02": Node(drain=True, reason="gpuinfra: admission"),
        "gpu03": Node(drain=True, reason="gpuinfra: admission"),
        "gpu04": Node(),
    }, reservations={"gpuinfra-admission-gpu03"})  # fmt: skip
    history = tmp_path / "history.jsonl"
    history.write_text(
        '{"time": 100.0, "node": "gpu04", "verdict": "fail", "reason": "old"}\nnot json\n'
        '{"time": 200.0, "node": "gpu04", "verdict": "pass", "reason": "passed", "kind": "scheduled"}\n'
    )
    calls_before = len(slurm.calls)
    found = gate_module.report(Gate(slurm, PASSED), ["gpu01", "gpu02", "gpu03", "gpu04", "gpu09"], str(history), "25%")
    nodes = found["nodes"]
    assert (nodes["gpu01"]["state"], nodes["gpu01"]["reason"]) == (
        ["DRAIN", "IDLE"],
        "gpuinfra-health: xid 79 on GPU 1: reboot",
    )
    assert [nodes[n]["admission"] for n in ("gpu01", "gpu02", "gpu03", "gpu04")] == ["", "waiting", "checking", ""]
    assert nodes["gpu04"]["last"] == {"time": 200.0, "verdict": "pass", "reason": "passed", "kind": "scheduled"}
    assert nodes["gpu01"]["last"] is None and nodes["gpu09"]["state"] == []
    assert found["breaker"] == [{"partition": "vision", "nodes": 4, "held": ["gpu01"], "limit": 1}]
    # It changed nothing: only reads.
    assert all(c[0] in ("sinfo", "squeue") or c[1] == "show" for c in slurm.calls[calls_before:])
