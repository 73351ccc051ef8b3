"""Running jobs whose GPUs have been idle for a while, by the rule of the `GpuIdleWhileAllocated` alert.

The alert (roles/prometheus/templates/gpuinfra.rules.yml.j2) is `DCGM_FI_DEV_GPU_UTIL{hpc_job!=""} < idle_util_pct`
with `for: idle_for`: Prometheus evaluates the expression once per evaluation interval, a GPU's alert turns
pending at the first evaluation where its series is below the threshold, and fires once it has been returned by
every evaluation since for at least `idle_for`; one evaluation at or above the threshold, or without the series
(the job ended, the exporter is down), resets it.

The report evaluates that same expression at every step of a range query, one step per evaluation interval (the
cluster's scrape_interval), and walks each GPU's points back from the last step: the run of consecutive steps
below the threshold that reaches the last step is how long the GPU has been idle. A GPU counts as idle when that
run is at least `idle_for` long, when the alert would be firing. The only difference is the phase: the steps
fall on multiples of the interval, the rule's evaluations wherever Prometheus started the group, so the two can
disagree for less than one interval.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .prometheus import JOB_LABEL, Series
from .squeue import RunningJob

# How far back the report looks for the start of an idle run; a run that reaches it is reported as "at least".
LOOKBACK_S = 24 * 3600
# Prometheus answers at most 11,000 points per series; stay under it by widening the step for long lookbacks.
MAX_POINTS = 10_000


@dataclass(frozen=True)
class IdleRule:
    threshold_pct: float
    """monitoring.alerts.idle_util_pct: below it a GPU is idle."""
    for_s: int
    """monitoring.alerts.idle_for, in seconds."""
    step_s: int
    """The rule evaluation interval (monitoring.scrape_interval), in seconds."""

    def query_step_s(self) -> int:
        """The range query's step: the evaluation interval, wider only where the lookback would need more points
        than Prometheus answers."""
        return max(self.step_s, -(-self._wanted_lookback_s() // MAX_POINTS))

    def lookback_s(self) -> int:
        """How far back the range query starts: at least `for_s` plus a step, a whole number of steps."""
        step = self.query_step_s()
        return -(-self._wanted_lookback_s() // step) * step

    def _wanted_lookback_s(self) -> int:
        return max(self.for_s + self.step_s, LOOKBACK_S)


@dataclass(frozen=True)
class IdleGpu:
    gpu: str
    """`instance:gpu`, the exporter's host and the GPU's index."""
    job_id: str
    idle_s: int
    at_least: bool
    """The run reaches the start of the lookback: the GPU has been idle for longer than `idle_s`."""


def gpu_name(labels: Mapping[str, str]) -> str:
    host = labels.get("instance") or labels.get("Hostname") or "?"
    return f"{host}:{labels.get('gpu', labels.get('UUID', '?'))}"


def idle_run(series: Series, threshold: float, start: int, end: int, step: int) -> tuple[int, bool] | None:
    """How long `series` has been below `threshold` at every step up to the last one (`end`), and whether the run
    reaches the first step (`start`); None when it is not below the threshold at the last step, or absent there."""
    steps = list(range(start, end + 1, step))
    if not steps:
        return None
    first_idle: int | None = None
    for ts in reversed(steps):
        value = series.points.get(ts * 1000)
        if value is None or not value < threshold:
            break
        first_idle = ts
    if first_idle is None:
        return None
    return steps[-1] - first_idle, first_idle == steps[0]


def idle_gpus(series: Iterable[Series], rule: IdleRule, start: int, end: int) -> list[IdleGpu]:
    """Every GPU whose alert would be firing at `end`, from the range query `prometheus.idle_query` answered."""
    step = rule.query_step_s()
    out = []
    for one in series:
        run = idle_run(one, rule.threshold_pct, start, end, step)
        if run is None or run[0] < rule.for_s:
            continue
        out.append(IdleGpu(gpu_name(one.labels), one.labels.get(JOB_LABEL, ""), run[0], run[1]))
    return sorted(out, key=lambda g: (g.job_id, g.gpu))


@dataclass(frozen=True)
class IdleJob:
    job: RunningJob
    gpus: list[IdleGpu]

    @property
    def idle_minutes(self) -> int:
        """How long every listed GPU of the job has been idle: the shortest of their runs."""
        return min(g.idle_s for g in self.gpus) // 60

    @property
    def at_least(self) -> bool:
        return all(g.at_least for g in self.gpus)

    def as_dict(self) -> dict[str, Any]:
        return {
            **self.job.as_dict(),
            "idle_gpus": len(self.gpus),
            "idle_gpu_names": [g.gpu for g in self.gpus],
            "idle_minutes": self.idle_minutes,
            "idle_minutes_at_least": self.at_least,
        }


@dataclass(frozen=True)
class IdleReport:
    rule: IdleRule
    jobs: list[IdleJob]
    unknown: list[IdleGpu] = field(default_factory=list)
    """Idle GPUs labelled with a job that Slurm does not list as running (a job mapping file left behind)."""

    def as_dict(self) -> dict[str, Any]:
        return {
            "rule": {
                "expr": f'DCGM_FI_DEV_GPU_UTIL{{{JOB_LABEL}!=""}} < {self.rule.threshold_pct:g}',
                "idle_util_pct": self.rule.threshold_pct,
                "idle_for_s": self.rule.for_s,
                "evaluation_interval_s": self.rule.step_s,
            },
            "jobs": [job.as_dict() for job in self.jobs],
            "unknown_jobs": [{"job_id": g.job_id, "gpu": g.gpu, "idle_minutes": g.idle_s // 60} for g in self.unknown],
        }


def idle_report(rule: IdleRule, gpus: Iterable[IdleGpu], running: Mapping[str, RunningJob]) -> IdleReport:
    """Idle GPUs joined with Slurm's running jobs by job id; most idle GPUs first, then longest idle."""
    by_job: dict[str, list[IdleGpu]] = {}
    unknown = []
    for gpu in gpus:
        if gpu.job_id in running:
            by_job.setdefault(gpu.job_id, []).append(gpu)
        else:
            unknown.append(gpu)
    jobs = [IdleJob(running[job_id], found) for job_id, found in by_job.items()]
    jobs.sort(key=lambda j: (-len(j.gpus), -j.idle_minutes, j.job.job_id))
    return IdleReport(rule, jobs, unknown)
