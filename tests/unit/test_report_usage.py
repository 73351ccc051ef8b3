"""The usage report's pure part: the window, clipping jobs to it, aggregating, and the table, CSV and JSON."""

from __future__ import annotations

import csv
import io

import pytest

from gpuinfra.report import time_range
from gpuinfra.report.sacct import JobRecord
from gpuinfra.report.text import usage_csv, usage_table
from gpuinfra.report.time_range import TimeRange, parse_when, window
from gpuinfra.report.usage import JobMetrics, clip, job_metrics, usage_report

T0 = 1714521600  # 2024-05-01T00:00:00Z
HOUR = 3600


def job(job_id: str, user: str, account: str, start: int | None, end: int | None, elapsed: int | None, gpus: int,
        partition: str | None = None) -> JobRecord:  # fmt: skip
    state = "RUNNING" if end is None else "COMPLETED"
    return JobRecord(job_id, job_id, user, account, partition or account, state, start, end, elapsed, gpus)


WINDOW = TimeRange(T0, T0 + 10 * HOUR)


def test_a_job_inside_the_window_counts_sacct_s_elapsed() -> None:
    # Elapsed leaves out time the job spent suspended: 2 h wall, 1.5 h elapsed.
    assert clip(job("1", "a", "x", T0 + HOUR, T0 + 3 * HOUR, int(1.5 * HOUR), 2), WINDOW) == (3 * HOUR, False)


def test_a_job_that_started_before_the_window_counts_only_its_part_inside() -> None:
    assert clip(job("1", "a", "x", T0 - 5 * HOUR, T0 + 2 * HOUR, 7 * HOUR, 4), WINDOW) == (8 * HOUR, True)


def test_a_running_job_counts_up_to_the_window_s_end() -> None:
    running = job("1", "a", "x", T0 + 9 * HOUR, None, HOUR, 1)
    assert clip(running, WINDOW) == (HOUR, False)
    assert clip(running, TimeRange(T0, T0 + 9 * HOUR + 1800)) == (1800, True)


def test_jobs_without_gpus_or_not_started_count_nothing() -> None:
    assert clip(job("1", "a", "x", T0, T0 + HOUR, HOUR, 0), WINDOW) == (0, False)
    assert clip(job("1", "a", "x", None, None, None, 2), WINDOW) == (0, False)
    assert clip(job("1", "a", "x", T0 - 3 * HOUR, T0 - HOUR, 2 * HOUR, 2), WINDOW)[0] == 0


def test_the_window_reads_durations_and_dates() -> None:
    now = T0 + 30 * 86400
    assert parse_when("30d", now) == T0
    assert parse_when("2024-05-01", now) == T0
    assert parse_when("2024-05-01T02:00:00+02:00", now) == T0
    with pytest.raises(ValueError, match="neither a duration"):
        parse_when("last tuesday", now)
    with pytest.raises(ValueError, match="window is empty"):
        window("1h", "2h", now)
    assert window("30d", None, now) == TimeRange(T0, now)


def test_a_window_is_cut_into_equal_pieces_of_at_most_a_day() -> None:
    odd = TimeRange(T0 + 7, T0 + 2 * 86400 + 100)  # 2 days and 93 s: 3 pieces
    chunked = odd.chunked()
    assert chunked.until == odd.until and odd.since - 3 < chunked.since <= odd.since
    assert chunked.seconds == 3 * chunked.step_s and chunked.step_s <= time_range.CHUNK_S
    assert TimeRange(T0, T0 + 3600).chunked() == TimeRange(T0, T0 + 3600)


def _report() -> tuple[list[JobRecord], dict[str, JobMetrics]]:
    records = [
        job("1", "alice", "vision", T0, T0 + 2 * HOUR, 2 * HOUR, 2),  # 4 GPU-h at 50 %
        job("2", "alice", "vision", T0 + HOUR, T0 + 3 * HOUR, 2 * HOUR, 1, "scavenger"),  # 2 GPU-h at 80 %
        job("3", "bob", "nlp", T0, T0 + HOUR, HOUR, 1),  # 1 GPU-h, no samples
        job("4", "bob", "nlp", T0, T0 + HOUR, HOUR, 0),  # no GPU: not listed
    ]
    metrics = {
        "1": JobMetrics(util_sum=50.0 * 100, util_count=100, fb_sum=1000.0 * 100, fb_count=100),
        "2": JobMetrics(util_sum=80.0 * 10, util_count=10, fb_sum=4000.0 * 10, fb_count=10),
    }
    return records, metrics


