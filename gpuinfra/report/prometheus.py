"""The PromQL the reports send, and the reading of Prometheus's HTTP API answers.

Queries are built here and handed to playbooks/report.yml finished: the playbook POSTs each one's `params` as a
form to `/api/v1/<path>` on the monitoring host and passes the JSON answer back untouched. The DCGM exporter
labels an allocated GPU's series with `hpc_job`, the Slurm job id the prolog writes into the job mapping (the
same label the `gpu-usage` dashboard and the `GpuIdleWhileAllocated` alert select on).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import GpuinfraError
from .time_range import TimeRange

UTIL = "DCGM_FI_DEV_GPU_UTIL"
"""GPU utilisation, percent."""
FB_USED = "DCGM_FI_DEV_FB_USED"
"""Framebuffer memory used, MiB."""
JOB_LABEL = "hpc_job"
ALLOCATED = f'{JOB_LABEL}!=""'


class PrometheusError(GpuinfraError):
    """Prometheus refused a query or answered something else than its API's JSON."""


@dataclass(frozen=True)
class Query:
    name: str
    path: str
    """`query` or `query_range`, under /api/v1/."""
    params: dict[str, str] = field(default_factory=dict)
    """Form fields of the POST: `query`, and `time` or `start`, `end`, `step`."""

    def as_var(self) -> dict[str, Any]:
        return {"name": self.name, "path": self.path, "params": dict(self.params)}


def usage_queries(window: TimeRange) -> list[Query]:
    """Per job: the sum and the count of the samples of GPU utilisation and of memory used, over all its GPUs, in
    `window` (a `TimeRange.chunked()` one).

    Each is a range query of one point per `step_s` piece of the window, the piece's sum (or count) up to that
    point; summing the points gives the whole window's. Each piece's range is 1 ms shorter than the step, since
    Prometheus 2 takes a range with both ends: consecutive pieces then never count a sample twice. sum / count is
    the mean over every (GPU, sample) pair, so a GPU-time weighted mean across the job's GPUs.
    """
    step = window.step_s
    params = {"start": str(window.since + step), "end": str(window.until), "step": str(step)}
    selector = f"[{step * 1000 - 1}ms]"
    return [
        Query(
            f"{metric}:{fn}",
            "query_range",
            {"query": f"sum by ({JOB_LABEL}) ({fn}({metric}{{{ALLOCATED}}}{selector}))", **params},
        )
        for metric in (UTIL, FB_USED)
        for fn in ("sum_over_time", "count_over_time")
    ]


def idle_query(end: int, lookback_s: int, step_s: int) -> Query:
    """Every allocated GPU's utilisation at each step of the last `lookback_s` seconds: the instant value the alert
    rule's expression compares, evaluated the way the rule is, once per evaluation interval."""
    return Query(
        "idle",
        "query_range",
        {"query": f"{UTIL}{{{ALLOCATED}}}", "start": str(end - lookback_s), "end": str(end), "step": str(step_s)},
    )


def _data(answer: Mapping[str, Any], kind: str) -> list[Mapping[str, Any]]:
    if answer.get("status") != "success":
        error = answer.get("error") or "no answer"
        raise PrometheusError(f"{answer.get('errorType') or 'error'}: {error}")
    data = answer.get("data") or {}
    if data.get("resultType") != kind:
        raise PrometheusError(f"expected a {kind}, got {data.get('resultType')!r}")
    result = data.get("result")
    if not isinstance(result, list):
        raise PrometheusError("the answer has no result list")
    return result


def matrix_totals(answer: Mapping[str, Any], label: str = JOB_LABEL) -> dict[str, float]:
    """A range query's answer, each series' points added up, by the value of `label`."""
    totals: dict[str, float] = {}
    for series in _data(answer, "matrix"):
        key = str((series.get("metric") or {}).get(label, ""))
        totals[key] = totals.get(key, 0.0) + sum(float(value) for _, value in series.get("values") or [])
    return totals


@dataclass(frozen=True)
class Series:
    labels: dict[str, str]
    points: dict[int, float]
    """Value by timestamp in milliseconds."""


def matrix_series(answer: Mapping[str, Any]) -> list[Series]:
    """A range query's answer as series with their points keyed by millisecond timestamps."""
    return [
        Series(
            {str(k): str(v) for k, v in (series.get("metric") or {}).items()},
            {round(float(ts) * 1000): float(value) for ts, value in series.get("values") or []},
        )
        for series in _data(answer, "matrix")
    ]
