"""GPU-hours per account, user and partition, with the mean utilisation and memory use of those GPUs where the
cluster collects DCGM metrics.

Clipping to the window is computed here, not by sacct's --truncate: a job's GPU time in the window is its GPU
count times the overlap of [Start, End] (End = the window's end while it runs) with the window, never more than
sacct's own Elapsed (which leaves out time the job spent suspended). A job wholly inside the window counts exactly
sacct's Elapsed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .sacct import JobRecord
from .time_range import TimeRange, iso

NO_JOB_METRICS = "n/a (no GPU metrics for this job)"
NO_GROUP_METRICS = "n/a (no GPU metrics for these jobs)"


@dataclass(frozen=True)
class JobMetrics:
    """Sums and counts of a job's GPU samples in the window (all its GPUs together)."""

    util_sum: float = 0.0
    util_count: float = 0.0
    fb_sum: float = 0.0
    fb_count: float = 0.0

    @property
    def util_pct(self) -> float | None:
        return self.util_sum / self.util_count if self.util_count else None

    @property
    def fb_used_mib(self) -> float | None:
        return self.fb_sum / self.fb_count if self.fb_count else None


def job_metrics(totals: Mapping[str, Mapping[str, float]]) -> dict[str, JobMetrics]:
    """Per job id, from the four per-job totals of `prometheus.usage_queries` keyed by query name."""
    from .prometheus import FB_USED, UTIL

    names = {
        "util_sum": f"{UTIL}:sum_over_time",
        "util_count": f"{UTIL}:count_over_time",
        "fb_sum": f"{FB_USED}:sum_over_time",
        "fb_count": f"{FB_USED}:count_over_time",
    }
    jobs = {job for name in names.values() for job in totals.get(name, {})}
    return {
        job: JobMetrics(**{attr: float(totals.get(name, {}).get(job, 0.0)) for attr, name in names.items()})
        for job in jobs
        if job
    }


@dataclass(frozen=True)
class JobUsage:
    record: JobRecord
    gpu_seconds: int
    clipped: bool
    """The job ran partly outside the window, so only its part inside counts."""
    metrics: JobMetrics | None
    """None: no GPU sample of this job in the window (or metrics are not collected at all)."""

    @property
    def util_pct(self) -> float | None:
        return self.metrics.util_pct if self.metrics else None

    @property
    def fb_used_mib(self) -> float | None:
        return self.metrics.fb_used_mib if self.metrics else None

    def as_dict(self, not_collected: str | None) -> dict[str, Any]:
        r = self.record
        util, fb = self.util_pct, self.fb_used_mib
        return {
            "job_id": r.job_id,
            "job": r.job_label,
            "user": r.user,
            "account": r.account,
            "partition": r.partition,
            "state": r.state,
            "gpus": r.gpus,
            "start": iso(r.start) if r.start is not None else None,
            "end": iso(r.end) if r.end is not None else None,
            "clipped": self.clipped,
            "gpu_seconds": self.gpu_seconds,
            "gpu_hours": hours(self.gpu_seconds),
            "mean_util_pct": _round(util),
            "mean_fb_used_mib": _round(fb),
            "util_samples": int(self.metrics.util_count) if self.metrics else 0,
            "util_note": not_collected or (NO_JOB_METRICS if util is None else None),
        }


def clip(record: JobRecord, window: TimeRange) -> tuple[int, bool]:
    """GPU-seconds of `record` inside `window`, and whether the window cut part of the job off."""
    if record.gpus <= 0 or record.start is None:
        return 0, False
    running = record.end is None
    end = window.until if record.end is None else record.end
    overlap = max(0, min(end, window.until) - max(record.start, window.since))
    inside = not running and record.start >= window.since and end <= window.until
    if record.elapsed_s is None:
        seconds = overlap
    elif inside:
        seconds = record.elapsed_s
    else:
        seconds = min(overlap, record.elapsed_s)
    clipped = record.start < window.since or end > window.until or (running and (record.elapsed_s or 0) > overlap)
    return record.gpus * seconds, clipped


