"""`gpuinfra report` against the sandbox cluster: real Slurm jobs, real slurmdbd accounting, read through
playbooks/report.yml over SSH as every run is.

Runs after test_apply_e2e.py, which converges the sandbox (files run in name order); run alone, it brings the
sandbox up and converges it first. GPU jobs of alice (account vision) and bob (account nlp) run on the fake GPUs;
once sacct shows them completed, `gpuinfra report usage --json` must give each account and user exactly the
GPU-seconds sacct's own ElapsedRaw and AllocTRES give for those jobs. The GPU nodes' DCGM exporter (the sandbox's
stand-in, from the same answers as their nvidia-smi: idle GPUs) gives the utilisation of each job's GPUs, and
`report idle` lists a job whose GPU stays idle past monitoring.alerts.idle_for (a minute here).
"""

from __future__ import annotations

import json
import re
import shlex
import time
from pathlib import Path
from typing import Any

import pytest
from harness import MARKS, SANDBOX_CLUSTER, converged, gpuinfra, on_host, sbatch

# (user, account, srun options, seconds of sleep): jobs that hold 1, 2 (across both nodes) and 2 GPUs; the last one
# long enough for Prometheus (every 10 s) to scrape its GPUs more than once.
JOBS = (
    ("alice", "vision", ["--gres=gpu:1"], 4),
    ("alice", "vision", ["--nodes=2", "--ntasks-per-node=1", "--gres=gpu:1"], 3),
    ("bob", "nlp", ["--gres=gpu:2"], 35),
)


pytestmark = MARKS


@pytest.fixture(scope="module")
def sandbox() -> Path:
    """The sandbox, up and converged: Slurm's controller and accounting daemon answer on ctl01."""
    return converged()


def _run_job(user: str, account: str, options: list[str], seconds: int) -> str:
    # ssh joins the words into one line for the remote shell, so the script is quoted once more.
    script = shlex.quote(f'echo "$SLURM_JOB_ID"; sleep {seconds}')
    srun = ["runuser", "-u", user, "--", "srun", f"--partition={account}", f"--account={account}", "--chdir=/tmp",
            "--immediate=120", *options]  # fmt: skip
    job = on_host("ctl01", *srun, "sh", "-c", script)
    assert job.returncode == 0, job.stderr
    [job_id] = set(job.stdout.split())
    return job_id


def _sacct(job_ids: list[str]) -> list[dict[str, str]]:
    fields = ["JobIDRaw", "User", "Account", "State", "ElapsedRaw", "AllocTRES"]
    done = on_host("ctl01", "sacct", "--allusers", "--allocations", "--parsable2", "--noheader",
                   f"--jobs={','.join(job_ids)}", f"--format={','.join(fields)}")  # fmt: skip
    assert done.returncode == 0, done.stderr
    return [dict(zip(fields, line.split("|"), strict=True)) for line in done.stdout.splitlines() if line]


def _wait_completed(job_ids: list[str]) -> list[dict[str, str]]:
    """sacct's records once slurmdbd has every job as COMPLETED (accounting is written a moment after srun
    returns)."""
    rows: list[dict[str, str]] = []
    for _ in range(120):
        rows = _sacct(job_ids)
        if sorted(r["JobIDRaw"] for r in rows) == sorted(job_ids) and all(r["State"] == "COMPLETED" for r in rows):
            return rows
        time.sleep(1)
    raise AssertionError(f"the jobs did not show as completed in sacct: {rows}")


def _gpus(tres: str) -> int:
    match = re.search(r"(?:^|,)gres/gpu=([0-9]+)(?:,|$)", tres)
    return int(match.group(1)) if match else 0


@pytest.fixture(scope="module")
def jobs(sandbox: Path) -> tuple[str, list[dict[str, str]]]:
    """The window's start (UTC, by ctl01's clock) and sacct's records of the jobs run after it."""
    clock = on_host("ctl01", "date", "-u", "+%Y-%m-%dT%H:%M:%S")
    assert clock.returncode == 0, clock.stderr
    job_ids = [_run_job(*job) for job in JOBS]
    return clock.stdout.strip(), _wait_completed(job_ids)


