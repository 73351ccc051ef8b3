"""The time window a usage report covers: `--since 30d` (a duration back from now) or a date and time (UTC unless
it names its offset), up to `--until` (default now)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime

from ..model.grammar import duration_seconds

# Prometheus sums a window in pieces of at most this length, so that no query loads more than a day of samples.
CHUNK_S = 86400


@dataclass(frozen=True)
class TimeRange:
    since: int
    """Epoch seconds, inclusive."""
    until: int
    """Epoch seconds."""

    @property
    def seconds(self) -> int:
        return self.until - self.since

    @property
    def step_s(self) -> int:
        """Length of each of the equal pieces Prometheus sums the window in (see `chunked`)."""
        pieces = max(1, math.ceil(self.seconds / CHUNK_S))
        return max(1, self.seconds // pieces)

    def chunked(self) -> TimeRange:
        """The same window, started up to a few seconds earlier so that it is a whole number of `step_s` pieces,
        none longer than CHUNK_S: the report's sacct and Prometheus numbers then cover exactly the same time."""
        pieces = max(1, math.ceil(self.seconds / CHUNK_S))
        step = math.ceil(self.seconds / pieces)
        return TimeRange(self.until - pieces * step, self.until)

    def as_dict(self) -> dict[str, object]:
        return {"since": iso(self.since), "until": iso(self.until), "seconds": self.seconds}


def iso(epoch: int) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def sacct_time(epoch: int) -> str:
    """sacct's --starttime/--endtime form, read in UTC (the playbook runs sacct with TZ=UTC)."""
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%S")


def parse_when(text: str, now: int) -> int:
    """`30d`, `12h` (that long before `now`), `2024-05-01` or `2024-05-01T10:00:00` (UTC unless it carries an
    offset such as `+02:00`) -> epoch seconds. Raises ValueError with the forms it takes."""
    text = text.strip()
    try:
        return now - int(duration_seconds(text))
    except ValueError:
        pass
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(
            f"{text!r} is neither a duration (30d, 12h) nor a date and time (2024-05-01T10:00:00)"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return int(when.timestamp())


def window(since: str, until: str | None, now: int) -> TimeRange:
    start = parse_when(since, now)
    end = parse_when(until, now) if until else now
    if end > now:
        raise ValueError("--until is in the future")
    if start >= end:
        raise ValueError(f"the window is empty: {iso(start)} is not before {iso(end)}")
    return TimeRange(start, end).chunked()