def test_groups_weight_the_means_by_gpu_time_and_say_where_there_are_none() -> None:
    records, metrics = _report()
    report = usage_report(records, WINDOW, metrics)
    doc = report.as_dict()
    assert [j["job_id"] for j in doc["jobs"]] == ["1", "2", "3"]
    accounts = {row["account"]: row for row in doc["by_account"]}
    assert accounts["vision"]["gpu_hours"] == 6.0
    assert accounts["vision"]["mean_util_pct"] == pytest.approx((50 * 4 + 80 * 2) / 6, abs=0.05)
    assert accounts["vision"]["mean_fb_used_mib"] == pytest.approx((1000 * 4 + 4000 * 2) / 6, abs=0.05)
    assert (accounts["nlp"]["gpu_hours"], accounts["nlp"]["gpu_hours_measured"]) == (1.0, 0.0)
    assert (accounts["nlp"]["mean_util_pct"], accounts["nlp"]["util_note"]) == (
        None,
        "n/a (no GPU metrics for these jobs)",
    )
    assert {row["partition"]: row["jobs"] for row in doc["by_partition"]} == {"vision": 1, "scavenger": 1, "nlp": 1}
    assert doc["jobs"][2]["util_note"] == "n/a (no GPU metrics for this job)"
    assert doc["total"]["gpu_hours"] == 7.0 and doc["utilisation"] == {"collected": True, "reason": None}


def test_without_metrics_every_row_says_why() -> None:
    records, _ = _report()
    reason = "not collected (monitoring.components has no dcgm_exporter)"
    doc = usage_report(records, WINDOW, None, reason).as_dict()
    assert doc["utilisation"] == {"collected": False, "reason": reason}
    assert {row["util_note"] for group in ("by_account", "by_user", "by_partition", "jobs") for row in doc[group]} == {
        reason
    }
    assert all(row["mean_util_pct"] is None for row in doc["jobs"])
    with pytest.raises(ValueError, match="reason"):
        usage_report(records, WINDOW, None)


def test_table_and_csv() -> None:
    records, metrics = _report()
    report = usage_report(records, WINDOW, metrics)
    table = usage_table(report)
    assert "GPU usage from 2024-05-01T00:00:00Z to 2024-05-01T10:00:00Z" in table
    assert "ACCOUNT  JOBS  GPU-HOURS  MEAN UTIL" in table
    assert "vision      2       6.00  60.0%                                2000 MiB\n" in table
    assert "nlp         1       1.00  n/a (no GPU metrics for these jobs)  n/a\n" in table
    assert "scavenger     1       2.00  80.0%" in table
    assert "3 job(s), 7.00 GPU-hours, 6.00 of them with GPU metrics" in table
    rows = list(csv.DictReader(io.StringIO(usage_csv(report))))
    assert {(r["by"], r["name"], r["gpu_hours"], r["mean_util_pct"]) for r in rows if r["by"] == "account"} == {
        ("account", "vision", "6.0", "60.0"),
        ("account", "nlp", "1.0", ""),
    }
    reason = "not collected (monitoring.components has no dcgm_exporter)"
    bare = usage_table(usage_report(records, WINDOW, None, reason))
    assert f"GPU utilisation: {reason}" in bare
    assert "60.0%" not in bare
    assert "vision      2       6.00  n/a        n/a\n" in bare


def test_job_metrics_are_read_from_the_four_totals() -> None:
    totals = {
        "DCGM_FI_DEV_GPU_UTIL:sum_over_time": {"7": 150.0},
        "DCGM_FI_DEV_GPU_UTIL:count_over_time": {"7": 3.0},
        "DCGM_FI_DEV_FB_USED:sum_over_time": {"7": 30.0},
        "DCGM_FI_DEV_FB_USED:count_over_time": {"7": 3.0},
    }
    found = job_metrics(totals)["7"]
    assert (found.util_pct, found.fb_used_mib) == (50.0, 10.0)
