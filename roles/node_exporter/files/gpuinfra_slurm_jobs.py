#!/usr/bin/python3
"""Write the running Slurm jobs, and the jobs killed for memory, as Prometheus metrics for the node exporter's
textfile collector.

Per running job: who runs it (user, account, partition) and how many GPUs it holds. The DCGM exporter labels each
allocated GPU with the job's id (hpc_job, from the job mapping the prolog writes), so Prometheus can join GPU use
to accounts. With --sacct, the jobs that ended OUT_OF_MEMORY within the last hour, from Slurm's accounting, with
when they ended (the SlurmJobOutOfMemory alert names each with its user). Like the node state collector, the file
is replaced atomically, so the collector never reads half of it; when squeue or sacct fails, the file says so
(gpuinfra_slurm_squeue_success or gpuinfra_slurm_sacct_success 0) and lists none of its jobs, never stale ones.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass

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


def parse(text: str) -> list[Job]:
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


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


NOT_ASKED: list[OomJob] = []


def render(jobs: list[Job] | None, oom: list[OomJob] | None = NOT_ASKED) -> str:
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


def write_atomically(path: str, content: str) -> None:
    folder = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".gpuinfra_slurm_jobs.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(content)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--squeue", default="squeue")
    parser.add_argument("--sacct", default="", help="the jobs killed for memory from this sacct (none: not asked)")
    parser.add_argument("--output", required=True)
    parser.add_argument("--timeout", type=float, default=20.0)
    args = parser.parse_args(argv)
    try:
        # --all: jobs in hidden partitions too. User and account names are data: undecodable bytes are replaced.
        done = subprocess.run(
            [args.squeue, "--noheader", "--all", "--states=RUNNING", f"--Format={SQUEUE_FORMAT}"],
            capture_output=True,
            text=True,
            errors="replace",
            timeout=args.timeout,
            check=True,
        )
        jobs: list[Job] | None = parse(done.stdout)
    except (OSError, subprocess.SubprocessError) as exc:
        print(f"squeue failed: {exc}", file=sys.stderr)
        jobs = None
    oom = out_of_memory(args.sacct, args.timeout) if args.sacct else NOT_ASKED
    write_atomically(args.output, render(jobs, oom))
    return 0 if jobs is not None and oom is not None else 1


def out_of_memory(sacct: str, timeout: float) -> list[OomJob] | None:
    """The jobs of every user that ended OUT_OF_MEMORY within OOM_WINDOW; None when sacct fails."""
    command = [sacct, "--allocations", "--allusers", "--noheader", "--parsable2", "--state=OUT_OF_MEMORY",
               f"--starttime=now-{OOM_WINDOW}", "--endtime=now", f"--format={','.join(SACCT_FIELDS)}"]  # fmt: skip
    try:
        done = subprocess.run(
            command,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=timeout,
            check=True,
            env={**os.environ, "SLURM_TIME_FORMAT": "%s"},
        )
    except (OSError, subprocess.SubprocessError) as exc:
        print(f"sacct failed: {exc}", file=sys.stderr)
        return None
    return parse_oom(done.stdout)


if __name__ == "__main__":
    sys.exit(main())
