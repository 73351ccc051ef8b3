#!/usr/bin/python3
"""gpuinfra-scheduled-checks: run the GPU nodes' active checks again on a schedule, on idle nodes only.

A systemd timer runs it on the Slurm controller every few seconds to minutes. Each pass:
1. records the check jobs that ended since the last pass in the admission history (the gate's file), one JSON line
   each, with the verdict the job's exit status gives (gpuinfra-active-checks: 0 pass, 1 fail, 3 unknown); a job a
   user job preempted is recorded as such, and its node is due again;
2. submits a check job (sbatch, the whole node, gpuinfra's partition and its scheduled checks' QoS, which every
   other QoS preempts) to each node that is idle (no job, no drain, no reservation) and whose last check,
   scheduled or at its admission, is older than `every`; a job that has not started within seconds (a user job got
   there first) is cancelled.

A check job never makes a user job wait: it starts only on an idle node, at once or not at all, and a user job that
wants the node preempts it (the job is cancelled, and the node's program keeps no result of a run it did not end).
A failing check drains nothing here: the node's health program reads the result the checks program keeps, and
drains the node through its breaker, with the check's reason.

Exit codes: 0 done (whatever the nodes' verdicts), 2 bad configuration, 1 Slurm refused a command it needs.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

CONFIG = "/etc/gpuinfra/scheduled-checks.json"
STATE = "/var/lib/gpuinfra/admission/scheduled.json"
JOB_NAME = "gpuinfra-scheduled-check"
# The history's last MiB holds thousands of lines, far more than one per node: enough to find each node's last run.
HISTORY_TAIL = 1024 * 1024
COMMAND_TIMEOUT = 60
# The active checks' program's exit status for each verdict.
VERDICTS = {0: "pass", 1: "fail", 3: "unknown"}
# sacct states of a job that has not ended.
ACTIVE = {"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED", "RESIZING", "SUSPENDED"}
NODE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
# How long a check job may stay pending before it is cancelled: an idle node's job starts in a scheduling cycle.
START_WAIT = 10

Run = Callable[[list[str]], "tuple[int, str, str]"]


class Failure(Exception):
    pass


def run(argv: list[str]) -> tuple[int, str, str]:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=COMMAND_TIMEOUT, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return 1, "", str(exc)
    return done.returncode, done.stdout, done.stderr


@dataclass(frozen=True)
class Settings:
    every: int
    timeout: int
    partition: str
    qos: str
    program: str
    history: str


def settings_of(path: str) -> Settings:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        found = Settings(
            every=int(data["every"]),
            timeout=int(data["timeout"]),
            partition=str(data["partition"]),
            qos=str(data["qos"]),
            program=str(data["program"]),
            history=str(data["history"]),
        )
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise Failure(f"cannot read the settings {path}: {exc}") from exc
    if found.every < 1 or found.timeout < 1 or not os.path.isabs(found.program):
        raise Failure(f"{path}: every and timeout must be positive, and program an absolute path")
    return found


@dataclass(frozen=True)
class Node:
    name: str
    idle: bool
    """IDLE with no flag: no job, no drain, no reservation, responding."""
    partitions: list[str]
    gres: str


def parse_nodes(text: str) -> list[Node]:
    """`scontrol show node --oneliner`: one node a line."""
    nodes = []
    for line in text.splitlines():
        fields = dict(re.findall(r"(?:^|\s)(NodeName|State|Partitions|Gres)=(\S*)", line))
        name = fields.get("NodeName", "")
        if not NODE_NAME.match(name):
            continue
        gres = ",".join(g.split("(")[0] for g in fields.get("Gres", "").split(",") if g.startswith("gpu"))
        partitions = [p for p in fields.get("Partitions", "").split(",") if p and p != "(null)"]
        nodes.append(Node(name, fields.get("State") == "IDLE", partitions, gres))
    return nodes


def last_runs(history: str) -> dict[str, float]:
    """Node -> when its active checks last ran to a verdict, at its admission or on schedule (the history's last
    lines; a line that is not one of ours is skipped)."""
    try:
        with open(history, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - HISTORY_TAIL))
            text = f.read(HISTORY_TAIL).decode("utf-8", errors="replace")
    except OSError:
        return {}
    last: dict[str, float] = {}
    for line in text.splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if not isinstance(entry, dict) or entry.get("verdict") not in ("pass", "fail", "unknown"):
            continue
        node, when = entry.get("node"), entry.get("time")
        if isinstance(node, str) and isinstance(when, (int, float)):
            last[node] = max(last.get(node, 0.0), float(when))
    return last


def verdict_of(state: str, exit_code: str) -> str:
    """A check job's verdict from sacct: the program's exit status, or what became of the job."""
    state = state.split()[0] if state else ""
    if state == "PREEMPTED" or state.startswith("CANCELLED"):
        return "preempted"
    if state == "TIMEOUT":
        return "unknown"
    status = exit_code.split(":")[0]
    if state in ("COMPLETED", "FAILED") and status.isdigit() and int(status) in VERDICTS:
        return VERDICTS[int(status)]
    return "error"


def collect(run: Run, jobs: dict[str, dict[str, Any]], now: float, grace: int) -> list[dict[str, Any]]:
    """The jobs that ended, as history entries; they leave `jobs`. One sacct has forgotten (after `grace`) too."""
    if not jobs:
        return []
    rc, out, err = run(["sacct", "--noheader", "--parsable2", "--allocations", f"--jobs={','.join(jobs)}",
                        "--format=JobID,State,ExitCode"])  # fmt: skip
    if rc != 0:
        raise Failure(f"sacct: {err.strip() or f'exit code {rc}'}")
    seen = {row[0]: row[1:] for row in (line.split("|") for line in out.splitlines()) if len(row) == 3}
    ended = []
    for job, record in list(jobs.items()):
        state, exit_code = seen.get(job, ("", ""))
        if state.split(" ")[0] in ACTIVE or (not state and now - record["submitted"] < grace):
            continue
        verdict = verdict_of(state, exit_code) if state else "error"
        ended.append({"time": round(now, 3), "node": record["node"], "kind": "scheduled", "job": job,
                      "verdict": verdict, "seconds": round(now - record["submitted"], 1)})  # fmt: skip
        del jobs[job]
    return ended


def submit(run: Run, settings: Settings, node: Node) -> str | None:
    """The check job's id, or None when Slurm refused it."""
    minutes = max(1, -(-settings.timeout // 60))
    argv = [
        "sbatch", "--parsable", f"--partition={settings.partition}", f"--qos={settings.qos}",
        f"--nodelist={node.name}", "--nodes=1", "--ntasks=1", "--exclusive", f"--time={minutes}",
        f"--job-name={JOB_NAME}", "--output=/dev/null", *([f"--gres={node.gres}"] if node.gres else []),
        f"--wrap=exec {shlex.quote(settings.program)} --json",
    ]  # fmt: skip
    rc, out, _ = run(argv)
    job = out.strip().split(";")[0]
    return job if rc == 0 and job.isdigit() else None


def cancel_pending(run: Run, jobs: list[str], wait: float, sleep: Callable[[float], None] = time.sleep) -> list[str]:
    """The jobs still pending after `wait` seconds, cancelled (sbatch has no --immediate): a check job starts at
    once on its idle node or not at all."""
    deadline = time.monotonic() + wait
    while True:
        rc, out, _ = run(["squeue", "--noheader", f"--jobs={','.join(jobs)}", "--format=%i|%T"])
        pending = [j for j, _, state in (line.partition("|") for line in out.split()) if state == "PENDING"]
        if rc != 0 or not pending or time.monotonic() >= deadline:
            break
        sleep(1)
    if pending:
        run(["scancel", *pending])
    return pending


def one_pass(run: Run, settings: Settings, state: dict[str, Any], now: float) -> dict[str, Any]:
    """Record what ended and start what is due; returns what it did."""
    jobs: dict[str, dict[str, Any]] = state.setdefault("jobs", {})
    ended = collect(run, jobs, now, grace=settings.timeout + 600)
    keep_history(settings.history, ended)
    rc, out, err = run(["scontrol", "show", "node", "--oneliner"])
    if rc != 0:
        raise Failure(f"scontrol show node: {err.strip() or f'exit code {rc}'}")
    last = last_runs(settings.history)
    checking = {record["node"] for record in jobs.values()}
    started = {}
    for node in parse_nodes(out):
        due = now - last.get(node.name, 0.0) >= settings.every
        if node.idle and due and settings.partition in node.partitions and node.name not in checking:
            job = submit(run, settings, node)
            if job is not None:
                started[node.name] = job
    cancelled = set(cancel_pending(run, list(started.values()), START_WAIT)) if started else set()
    started = {node: job for node, job in started.items() if job not in cancelled}
    jobs.update({job: {"node": node, "submitted": round(now, 3)} for node, job in started.items()})
    return {"ended": ended, "started": started}


def keep_history(path: str, entries: list[dict[str, Any]]) -> None:
    if not entries:
        return
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    with os.fdopen(descriptor, "a", encoding="utf-8") as out:
        out.write("".join(json.dumps(e, sort_keys=True) + "\n" for e in entries))


def load_state(path: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as f:
            state = json.load(f)
    except (OSError, ValueError):
        return {}
    jobs = state.get("jobs") if isinstance(state, dict) else None
    if not isinstance(jobs, dict):
        return {}
    good = {
        job: record
        for job, record in jobs.items()
        if job.isdigit() and isinstance(record, dict) and isinstance(record.get("node"), str)
        and isinstance(record.get("submitted"), (int, float))
    }  # fmt: skip
    return {"jobs": good}


def save_state(path: str, state: dict[str, Any]) -> None:
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".scheduled.")
    with os.fdopen(handle, "w", encoding="utf-8") as out:
        json.dump(state, out, sort_keys=True)
    os.chmod(temporary, 0o600)
    os.replace(temporary, path)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpuinfra-scheduled-checks", description=__doc__.split("\n")[0])
    parser.add_argument("--config", default=CONFIG, help=f"settings (default {CONFIG})")
    parser.add_argument("--state", default=STATE, help=f"the check jobs not yet recorded (default {STATE})")
    args = parser.parse_args(argv)
    try:
        settings = settings_of(args.config)
    except Failure as exc:
        print(f"gpuinfra-scheduled-checks: {exc}", file=sys.stderr)
        return 2
    state = load_state(args.state)
    try:
        done = one_pass(run, settings, state, time.time())
    except Failure as exc:
        print(f"gpuinfra-scheduled-checks: {exc}", file=sys.stderr)
        return 1
    finally:
        save_state(args.state, state)
    for entry in done["ended"]:
        print(f"gpuinfra-scheduled-checks: {entry['node']}: job {entry['job']}: {entry['verdict']}")
    for node, job in done["started"].items():
        print(f"gpuinfra-scheduled-checks: {node}: job {job} started")
    return 0


if __name__ == "__main__":
    sys.exit(main())