@dataclass
class GroupUsage:
    name: str
    jobs: int = 0
    gpu_seconds: int = 0
    measured_seconds: int = 0
    """GPU-seconds of the jobs that have GPU metrics: the weight of the means."""
    _util_weighted: float = 0.0
    _fb_weighted: float = 0.0
    _fb_seconds: int = 0

    def add(self, job: JobUsage) -> None:
        self.jobs += 1
        self.gpu_seconds += job.gpu_seconds
        if job.util_pct is not None:
            self.measured_seconds += job.gpu_seconds
            self._util_weighted += job.util_pct * job.gpu_seconds
        if job.fb_used_mib is not None:
            self._fb_seconds += job.gpu_seconds
            self._fb_weighted += job.fb_used_mib * job.gpu_seconds

    @property
    def mean_util_pct(self) -> float | None:
        return self._util_weighted / self.measured_seconds if self.measured_seconds else None

    @property
    def mean_fb_used_mib(self) -> float | None:
        return self._fb_weighted / self._fb_seconds if self._fb_seconds else None

    def as_dict(self, key: str, not_collected: str | None) -> dict[str, Any]:
        util = self.mean_util_pct
        return {
            key: self.name,
            "jobs": self.jobs,
            "gpu_seconds": self.gpu_seconds,
            "gpu_hours": hours(self.gpu_seconds),
            "gpu_hours_measured": hours(self.measured_seconds),
            "mean_util_pct": _round(util),
            "mean_fb_used_mib": _round(self.mean_fb_used_mib),
            "util_note": not_collected or (NO_GROUP_METRICS if util is None else None),
        }


GROUPINGS: tuple[tuple[str, str, Callable[[JobRecord], str]], ...] = (
    ("by_account", "account", lambda r: r.account),
    ("by_user", "user", lambda r: r.user),
    ("by_partition", "partition", lambda r: r.partition),
)


@dataclass(frozen=True)
class UsageReport:
    window: TimeRange
    jobs: list[JobUsage]
    not_collected: str | None
    """Why utilisation is not reported at all (no Prometheus or no DCGM exporter in the cluster, or the query
    failed); None when it is collected, and then a job without samples says so itself."""
    errors: list[str] = field(default_factory=list)

    def groups(self, key: str) -> list[GroupUsage]:
        getter = next(get for name, _, get in GROUPINGS if name == key)
        found: dict[str, GroupUsage] = {}
        for job in self.jobs:
            name = getter(job.record)
            found.setdefault(name, GroupUsage(name)).add(job)
        return sorted(found.values(), key=lambda g: (-g.gpu_seconds, g.name))

    def total(self) -> GroupUsage:
        total = GroupUsage("total")
        for job in self.jobs:
            total.add(job)
        return total

    def as_dict(self) -> dict[str, Any]:
        return {
            "window": self.window.as_dict(),
            "utilisation": {"collected": self.not_collected is None, "reason": self.not_collected},
            "total": self.total().as_dict("name", self.not_collected),
            **{name: [g.as_dict(key, self.not_collected) for g in self.groups(name)] for name, key, _ in GROUPINGS},
            "jobs": [job.as_dict(self.not_collected) for job in self.jobs],
            "errors": self.errors,
        }


def usage_report(
    records: Iterable[JobRecord],
    window: TimeRange,
    metrics: Mapping[str, JobMetrics] | None,
    not_collected: str | None = None,
    errors: Iterable[str] = (),
) -> UsageReport:
    """The report of `records` in `window`: jobs that held GPUs inside it, joined with their metrics by job id.
    `metrics` None means utilisation is not known at all, for the reason `not_collected`."""
    if metrics is None and not_collected is None:
        raise ValueError("give the metrics, or the reason there are none")
    jobs = []
    for record in records:
        seconds, clipped = clip(record, window)
        if seconds <= 0:
            continue
        found = metrics.get(record.job_id) if metrics is not None else None
        jobs.append(JobUsage(record, seconds, clipped, found if found and found.util_count else None))
    return UsageReport(window, jobs, None if metrics is not None else not_collected, list(errors))


def hours(seconds: int) -> float:
    return round(seconds / 3600, 4)


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)