def _usage(since: str) -> dict[str, Any]:
    done = gpuinfra("report", "usage", str(SANDBOX_CLUSTER), "--since", since, "--json", timeout=600)
    assert done.stdout, done.stderr
    doc: dict[str, Any] = json.loads(done.stdout)
    assert (done.returncode, doc["exit_code"]) == (0, 0), done.stderr
    return doc


def test_usage_gives_each_account_and_user_sacct_s_gpu_hours(jobs: tuple[str, list[dict[str, str]]]) -> None:
    since, records = jobs
    want_account: dict[str, int] = {}
    want_user: dict[str, int] = {}
    for record in records:
        seconds = int(record["ElapsedRaw"]) * _gpus(record["AllocTRES"])
        want_account[record["Account"]] = want_account.get(record["Account"], 0) + seconds
        want_user[record["User"]] = want_user.get(record["User"], 0) + seconds
    assert set(want_account) == {"vision", "nlp"} and all(want_account.values()), records

    doc = _usage(since)
    ours = {r["JobIDRaw"] for r in records}
    assert {j["job_id"] for j in doc["jobs"]} == ours, "the window holds other jobs than the test's"
    assert {r["account"]: r["gpu_seconds"] for r in doc["by_account"]} == want_account
    assert {r["user"]: r["gpu_seconds"] for r in doc["by_user"]} == want_user
    assert {r["account"]: r["gpu_hours"] for r in doc["by_account"]} == {
        account: round(seconds / 3600, 4) for account, seconds in want_account.items()
    }
    by_job = {j["job_id"]: j for j in doc["jobs"]}
    for record in records:
        assert by_job[record["JobIDRaw"]]["gpus"] == _gpus(record["AllocTRES"])
        assert by_job[record["JobIDRaw"]]["clipped"] is False


def test_usage_gives_the_utilisation_of_each_jobs_gpus(jobs: tuple[str, list[dict[str, str]]]) -> None:
    """The DCGM exporter's samples of the GPUs each job held (its hpc_job label): bob's 35-second job on two idle
    GPUs has several, at 0 % and 0 MiB as the emulated GPUs answer; the jobs too short for a scrape say so."""
    since, _ = jobs
    doc = _usage(since)
    assert doc["utilisation"] == {"collected": True, "reason": None}
    bobs = next(j for j in doc["jobs"] if j["user"] == "bob")
    assert bobs["util_samples"] >= 4, bobs  # two GPUs, at least two scrapes each
    assert (bobs["mean_util_pct"], bobs["mean_fb_used_mib"], bobs["util_note"]) == (0.0, 0.0, None), bobs
    nlp = next(r for r in doc["by_account"] if r["account"] == "nlp")
    assert (nlp["mean_util_pct"], nlp["util_note"]) == (0.0, None), nlp
    for job in doc["jobs"]:
        assert (job["util_samples"] > 0) == (job["util_note"] is None), job
    table = gpuinfra("report", "usage", str(SANDBOX_CLUSTER), "--since", since, timeout=600)
    assert table.returncode == 0, table.stderr
    assert "not collected" not in table.stdout and re.search(r"^vision +2 ", table.stdout, re.MULTILINE), table.stdout


def test_idle_lists_a_job_whose_gpu_stays_idle(sandbox: Path) -> None:
    """alice's job holds one GPU and leaves it idle: once it has been idle for monitoring.alerts.idle_for, `report
    idle` lists the job with its user, account and GPU; the report changes nothing, so the job still runs."""
    job = sbatch(
        "alice", "--partition=vision", "--gres=gpu:1", "--chdir=/tmp", "--output=/dev/null", command="sleep 600"
    )
    try:
        listed: list[dict[str, Any]] = []
        deadline = time.monotonic() + 240
        while not listed and time.monotonic() < deadline:
            time.sleep(10)
            done = gpuinfra("report", "idle", str(SANDBOX_CLUSTER), "--json", timeout=600)
            assert done.returncode == 0, done.stdout + done.stderr
            listed = [j for j in json.loads(done.stdout)["jobs"] if j["job_id"] == job]
        assert listed, f"job {job} not listed as idle within 240 s"
        [found] = listed
        assert (found["user"], found["account"], found["idle_gpus"]) == ("alice", "vision", 1), found
        assert on_host("ctl01", "squeue", "--noheader", f"--jobs={job}", "--format=%T").stdout.strip() == "RUNNING"
    finally:
        on_host("ctl01", "scancel", job)
