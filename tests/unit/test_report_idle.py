"""The idle report's pure part: the alert's `for:` rule walked over a GPU's points, the join with squeue's jobs,
and the table and CSV."""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuinfra.report.idle import IdleGpu, IdleRule, idle_gpus, idle_report, idle_run
from gpuinfra.report.prometheus import Series
from gpuinfra.report.squeue import RunningJob
from gpuinfra.report.text import FORMULA_STARTS, idle_csv, idle_table

END = 1714536000
STEP = 30
RULE = IdleRule(threshold_pct=10.0, for_s=1800, step_s=STEP)


def series(job: str, gpu: str, values_oldest_first: Sequence[float | None]) -> Series:
    """Points at the last len(values) steps up to END; None leaves a step without a point (the series absent)."""
    first = END - STEP * (len(values_oldest_first) - 1)
    points = {(first + i * STEP) * 1000: v for i, v in enumerate(values_oldest_first) if v is not None}
    return Series({"hpc_job": job, "instance": "gpu01", "gpu": gpu}, points)


def test_the_run_is_the_stretch_below_the_threshold_that_reaches_now() -> None:
    start = END - 120 * STEP
    assert idle_run(series("1", "0", [50.0] + [2.0] * 61), 10.0, start, END, STEP) == (1800, False)
    # One step at the threshold breaks the run: below means strictly below, as in the rule's `<`.
    assert idle_run(series("1", "0", [2.0] * 30 + [10.0] + [2.0] * 30), 10.0, start, END, STEP) == (870, False)
    # A step without the series breaks it too, as a missing evaluation resets the alert.
    assert idle_run(series("1", "0", [2.0] * 30 + [None] + [2.0] * 30), 10.0, start, END, STEP) == (870, False)
    # Busy now, or absent now: not idle at all.
    assert idle_run(series("1", "0", [2.0] * 60 + [50.0]), 10.0, start, END, STEP) is None
    assert idle_run(series("1", "0", [2.0] * 60 + [None]), 10.0, start, END, STEP) is None
    # Idle since before the lookback's first step: at least that long.
    assert idle_run(series("1", "0", [2.0] * 121), 10.0, start, END, STEP) == (3600, True)


def test_a_gpu_is_idle_once_its_run_is_as_long_as_idle_for() -> None:
    start = END - RULE.lookback_s()
    exactly = series("1", "0", [50.0] + [2.0] * 61)  # 1800 s: the alert fires at `for` exactly
    short = series("2", "0", [50.0] + [2.0] * 60)  # 1770 s: still pending
    found = idle_gpus([exactly, short], RULE, start, END)
    assert found == [IdleGpu("gpu01:0", "1", 1800, False)]


def test_the_lookback_is_whole_steps_within_prometheus_s_point_limit() -> None:
    assert RULE.query_step_s() == 30 and RULE.lookback_s() % 30 == 0 and RULE.lookback_s() >= 86400
    fine = IdleRule(10.0, 1800, 1)
    assert fine.query_step_s() > 1 and fine.lookback_s() // fine.query_step_s() <= 10_000
    long = IdleRule(10.0, 3 * 86400, 30)
    assert long.lookback_s() >= 3 * 86400 + 30


def test_idle_gpus_are_joined_with_their_jobs() -> None:
    report = idle_report(
        RULE,
        [
            IdleGpu("gpu01:0", "7", 2400, False),
            IdleGpu("gpu01:1", "7", 3600, False),
            IdleGpu("gpu02:1", "9", 2000, False),
        ],
        {"7": RunningJob("7", "alice", "vision", "vision", 4)},
    )
    doc = report.as_dict()
    assert doc["rule"]["expr"] == 'DCGM_FI_DEV_GPU_UTIL{hpc_job!=""} < 10'
    [seven] = doc["jobs"]
    assert (seven["job_id"], seven["gpus"], seven["idle_gpus"], seven["idle_minutes"]) == ("7", 4, 2, 40)
    assert seven["idle_gpu_names"] == ["gpu01:0", "gpu01:1"]
    assert doc["unknown_jobs"] == [{"job_id": "9", "gpu": "gpu02:1", "idle_minutes": 33}]


def test_table_and_csv() -> None:
    report = idle_report(
        RULE,
        [IdleGpu("gpu01:0", "7", 2400, False), IdleGpu("gpu02:0", "8", 86400, True)],
        {"7": RunningJob("7", "alice", "vision", "vision", 4), "8": RunningJob("8", "bob", "nlp", "nlp", 1)},
    )
    table = idle_table(report)
    assert "below 10% utilisation for at least 30 min" in table
    assert "JOB  USER   ACCOUNT  PARTITION  GPUS  IDLE GPUS  MINUTES IDLE\n" in table
    assert "8    bob    nlp      nlp           1          1        >=1440\n" in table
    assert "7    alice  vision   vision        4          1            40\n" in table
    rows = list(csv.DictReader(io.StringIO(idle_csv(report))))
    assert [(r["job_id"], r["idle_minutes"], r["at_least"]) for r in rows] == [
        ("8", "1440", "True"),
        ("7", "40", "False"),
    ]
    empty = idle_table(idle_report(RULE, [], {}))
    assert "No running job has an idle GPU." in empty


def test_csv_cells_a_spreadsheet_would_run_stay_text() -> None:
    """Names starting with =, +, -, @, a tab or a carriage return get a leading `'`; numbers and other names not."""
    names = ['=HYPERLINK("http://x")', "+1", "-2+3", "@SUM(A1)", "\tx", "\rx", "alice", "a=b"]
    jobs = {str(i): RunningJob(str(i), name, "vision", name, 1) for i, name in enumerate(names)}
    report = idle_report(RULE, [IdleGpu(f"gpu01:{i}", str(i), 2400, False) for i in range(len(names))], jobs)
    rows = list(csv.DictReader(io.StringIO(idle_csv(report))))
    assert {r["user"] for r in rows} == {"'" + name for name in names[:6]} | {"alice", "a=b"}
    assert all(r["user"] == r["partition"] and r["gpus"] == "1" and r["idle_minutes"] == "40" for r in rows), rows


def read_back(names: Sequence[str]) -> dict[str, list[str]]:
    """The idle CSV of one job per name (its user and partition), read back with csv.reader: job id -> its cells."""
    jobs = {str(i): RunningJob(str(i), name, "vision", name, 1) for i, name in enumerate(names)}
    report = idle_report(RULE, [IdleGpu(f"gpu01:{i}", str(i), 2400, False) for i in range(len(names))], jobs)
    header, *rows = csv.reader(io.StringIO(idle_csv(report), newline=""))
    assert header == ["job_id", "user", "account", "partition", "gpus", "idle_gpus", "idle_minutes", "at_least"]
    return {row[0]: row for row in rows}


def test_csv_cells_that_could_break_a_row_are_quoted() -> None:
    """A CR, LF, quote or comma inside a cell is quoted on every Python (3.12.1's csv left a lone CR bare, which a
    reader takes for the row's end), so the cells come back as they went in."""
    names = ["a\rb", "a\r\nb", "a\nb", "a\r", 'say "hi"', "a,b", "", "alice"]
    rows = read_back(names)
    assert [(rows[str(i)][1], rows[str(i)][3]) for i in range(len(names))] == [(name, name) for name in names]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(), min_size=1, max_size=4))
def test_csv_reads_back_any_text(names: list[str]) -> None:
    rows = read_back(names)
    expected = ["'" + name if name.startswith(FORMULA_STARTS) else name for name in names]
    assert [rows[str(i)][1] for i in range(len(names))] == expected
