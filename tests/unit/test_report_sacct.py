"""Parsing Slurm's output for the reports: sacct --parsable2 (Slurm 22.05, as Debian 12 ships it) and squeue's
--Format with whole fields, both with the run's random separator; TRES strings and Elapsed times. The fixtures are
written with `|` and given the separator."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from gpuinfra.report.sacct import (
    FIELDS,
    FORMAT,
    SEPARATOR,
    JobRecord,
    ParseError,
    gpus_of_tres,
    parse_elapsed,
    parse_sacct,
)
from gpuinfra.report.squeue import FORMAT as SQUEUE_FORMAT
from gpuinfra.report.squeue import RunningJob, parse_squeue

# `TZ=UTC SLURM_TIME_FORMAT=standard sacct --allusers --allocations --parsable2 --noheader --format=FORMAT`
SACCT = """\
4101|4101|alice|vision|vision|COMPLETED|2024-05-01T10:00:00|2024-05-01T11:30:00|01:30:00|billing=2,cpu=2,gres/gpu=1,mem=1G,node=1
4102|4102|bob|nlp|nlp|RUNNING|2024-05-02T08:00:00|Unknown|1-02:03:04|billing=4,cpu=4,gres/gpu:l4=2,gres/gpu=2,mem=2G,node=1
4107|4105_2|alice|vision|scavenger|CANCELLED by 1001|2024-05-01T12:00:00|2024-05-01T12:05:30|00:05:30|billing=1,cpu=1,gres/gpu:l4=1,mem=1G,node=1
4110|4110|bob|nlp|nlp|PENDING|Unknown|Unknown|00:00:00|
4111|4111|carol|research|vision|FAILED|2024-05-01T09:00:00|2024-05-01T09:10:00|00:10:00|billing=1,cpu=1,mem=500M,node=1
4112|4112+0|alice|vision|vision|TIMEOUT|2024-04-30T22:00:00|2024-05-01T02:00:00|04:00:00|billing=16,cpu=16,gres/gpu=4,mem=64G,node=2
""".replace("|", SEPARATOR)  # noqa: E501 - sacct prints each job on one line, however long


def test_the_format_asks_for_the_fields_the_parser_reads() -> None:
    assert FORMAT.split(",") == list(FIELDS)
    assert FIELDS[0] == "JobIDRaw"


def test_sacct_lines_become_records() -> None:
    records = {r.job_id: r for r in parse_sacct(SACCT)}
    assert records["4101"] == JobRecord(
        "4101", "4101", "alice", "vision", "vision", "COMPLETED", 1714557600, 1714563000, 5400, 1
    )
    running = records["4102"]
    assert (running.end, running.elapsed_s, running.gpus) == (None, 93784, 2)
    array_task = records["4107"]
    assert (array_task.job_label, array_task.state, array_task.gpus) == ("4105_2", "CANCELLED by 1001", 1)
    assert (records["4110"].start, records["4110"].gpus) == (None, 0)
    assert records["4111"].gpus == 0
    assert (records["4112"].job_label, records["4112"].gpus, records["4112"].elapsed_s) == ("4112+0", 4, 14400)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("00:00:00", 0), ("05:30", 330), ("01:30:00", 5400), ("1-02:03:04", 93784), ("123-00:00:01", 123 * 86400 + 1),
     ("00:01.500", 1), ("UNLIMITED", None), ("", None)],
)  # fmt: skip
def test_elapsed_times(text: str, seconds: int | None) -> None:
    assert parse_elapsed(text) == seconds


@pytest.mark.parametrize(
    ("tres", "gpus"),
    [("billing=2,cpu=2,gres/gpu=1,mem=1G,node=1", 1), ("cpu=4,gres/gpu:l4=2,gres/gpu=2,mem=2G", 2),
     ("cpu=4,gres/gpu:a100=2,gres/gpu:h100=1,node=2", 3), ("cpu=1,mem=1G,node=1", 0), ("", 0),
     ("cpu=1,gres/gpumem=40G,gres/gpu=1", 1)],
)  # fmt: skip
def test_gpus_of_a_tres_string(tres: str, gpus: int) -> None:
    assert gpus_of_tres(tres) == gpus


@pytest.mark.parametrize(
    ("text", "problem"),
    [("4101|4101|alice|vision\n", "sacct record 1 has 4 fields, not 10"),
     ("1|1|a|b|c|COMPLETED|yesterday|Unknown|00:01:00|gres/gpu=1\n", "not a Slurm time: 'yesterday'"),
     ("1|1|a|b|c|COMPLETED|Unknown|Unknown|an hour|gres/gpu=1\n", "not a Slurm elapsed time"),
     ("1|1|a|b|c|COMPLETED|Unknown|Unknown|00:01:00|gres/gpu=two\n", "GPU count is not a number")],
)  # fmt: skip
def test_malformed_output_is_refused_with_the_reason(text: str, problem: str) -> None:
    with pytest.raises(ParseError, match=problem.replace("(", r"\(")):
        parse_sacct(text.replace("|", SEPARATOR))


# `squeue --all --noheader --states=RUNNING --Format=SQUEUE_FORMAT`: every field whole, the separator after each but
# the last.
SQUEUE = """\
4102|bob|nlp|nlp|cpu=4,mem=2G,node=1,billing=4,gres/gpu=2
4120|alice|vision|vision|cpu=1,mem=1G,node=1,billing=1,gres/gpu=1
4121|carol|research|scavenger|cpu=1,mem=1G,node=1,billing=1
""".replace("|", SEPARATOR)


def test_squeue_lines_become_running_jobs() -> None:
    names = ("JobID", "UserName", "Account", "Partition")
    assert SQUEUE_FORMAT.split(",") == [*(f"{name}:0{SEPARATOR}" for name in names), "tres-alloc:0"]
    jobs = parse_squeue(SQUEUE)
    assert jobs["4102"] == RunningJob("4102", "bob", "nlp", "nlp", 2)
    assert (jobs["4120"].gpus, jobs["4121"].gpus) == (1, 0)
    with pytest.raises(ParseError, match="squeue record 1 has 3 fields"):
        parse_squeue(f"1{SEPARATOR}alice{SEPARATOR}vision\n")


# Names Slurm accepts that a `|` split, a line split or a spreadsheet would misread.
HOSTILE = ("=cmd|' /C calc'!A0", "a|b\nc", "p||q")


def test_any_name_is_read_whole() -> None:
    u, a, p = HOSTILE
    records = parse_sacct(
        SEPARATOR.join(["7", "7", u, a, p, "COMPLETED", "2024-05-01T10:00:00", "2024-05-01T11:00:00", "01:00:00",
                        "gres/gpu=1"]) + "\n"
        + SEPARATOR.join(["8", "8", "bob", a, p, "PENDING", "Unknown", "Unknown", "00:00:00", ""]) + "\n"
        + SEPARATOR.join(["9", "9", "carol", "nlp", "nlp", "RUNNING", "2024-05-01T10:00:00", "Unknown", "00:10:00",
                          "gres/gpu=2"]) + "\n"
    )  # fmt: skip
    assert [(r.job_id, r.user, r.account, r.partition, r.gpus) for r in records] == [
        ("7", u, a, p, 1), ("8", "bob", a, p, 0), ("9", "carol", "nlp", "nlp", 2)
    ]  # fmt: skip
    running = parse_squeue(SEPARATOR.join(["7", u, a, p, "cpu=1,gres/gpu=1"]) + "\n")
    assert running["7"] == RunningJob("7", u, a, p, 1)


def test_each_process_draws_its_own_separator() -> None:
    assert re.fullmatch(r"\|[0-9a-f]{16}\|", SEPARATOR)
    code = "from gpuinfra.report.sacct import SEPARATOR; print(SEPARATOR)"
    drawn = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
             for _ in range(2)}  # fmt: skip
    assert len(drawn | {SEPARATOR + "\n"}) == 3
