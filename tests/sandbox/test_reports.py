"""`gpuinfra report` against the sandbox cluster: real Slurm jobs, real slurmdbd accounting, read through
playbooks/report.yml over SSH as every run is.

Runs after test_apply_e2e.py, which converges the sandbox (files run in name order); run alone, it brings the
sandbox up and converges it first. GPU jobs of alice (account vision) and bob (account nlp) run on the fake GPUs;
once sacct shows them completed, `gpuinfra report usage --json` must give each account and user exactly the
GPU-seconds sacct's own ElapsedRaw and AllocTRES give for those jobs. The sandbox has Prometheus but no DCGM
exporter, so the report says utilisation is not collected, and `report idle` refuses with exit code 3.
"""

from __future__ import annotations

import json
import re
import shlex
import time
from pathlib import Path
from typing import Any

import pytest
from harness import MARKS, SANDBOX_CLUSTER, converged, gpuinfra, on_host

NOT_COLLECTED = "not collected (monitoring.components has no dcgm_exporter)"
# (user, account, srun options, seconds of sleep): jobs that hold 1, 2 (across both nodes) and 2 GPUs.
JOBS = (
    ("alice", "vision", ["--gres=gpu:1"], 4),
    ("alice", "vision", ["--nodes=2", "--ntasks-per-node=1", "--gres=gpu:1"], 3),
    ("bob", "nlp", ["--gres=gpu:2"], 5),
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


def test_usage_says_utilisation_is_not_collected(jobs: tuple[str, list[dict[str, str]]]) -> None:
    since, _ = jobs
    doc = _usage(since)
    assert doc["utilisation"] == {"collected": False, "reason": NOT_COLLECTED}
    rows = [*doc["by_account"], *doc["by_user"], *doc["by_partition"], *doc["jobs"]]
    assert rows and all((r["mean_util_pct"], r["util_note"]) == (None, NOT_COLLECTED) for r in rows)
    table = gpuinfra("report", "usage", str(SANDBOX_CLUSTER), "--since", since, timeout=600)
    assert table.returncode == 0, table.stderr
    assert f"GPU utilisation: {NOT_COLLECTED}" in table.stdout
    assert re.search(r"^vision +2 ", table.stdout, re.MULTILINE), table.stdout


def test_idle_refuses_without_gpu_metrics(sandbox: Path) -> None:
    done = gpuinfra("report", "idle", str(SANDBOX_CLUSTER), timeout=600)
    assert done.returncode == 3
    assert "does not collect GPU utilisation per job (monitoring.components has no dcgm_exporter)" in done.stderr
