#!/usr/bin/python
# Copyright: gpuinfra maintainers
# Apache License 2.0 (see LICENSE)
"""The admission gate: hold GPU nodes out of service, run their active checks as a Slurm job on each, and put back
only the nodes whose checks all pass."""

from __future__ import annotations

import json
import os
import re
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpuinfra.cluster.plugins.module_utils.active_checks import admission_reservation as reservation
from ansible_collections.gpuinfra.cluster.plugins.module_utils.breaker import drain_limit, held_by_health

DOCUMENTATION = r"""
module: gpu_admission
short_description: Admit GPU nodes into service only after their active checks pass
description:
  - >-
    Runs on the Slurm controller. For each node, it drains the node with the reason C(gpuinfra: admission), waits
    until no job is left on it, and creates a maintenance reservation of the node for root alone, so that no user
    job can land on it while it is checked.
  - It resumes the node into the reservation and runs C(gpuinfra-active-checks --json) on it as a Slurm job
    (C(srun), the whole node, its GPUs included), then drains it again with the admission reason while the job runs.
  - Every node's job runs at once. A node whose checks all pass is put back in service (reservation deleted,
    drain undone). A node whose checks fail or cannot judge it, whose job fails, or that is not done within
    C(timeout), stays drained with a reason naming the check and its figure.
  - A node drained meanwhile for another reason (the health check, an operator) keeps that drain.
  - What the node prints is data. Only its JSON is read, size-bounded and type-checked, and its reason is cut to
    one printable line.
  - A node drained for a reason that is not gpuinfra's (an operator's) is left as it is and refused, unless
    C(take_over) is set.
  - Re-running it finishes the work of a run that stopped: a reservation or check job it left is replaced.
options:
  nodes:
    description: The nodes' names in slurm.conf.
    type: list
    elements: str
    required: true
  timeout:
    description: Seconds each node may take, the wait for its jobs to end included.
    type: int
    default: 1800
  partition:
    description:
      - The partition the check jobs run in, one only root may use (gpuinfra's C(gpuinfra) partition), since a user
        partition's AllowAccounts would refuse root. Empty takes each node's first partition.
    type: str
    default: ""
  qos:
    description:
      - The QoS the check jobs run under, one with no limit meant for users (gpuinfra's C(gpuinfra) QoS, which root's
        association may use); a QoS of one GPU per job would hold the job for a node of eight. Empty leaves root's
        default QoS.
    type: str
    default: ""
  take_over:
    description: Also admit nodes drained for a reason that is not gpuinfra's (an operator asked for it).
    type: bool
    default: false
  program:
    description: The active checks' program on the nodes.
    type: path
    default: /usr/local/sbin/gpuinfra-active-checks
  history:
    description: A file on the controller each admission's result is appended to, one JSON line each; empty keeps none.
    type: path
    default: /var/lib/gpuinfra/admission/history.jsonl
  poll:
    description: Seconds between two looks at the nodes and their jobs.
    type: float
    default: 1
  waiting:
    description:
      - Admit only the nodes that wait for it, and leave every other as it is, in service or not. A node waits when it
        is drained with the gate's reason (a machine that joined, or one a stopped run left) or holds the gate's
        reservation (a run stopped while its check job ran).
    type: bool
    default: false
  report:
    description:
      - Change nothing; return, for the health sweep, each node's state and drain reason in Slurm, its place in the
        gate (C(waiting), C(checking) or none) and its last admission in the history, and for each of their
        partitions but the check jobs' the nodes the health checks hold drained and the breaker's limit.
    type: bool
    default: false
  max_drained:
    description: >-
      The breaker's limit for the report, a count or a percentage of a partition's nodes (health.check.max_drained).
    type: str
    default: "10%"
author: gpuinfra maintainers
"""

EXAMPLES = r"""
- name: Admit the upgraded node
  gpuinfra.cluster.gpu_admission:
    nodes: [gpu03]
    timeout: 1800
"""

RETURN = r"""
admitted:
  description: The nodes put back in service.
  type: list
  elements: str
  returned: always
refused:
  description: The nodes left drained, each with the reason it carries.
  type: dict
  returned: always
results:
  description: Per node, the checks' verdict, reason, per-check figures and the seconds the admission took.
  type: dict
  returned: always
report:
  description: >-
    With report, C(nodes) (per node C(state), C(reason), C(partitions), C(admission), C(last)) and C(breaker).
  type: dict
  returned: with report
"""

