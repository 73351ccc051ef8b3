"""Slurm's accounting records as sacct prints them with `--parsable2 --delimiter=SEPARATOR` (no trailing one).

The playbook runs sacct with `TZ=UTC` and `SLURM_TIME_FORMAT=standard`, so every time is ISO 8601 in UTC
(`2024-05-01T10:00:00`), whatever the controller's own time zone is.
"""

from __future__ import annotations

import re
import secrets
from calendar import timegm
from dataclasses import dataclass
from time import strptime

from ..errors import GpuinfraError

# The order of sacct's --format, and so of each line's fields. JobIDRaw is the job's own number (an array task's
# too), the one the Slurm prolog writes into the DCGM job mapping and so the `hpc_job` label.
FIELDS: tuple[str, ...] = (
    "JobIDRaw",
    "JobID",
    "User",
    "Account",
    "Partition",
    "State",
    "Start",
    "End",
    "Elapsed",
    "AllocTRES",
)
FORMAT = ",".join(FIELDS)

# What sacct and squeue put between fields: `|` around 16 random hex digits, drawn anew by each gpuinfra process.
# Slurm takes `|` (and most else) in account, user and partition names, but no name can hold a string nobody
# knew before the run.
SEPARATOR = f"|{secrets.token_hex(8)}|"

# Values sacct prints for a time it does not know (a job not started yet, or still running).
_NO_TIME = frozenset({"", "Unknown", "None", "N/A"})
_ELAPSED = re.compile(
    r"^(?:(?P<days>[0-9]+)-)?(?:(?P<hours>[0-9]+):)?(?P<minutes>[0-9]+):(?P<seconds>[0-9]+)(?:\.[0-9]+)?$"
)
_GPU_TRES = re.compile(r"^gres/gpu(?::(?P<type>[^=]+))?$")


class ParseError(GpuinfraError):
    """Output of a Slurm command that does not have the shape asked for."""


@dataclass(frozen=True)
class JobRecord:
    """One job allocation from Slurm's accounting."""

    job_id: str
    """JobIDRaw: the job's own number."""
    job_label: str
    """JobID as users see it: `1234`, `1230_4` for an array task, `1240+1` for a heterogeneous component."""
    user: str
    account: str
    partition: str
    state: str
    start: int | None
    """Epoch seconds; None when the job has not started."""
    end: int | None
    """Epoch seconds; None while it runs."""
    elapsed_s: int | None
    """sacct's Elapsed, in seconds (up to now for a running job); None when sacct gives none."""
    gpus: int
    """GPUs allocated (gres/gpu of AllocTRES); 0 for a job that holds none or has not started."""


def parse_time(text: str) -> int | None:
    """`2024-05-01T10:00:00` (UTC) -> epoch seconds; None for Unknown, None and empty."""
    text = text.strip()
    if text in _NO_TIME:
        return None
    try:
        return timegm(strptime(text, "%Y-%m-%dT%H:%M:%S"))
    except ValueError as exc:
        raise ParseError(f"not a Slurm time: {text!r}") from exc


def parse_elapsed(text: str) -> int | None:
    """Slurm's `[days-][hours:]minutes:seconds` -> seconds: `1-02:03:04` is 93784. None for UNLIMITED, INVALID
    and empty."""
    match = _ELAPSED.match(text.strip())
    if match is None:
        if text.strip().upper() in ("", "UNLIMITED", "INVALID", "PARTITION_LIMIT", "N/A"):
            return None
        raise ParseError(f"not a Slurm elapsed time: {text!r}")
    parts = {key: int(value) if value else 0 for key, value in match.groupdict().items()}
    return ((parts["days"] * 24 + parts["hours"]) * 60 + parts["minutes"]) * 60 + parts["seconds"]


def gpus_of_tres(tres: str) -> int:
    """GPUs in a TRES string: `billing=2,cpu=2,gres/gpu=1,mem=1G,node=1` -> 1.

    With typed GPUs (`gres/gpu:l4=2`) Slurm lists the typed count beside the untyped total when both are tracked
    (AccountingStorageTRES=gres/gpu,gres/gpu:l4); the total wins, else the typed counts are added up.
    """
    total: int | None = None
    typed = 0
    for entry in tres.split(","):
        key, sep, value = entry.strip().partition("=")
        match = _GPU_TRES.match(key)
        if not sep or match is None:
            continue
        if not value.isdigit():
            raise ParseError(f"GPU count is not a number in TRES {tres!r}")
        if match["type"] is None:
            total = (total or 0) + int(value)
        else:
            typed += int(value)
    return total if total is not None else typed


def split_records(text: str, width: int, command: str) -> list[list[str]]:
    """Output of `width` fields per record, SEPARATOR between fields: the records, each a list of its fields.

    A record ends at the first newline after its last field: that field (a TRES string) and the next record's first
    (a job id) never hold one, so a name in between may hold anything, a newline or a `|` included."""
    tokens = text.rstrip("\n").split(SEPARATOR) if text.strip() else []
    records: list[list[str]] = []
    fields: list[str] = []
    for token in tokens:
        if len(fields) < width - 1:
            fields.append(token)
            continue
        last, newline, first = token.partition("\n")
        records.append([*fields, last])
        fields = [first] if newline else []
    if fields:
        raise ParseError(f"{command} record {len(records) + 1} has {len(fields)} fields, not {width}: {fields!r}")
    return records


def parse_sacct(text: str) -> list[JobRecord]:
    """Every record of `sacct --parsable2 --delimiter=SEPARATOR --noheader --format=FORMAT` output, in order."""
    records = []
    for fields in split_records(text, len(FIELDS), "sacct"):
        row = dict(zip(FIELDS, fields, strict=True))
        records.append(
            JobRecord(
                job_id=row["JobIDRaw"],
                job_label=row["JobID"],
                user=row["User"],
                account=row["Account"],
                partition=row["Partition"],
                state=row["State"],
                start=parse_time(row["Start"]),
                end=parse_time(row["End"]),
                elapsed_s=parse_elapsed(row["Elapsed"]),
                gpus=gpus_of_tres(row["AllocTRES"]),
            )
        )
    return records
