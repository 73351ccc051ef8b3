#!/usr/bin/python3
"""Write Slurm's view of the cluster as Prometheus metrics for the node exporter's textfile collector.

No Slurm exporter is packaged for Debian 12, so the node exporter on the Slurm controller publishes what Slurm's
commands say, one textfile per question:

- `nodes`: every node's state from sinfo (drained, down, with the reason);
- `jobs`: per running job, who runs it (user, account, partition) and how many GPUs it holds, from squeue. The DCGM
  exporter labels each allocated GPU with the job's id (hpc_job, from the job mapping the prolog writes), so
  Prometheus can join GPU use to accounts. With --sacct, also the jobs that ended OUT_OF_MEMORY within the last hour,
  from Slurm's accounting, with when they ended (the SlurmJobOutOfMemory alert names each with its user).

Each file is replaced atomically, so the collector never reads half of one. When a command fails, its file says so
(gpuinfra_slurm_sinfo_success, _squeue_success or _sacct_success 0) and lists nothing of it, never stale states.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass

# --- node states ----------------------------------------------------------------------------------------------------

# One line per node and partition: name, extended state (e.g. "down*", "drained", "mixed+drain"), reason.
SINFO_FORMAT = "%N|%T|%E"
DRAINED = {"drain", "drained", "draining"}
DOWN = {"down", "fail", "failing"}
# Suffixes sinfo appends to a state: * not responding, ~ powered off, # powering up, ! pending power down,
# % powering down, $ maintenance reservation, @ pending reboot, ^ reboot issued, - planned.
SUFFIXES = "*~#!%$@^-"


def parse_sinfo(text: str) -> dict[str, dict[str, object]]:
    """sinfo lines -> {node: {state, drained, down, reason}}; a node listed in several partitions appears once."""
    nodes: dict[str, dict[str, object]] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        name, _, rest = line.partition("|")
        raw_state, _, reason = rest.partition("|")
        raw_state = raw_state.strip().lower()
        words = raw_state.rstrip(SUFFIXES).split("+")
        base, flags = words[0], set(words[1:])
        responding = "*" not in raw_state
        nodes[name.strip()] = {
            "state": base or "unknown",
            "drained": base in DRAINED or bool(flags & DRAINED),
            "down": base in DOWN or not responding,
            "reason": "" if reason.strip() in ("", "none") else reason.strip(),
        }
    return nodes


def render_nodes(nodes: dict[str, dict[str, object]] | None) -> str:
    """The textfile for these nodes; None means sinfo failed."""
    out = [
        "# HELP gpuinfra_slurm_sinfo_success 1 when sinfo answered, 0 when it failed.",
        "# TYPE gpuinfra_slurm_sinfo_success gauge",
        f"gpuinfra_slurm_sinfo_success {0 if nodes is None else 1}",
    ]
    if nodes is None:
        return "\n".join(out) + "\n"
    out += [
        "# HELP gpuinfra_slurm_node_state Slurm base state of the node: the series with value 1 names it.",
        "# TYPE gpuinfra_slurm_node_state gauge",
    ]
    out += [
        f'gpuinfra_slurm_node_state{{node="{_label(n)}",state="{_label(str(v["state"]))}"}} 1'
        for n, v in sorted(nodes.items())
    ]
    for metric, help_text in (
        ("drained", "1 when the node is drained or draining: no new job starts on it."),
        ("down", "1 when the node is down, failed or not responding."),
    ):
        out += [f"# HELP gpuinfra_slurm_node_{metric} {help_text}", f"# TYPE gpuinfra_slurm_node_{metric} gauge"]
        for name, values in sorted(nodes.items()):
            flagged = bool(values[metric])
            reason = f',reason="{_label(str(values["reason"]))}"' if flagged and values["reason"] else ""
            out.append(f'gpuinfra_slurm_node_{metric}{{node="{_label(name)}"{reason}}} {int(flagged)}')
    return "\n".join(out) + "\n"


# --- running jobs, and the jobs killed for memory -------------------------------------------------------------------

# squeue --Format fields. "Name:|" means: no width (never truncated, never padded) and "|" after the field. JobID is
# the job's own id (an array task's too), the id the prolog writes for the DCGM exporter; NumNodes is the number
# of nodes a running job holds.
FIELDS = ("JobID", "UserName", "Account", "Partition", "NumNodes", "tres-alloc", "tres-per-job", "tres-per-node")
SQUEUE_FORMAT = ",".join(f"{field}:|" for field in FIELDS)
EMPTY = {"", "n/a", "(null)"}


# sacct's fields for the jobs killed for memory, and how far back it looks: the alert lasts as long.
SACCT_FIELDS = ("JobID", "User", "Account", "Partition", "End")
OOM_WINDOW = "1hours"


@dataclass(frozen=True)
class OomJob:
    job_id: str
    user: str
    account: str
    partition: str
    end: int
    """Unix time (sacct with SLURM_TIME_FORMAT=%s)."""


@dataclass(frozen=True)
class Job:
    job_id: str
    user: str
    account: str
    partition: str
    gpus: int


def _gpus_in(tres: str) -> int | None:
    """GPUs a TRES string names; None when it names none.

    Allocated TRES read `gres/gpu=2` or, per type, `gres/gpu:l4=2`; requests read `gres:gpu:2`, `gres/gpu:l4:2`
    (Slurm 23.02 and later) or `gpu:2`. A string with both the total and the typed counts (when
    AccountingStorageTRES tracks both) is counted once, by its total.
    """
    total: int | None = None
    typed: int | None = None
    for item in tres.split(","):
        item = item.strip()
        if "=" in item:
            name, _, count = item.partition("=")
        else:
            head, _, tail = item.rpartition(":")
            name, count = (head, tail) if tail.isdigit() else (item, "1")
        for prefix in ("gres/", "gres:"):
            name = name.removeprefix(prefix)
        if not count.isdigit() or not (name == "gpu" or name.startswith("gpu:")):
            continue
        if name == "gpu":
            total = (total or 0) + int(count)
        else:
            typed = (typed or 0) + int(count)
    return total if total is not None else typed


def job_gpus(nodes: str, alloc: str, per_job: str, per_node: str) -> int:
    """GPUs a running job holds: its allocated TRES when the cluster tracks gres/gpu (AccountingStorageTRES), else
    its request (per job, or per node times its nodes). Requests per task or per socket are not counted."""
    for tres, factor in ((alloc, 1), (per_job, 1), (per_node, int(nodes) if nodes.isdigit() else 1)):
        if tres.strip().lower() in EMPTY:
            continue
        gpus = _gpus_in(tres)
        if gpus is not None:
            return gpus * factor
    return 0


def parse_squeue(text: str) -> list[Job]:
    """squeue lines -> jobs, one per job id. A line that does not read as the format asks is skipped."""
    jobs: dict[str, Job] = {}
    width = len(FIELDS) + 1  # the "|" after the last field leaves an empty last part
    for line in text.splitlines():
        parts = line.split("|")
        if len(parts) < width or parts[-1].strip():
            if line.strip():
                print(f"squeue line not understood, skipped: {line!r}", file=sys.stderr)
            continue
        # Only an account name could hold a "|": the fields around it cannot.
        job_id, user = parts[0].strip(), parts[1].strip()
        account = "|".join(parts[2 : len(parts) - 6]).strip()
        account = "" if account == "(null)" else account  # a cluster without accounting: no account
        partition, nodes, alloc, per_job, per_node = (p.strip() for p in parts[-6:-1])
        if not job_id.isdigit():
            print(f"squeue job id not a number, skipped: {line!r}", file=sys.stderr)
            continue
        jobs[job_id] = Job(job_id, user, account, partition, job_gpus(nodes, alloc, per_job, per_node))
    return [jobs[key] for key in sorted(jobs, key=int)]


def parse_oom(text: str) -> list[OomJob]:
    """sacct --parsable2 lines -> the jobs killed for memory, one per job id; lines that do not read are skipped."""
    jobs: dict[str, OomJob] = {}
    for line in text.splitlines():
        parts = [part.strip() for part in line.split("|")]
        if len(parts) != len(SACCT_FIELDS) or not parts[4].isdigit() or not parts[0]:
            if line.strip():
                print(f"sacct line not understood, skipped: {line!r}", file=sys.stderr)
            continue
        job_id, user, account, partition, end = parts
        jobs[job_id] = OomJob(job_id, user, account, partition, int(end))
    return [jobs[key] for key in sorted(jobs)]


NOT_ASKED: list[OomJob] = []


def render_jobs(jobs: list[Job] | None, oom: list[OomJob] | None = NOT_ASKED) -> str:
    """The textfile for these jobs; None means squeue (or sacct, for `oom`) failed; NOT_ASKED, that sacct was not
    asked (no accounting)."""
    out = [
        "# HELP gpuinfra_slurm_squeue_success 1 when squeue answered, 0 when it failed.",
        "# TYPE gpuinfra_slurm_squeue_success gauge",
        f"gpuinfra_slurm_squeue_success {0 if jobs is None else 1}",
    ]
    if oom is not NOT_ASKED:
        out += _render_oom(oom)
    if jobs is None:
        return "\n".join(out) + "\n"
    out += [
        "# HELP gpuinfra_slurm_job_info A running Slurm job; hpc_job is the id the DCGM exporter labels its GPUs with.",
        "# TYPE gpuinfra_slurm_job_info gauge",
    ]
    out += [
        f'gpuinfra_slurm_job_info{{hpc_job="{_label(j.job_id)}",user="{_label(j.user)}",'
        f'account="{_label(j.account)}",partition="{_label(j.partition)}"}} 1'
        for j in jobs
    ]
    out += [
        "# HELP gpuinfra_slurm_job_gpus GPUs allocated to the running Slurm job, on all its nodes.",
        "# TYPE gpuinfra_slurm_job_gpus gauge",
    ]
    out += [f'gpuinfra_slurm_job_gpus{{hpc_job="{_label(j.job_id)}"}} {j.gpus}' for j in jobs]
    return "\n".join(out) + "\n"


def _render_oom(jobs: list[OomJob] | None) -> list[str]:
    out = [
        "# HELP gpuinfra_slurm_sacct_success 1 when sacct answered, 0 when it failed.",
        "# TYPE gpuinfra_slurm_sacct_success gauge",
        f"gpuinfra_slurm_sacct_success {0 if jobs is None else 1}",
    ]
    if not jobs:
        return out
    out += [
        "# HELP gpuinfra_slurm_job_out_of_memory_end_timestamp_seconds When a job killed for memory ended.",
        "# TYPE gpuinfra_slurm_job_out_of_memory_end_timestamp_seconds gauge",
    ]
    out += [
        f'gpuinfra_slurm_job_out_of_memory_end_timestamp_seconds{{hpc_job="{_label(j.job_id)}",user="{_label(j.user)}",'
        f'account="{_label(j.account)}",partition="{_label(j.partition)}"}} {j.end}'
        for j in jobs
    ]
    return out


def out_of_memory(sacct: str, timeout: float) -> list[OomJob] | None:
    """The jobs of every user that ended OUT_OF_MEMORY within OOM_WINDOW; None when sacct fails."""
    command = [sacct, "--allocations", "--allusers", "--noheader", "--parsable2", "--state=OUT_OF_MEMORY",
               f"--starttime=now-{OOM_WINDOW}", "--endtime=now", f"--format={','.join(SACCT_FIELDS)}"]  # fmt: skip
    text = ask(command, timeout, env={**os.environ, "SLURM_TIME_FORMAT": "%s"})
    return None if text is None else parse_oom(text)


# --- shared ---------------------------------------------------------------------------------------------------------


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def ask(command: list[str], timeout: float, env: dict[str, str] | None = None) -> str | None:
    """A Slurm command's output; None, said on stderr, when it fails. Names are data: undecodable bytes replaced."""
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, errors="replace", timeout=timeout, check=True, env=env
        )
    except (OSError, subprocess.SubprocessError) as exc:
        print(f"{os.path.basename(command[0])} failed: {exc}", file=sys.stderr)
        return None
    return done.stdout