ADMISSION = "gpuinfra: admission"
PREFIX = "gpuinfra admission"
OURS = "gpuinfra"  # drains by gpuinfra (an upgrade's, the health check's, the gate's) start with it
JOB_NAME = "gpuinfra-admission"
MAX_OUTPUT = 4 * 1024 * 1024  # far more than the program prints (one JSON line of a few KiB)
MAX_REASON = 240
NODE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
EXIT_CODES = {"pass": 0, "fail": 1, "unknown": 3}  # gpuinfra-active-checks' exit status for each verdict

Run = Callable[[list[str]], "tuple[int, str, str]"]


def clean(text: str, limit: int = MAX_REASON) -> str:
    """One printable line, for a drain reason: what a node prints may carry control characters."""
    text = " ".join("".join(ch if ch.isprintable() else " " for ch in text[: limit * 4]).split())
    return text if len(text) <= limit else text[: limit - 3].rstrip() + "..."


@dataclass
class NodeState:
    flags: set[str]
    reason: str
    partitions: list[str]
    gres: str

    @property
    def drained(self) -> bool:
        return bool(self.flags & {"DRAIN", "DRAINED", "DRAINING"})


def parse_node(text: str) -> NodeState:
    """`scontrol show node NAME --oneliner`: State (flags joined by +), Reason (the rest of the line after it, up to
    its ` [user@time]`), Partitions and Gres."""
    fields = dict(re.findall(r"(?:^|\s)(State|Partitions|Gres)=(\S*)", text))
    found = re.search(r"\sReason=(.*?)(?: \[[^\]]*@[^\]]*\])?\s*$", text)
    gres = ",".join(g.split("(")[0] for g in fields.get("Gres", "").split(",") if g.startswith("gpu"))
    return NodeState(
        flags=set(fields.get("State", "UNKNOWN").split("+")),
        reason=found.group(1) if found else "",
        partitions=[p for p in fields.get("Partitions", "").split(",") if p and p != "(null)"],
        gres=gres,
    )


@dataclass
class Admission:
    """One node's way through the gate."""

    node: str
    started: float
    phase: str = "emptying"  # emptying -> checking -> done
    check: subprocess.Popen[bytes] | None = None
    output: Any = None
    redrained: bool = False
    ended: float = 0.0
    verdict: str = ""
    reason: str = ""
    checks: list[dict[str, Any]] = field(default_factory=list)


class Gate:
    """The gate's steps, through Slurm's own commands; `run` runs one and returns (rc, stdout, stderr)."""

    def __init__(self, run: Run, program: str, timeout: int, partition: str = "", qos: str = "") -> None:
        self.run, self.program, self.timeout, self.partition, self.qos = run, program, timeout, partition, qos

    def scontrol(self, *args: str) -> tuple[int, str, str]:
        return self.run(["scontrol", *args])

    def state(self, node: str) -> NodeState | None:
        rc, out, _ = self.scontrol("show", "node", node, "--oneliner")
        return parse_node(out.strip()) if rc == 0 and out.strip() else None

    def drain(self, node: str, reason: str) -> None:
        rc, _, err = self.scontrol("update", f"NodeName={node}", "State=DRAIN", f"Reason={clean(reason)}")
        if rc != 0:
            raise GateError(f"cannot drain {node}: {clean(err)}")

    def resume(self, node: str) -> None:
        rc, _, err = self.scontrol("update", f"NodeName={node}", "State=RESUME")
        if rc != 0:
            raise GateError(f"cannot resume {node}: {clean(err)}")

    def busy(self, node: str) -> bool:
        rc, out, _ = self.run(["squeue", "--noheader", f"--nodelist={node}", "--format=%i"])
        return rc != 0 or bool(out.strip())

    def reserved(self, node: str) -> bool:
        """Whether the node holds the gate's reservation."""
        return self.scontrol("show", "reservation", reservation(node))[0] == 0

    def reserve(self, node: str) -> None:
        """A maintenance reservation of the node for root alone; one a stopped run left is replaced, with its job."""
        name = reservation(node)
        if self.reserved(node):
            self.run(["scancel", f"--reservation={name}"])
            self.scontrol("delete", f"ReservationName={name}")
        rc, _, err = self.scontrol(
            "create", "reservation", f"ReservationName={name}", f"Nodes={node}", "Users=root",
            "StartTime=now", "Duration=infinite", "Flags=MAINT,IGNORE_JOBS",
        )  # fmt: skip
        if rc != 0:
            raise GateError(f"cannot reserve {node} for its checks: {clean(err)}")

    def unreserve(self, node: str) -> None:
        self.run(["scancel", f"--reservation={reservation(node)}"])
        self.scontrol("delete", f"ReservationName={reservation(node)}")

    def start_check(self, node: str, state: NodeState, output: Any) -> subprocess.Popen[bytes]:
        minutes = max(1, -(-self.timeout // 60))
        argv = [
            "srun", f"--reservation={reservation(node)}", f"--partition={self.partition or state.partitions[0]}",
            f"--nodelist={node}", "--nodes=1", "--ntasks=1", "--exclusive", f"--time={minutes}",
            f"--job-name={JOB_NAME}", "--quiet", *([f"--gres={state.gres}"] if state.gres else []),
            *([f"--qos={self.qos}"] if self.qos else []),
            self.program, "--json",
        ]  # fmt: skip
        return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT)

    def job_running(self, node: str) -> bool:
        rc, out, _ = self.run(["squeue", "--noheader", f"--reservation={reservation(node)}", "--format=%T"])
        return rc == 0 and "RUNNING" in out.split()


class GateError(Exception):
    """A step Slurm refused; the node is left drained."""


def read_result(output: Any) -> dict[str, Any] | None:
    """The program's JSON line (the last line that parses as an object with a verdict), or None."""
    output.seek(0)
    text = output.read(MAX_OUTPUT + 1).decode("utf-8", errors="replace")
    if len(text) > MAX_OUTPUT:
        return None
    for line in reversed(text.splitlines()):
        try:
            result = json.loads(line)
        except ValueError:
            continue
        if isinstance(result, dict) and result.get("verdict") in EXIT_CODES:
            return result
    return None


def last_line(output: Any) -> str:
    output.seek(0)
    lines = [line for line in output.read(MAX_OUTPUT).decode("utf-8", errors="replace").splitlines() if line.strip()]
    return lines[-1] if lines else "no output"


def judge(admission: Admission, rc: int) -> None:
    """The node's verdict from its program's JSON, which must agree with the job's exit status (the program's: 0
    pass, 1 fail, 3 unknown); anything else is a check job that failed."""
    result = read_result(admission.output)
    if result is None or rc != EXIT_CODES[result["verdict"]]:
        said = f"its checks said {result['verdict']}" if result is not None else last_line(admission.output)
        admission.verdict, admission.reason = "fail", clean(f"{PREFIX}: check job failed (exit {rc}): {said}")
        return
    checks = result.get("checks")
    admission.checks = [c for c in checks if isinstance(c, dict)][:16] if isinstance(checks, list) else []
    given = result.get("reason")
    reason = given if isinstance(given, str) else ""
    reason = reason if reason.startswith(PREFIX) else f"{PREFIX}: {result['verdict']}: {reason or 'no reason given'}"
    admission.verdict, admission.reason = result["verdict"], clean(reason)


def step(gate: Gate, a: Admission, now: float) -> None:
    """Moves one node on by what it can do now."""
    if now - a.started > gate.timeout:
        if a.check is not None:
            a.check.terminate()
        a.verdict, a.reason = "fail", f"{PREFIX}: not done within {gate.timeout} s ({a.phase})"
        a.phase, a.ended = "done", now
        return
    if a.phase == "emptying":
        if gate.busy(a.node):
            return
        state = gate.state(a.node)
        if state is None or not (gate.partition in state.partitions if gate.partition else state.partitions):
            raise GateError(f"{a.node} is not in the Slurm partition {gate.partition or 'any'} for its check job")
        gate.reserve(a.node)
        gate.resume(a.node)  # into the reservation: only the check job can take it
        a.output = tempfile.TemporaryFile()  # noqa: SIM115 -- open for the job's life, closed once it is judged
        a.check = gate.start_check(a.node, state, a.output)
        a.phase = "checking"
        return
    assert a.check is not None
    rc = a.check.poll()
    if rc is None and not a.redrained and gate.job_running(a.node):
        # Shown while the job runs (the job itself is not touched); a drain someone made meanwhile is kept.
        state = gate.state(a.node)
        if state is not None and not (state.drained and not state.reason.startswith(ADMISSION)):
            gate.drain(a.node, ADMISSION)
        a.redrained = True
    if rc is not None:
        judge(a, rc)
        a.phase, a.ended = "done", now


def finish(gate: Gate, a: Admission) -> None:
    """Puts a passing node back in service; keeps any other drained with its reason. A drain that is no longer the
    gate's (the health check's, an operator's) is left as it is, and the node counts as refused."""
    state = gate.state(a.node)
    ours = state is not None and state.reason.startswith(ADMISSION)
    if state is not None and state.drained and not ours:
        a.verdict, a.reason = "fail", clean(f"{PREFIX}: drained meanwhile: {state.reason}")
    elif a.verdict != "pass":
        gate.drain(a.node, a.reason)
    gate.unreserve(a.node)
    if a.verdict == "pass" and state is not None and state.drained:
        gate.resume(a.node)


def waiting(gate: Gate, nodes: list[str]) -> list[str]:
    """The nodes that wait for their admission: drained with the gate's reason, or in the gate's reservation."""
    found = []
    for node in nodes:
        state = gate.state(node)
        if state is not None and ((state.drained and state.reason == ADMISSION) or gate.reserved(node)):
            found.append(node)
    return found


# The history is read from its end, this much of it: the last admission of each node is there on any real fleet.
HISTORY_TAIL = 4 * 1024 * 1024


def last_admissions(path: str) -> dict[str, dict[str, Any]]:
    """Each node's last record in the admission history: its time, verdict, reason and kind (the gate's, or
    `scheduled`). The file is the controller's own; a line that is not such a record is skipped."""
    try:
        with open(path, "rb") as handle:
            handle.seek(max(0, os.fstat(handle.fileno()).st_size - HISTORY_TAIL))
            lines = handle.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return {}
    found: dict[str, dict[str, Any]] = {}
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if (
            isinstance(record, dict)
            and isinstance(record.get("node"), str)
            and isinstance(record.get("time"), (int, float))
        ):
            found[record["node"]] = {
                "time": record["time"],
                "verdict": clean(str(record.get("verdict", ""))),
                "reason": clean(str(record.get("reason") or "")),
                "kind": "scheduled" if record.get("kind") == "scheduled" else "gate",
            }
    return found


def report(gate: Gate, nodes: list[str], history: str, max_drained: str) -> dict[str, Any]:
    """What the health sweep shows of each node beside its own verdict: Slurm's state and drain reason, its place in
    the gate and its last admission; and each partition's count of nodes the health checks hold drained against the
    breaker's limit (gpuinfra's own partition left out, as the health program leaves it out)."""
    last = last_admissions(history)
    found: dict[str, Any] = {}
    partitions: set[str] = set()
    for node in nodes:
        state = gate.state(node)
        if state is None:
            found[node] = {"state": [], "reason": "", "partitions": [], "admission": "", "last": last.get(node)}
            continue
        place = "checking" if gate.reserved(node) else "waiting" if state.drained and state.reason == ADMISSION else ""
        found[node] = {
            "state": sorted(state.flags), "reason": clean(state.reason), "partitions": state.partitions,
            "admission": place, "last": last.get(node),
        }  # fmt: skip
        partitions.update(p for p in state.partitions if p != gate.partition)
    breaker = []
    for partition in sorted(partitions):
        rc, out, _ = gate.run(["sinfo", "--noheader", "--Node", f"--partition={partition}", "--format=%N|%T|%E"])
        rows = {}
        for line in out.splitlines() if rc == 0 else []:
            name, flags, reason = [*line.split("|", 2), "", ""][:3]
            rows[name] = held_by_health(flags, reason)
        held = sorted(node for node, ours in rows.items() if ours)
        limit = drain_limit(max_drained, len(rows)) if rows else 0
        breaker.append({"partition": partition, "nodes": len(rows), "held": held, "limit": limit})
    return {"nodes": found, "breaker": breaker}


def admit(
    gate: Gate, nodes: list[str], poll: float, take_over: bool = False, clock: Callable[[], float] = time.monotonic
) -> list[Admission]:
    start = clock()
    admissions, refused = [], []
    for node in nodes:
        state = gate.state(node)
        a = Admission(node, start)
        if state is None:
            a.verdict, a.reason, a.phase, a.ended = "fail", f"{PREFIX}: Slurm does not know {node}", "done", start
            refused.append(a)
        elif state.drained and not state.reason.startswith(OURS) and not take_over:
            a.verdict, a.phase, a.ended = "fail", "done", start
            a.reason = clean(
                f"{PREFIX}: left drained by someone else ({state.reason}); admit it on purpose to take over"
            )
            refused.append(a)
        else:
            gate.drain(node, ADMISSION)
            admissions.append(a)
    try:
        while any(a.phase != "done" for a in admissions):
            for a in admissions:
                if a.phase == "done":
                    continue
                try:
                    step(gate, a, clock())
                except GateError as exc:
                    a.verdict, a.reason, a.phase, a.ended = "fail", f"{PREFIX}: {exc}", "done", clock()
            if any(a.phase != "done" for a in admissions):
                time.sleep(poll)
    finally:
        for a in admissions:
            if a.check is not None and a.check.poll() is None:
                a.check.terminate()
    for a in admissions:
        try:
            finish(gate, a)
        except GateError as exc:
            a.verdict, a.reason = "fail", f"{PREFIX}: {exc}"
        if a.output is not None:
            a.output.close()
    return [*refused, *admissions]


def keep_history(path: str, admissions: list[Admission], clock: float) -> None:
    if not path:
        return
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    with os.fdopen(descriptor, "a", encoding="utf-8") as out:
        for a in admissions:
            record = {"time": round(clock, 3), "node": a.node, "verdict": a.verdict, "reason": a.reason}
            record["seconds"] = round(a.ended - a.started, 1)
            out.write(json.dumps({**record, "checks": a.checks}, sort_keys=True) + "\n")


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "nodes": {"type": "list", "elements": "str", "required": True},
            "timeout": {"type": "int", "default": 1800},
            "partition": {"type": "str", "default": ""},
            "qos": {"type": "str", "default": ""},
            "take_over": {"type": "bool", "default": False},
            "program": {"type": "path", "default": "/usr/local/sbin/gpuinfra-active-checks"},
            "history": {"type": "path", "default": "/var/lib/gpuinfra/admission/history.jsonl"},
            "poll": {"type": "float", "default": 1},
            "waiting": {"type": "bool", "default": False},
            "report": {"type": "bool", "default": False},
            "max_drained": {"type": "str", "default": "10%"},
        },
        supports_check_mode=True,
    )
    params = module.params
    nodes = list(dict.fromkeys(params["nodes"]))
    odd = [n for n in nodes if not NODE_NAME.match(n)]
    if odd:
        module.fail_json(msg=f"not Slurm node names: {', '.join(map(repr, odd))}")

    def run(argv: list[str]) -> tuple[int, str, str]:
        rc, out, err = module.run_command(argv)
        return rc, out, err

    gate = Gate(run, params["program"], params["timeout"], params["partition"], params["qos"])
    if params["report"]:
        module.exit_json(changed=False, report=report(gate, nodes, params["history"], params["max_drained"]))
    if module.check_mode:
        module.exit_json(changed=False, skipped=True, msg="the gate runs checks as jobs: nothing to show in check mode")
    if params["waiting"]:
        nodes = waiting(gate, nodes)
        if not nodes:
            module.exit_json(changed=False, admitted=[], refused={}, results={})
    admissions = admit(gate, nodes, params["poll"], params["take_over"])
    keep_history(params["history"], admissions, time.time())
    admitted = [a.node for a in admissions if a.verdict == "pass"]
    refused = {a.node: a.reason for a in admissions if a.verdict != "pass"}
    results = {
        a.node: {"verdict": a.verdict, "reason": a.reason, "checks": a.checks, "seconds": round(a.ended - a.started, 1)}
        for a in admissions
    }
    outcome = {"changed": True, "admitted": admitted, "refused": refused, "results": results}
    if refused:
        # One node (as the role runs it): its reason alone, which an upgrade's rescue keeps as the drain reason.
        named = "; ".join(reason if len(nodes) == 1 else f"{node}: {reason}" for node, reason in refused.items())
        module.fail_json(msg=named, **outcome)
    module.exit_json(**outcome)


if __name__ == "__main__":
    main()