def write_atomically(path: str, content: str) -> None:
    folder = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".gpuinfra_slurm.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(content)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def write_nodes(args: argparse.Namespace) -> int:
    text = ask([args.sinfo, "--noheader", "--Node", f"--format={SINFO_FORMAT}"], args.timeout)
    states = None if text is None else parse_sinfo(text)
    write_atomically(args.output, render_nodes(states))
    return 0 if states is not None else 1


def write_jobs(args: argparse.Namespace) -> int:
    # --all: jobs in hidden partitions too.
    text = ask([args.squeue, "--noheader", "--all", "--states=RUNNING", f"--Format={SQUEUE_FORMAT}"], args.timeout)
    running = None if text is None else parse_squeue(text)
    oom = out_of_memory(args.sacct, args.timeout) if args.sacct else NOT_ASKED
    write_atomically(args.output, render_jobs(running, oom))
    return 0 if running is not None and oom is not None else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    verbs = parser.add_subparsers(required=True)
    nodes = verbs.add_parser("nodes", help="write sinfo's node states")
    nodes.add_argument("--sinfo", default="sinfo")
    nodes.set_defaults(run=write_nodes)
    jobs = verbs.add_parser("jobs", help="write squeue's running jobs, and sacct's jobs killed for memory")
    jobs.add_argument("--squeue", default="squeue")
    jobs.add_argument("--sacct", default="", help="the jobs killed for memory from this sacct (none: not asked)")
    jobs.set_defaults(run=write_jobs)
    for verb in (nodes, jobs):
        verb.add_argument("--output", required=True)
        verb.add_argument("--timeout", type=float, default=20.0)
    args = parser.parse_args(argv)
    return int(args.run(args))


if __name__ == "__main__":
    sys.exit(main())
