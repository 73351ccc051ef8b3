"""The two reports as library calls: read the cluster through playbooks/report.yml, and build the report.

Each raises Refused for a cluster that lacks what it reads, ReportError when the cluster could not be read (a host
unreachable, a command or a Prometheus query that failed, output that does not parse), and Cancelled when
interrupted. A failed utilisation query does not lose the usage report: it says why utilisation is missing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import Refused
from ..model.grammar import duration_seconds
from ..model.monitoring import Monitoring
from ..validate.load import LoadedCluster
from .collect import ReportError, collect
from .idle import IdleReport, IdleRule, idle_gpus, idle_report
from .prometheus import PrometheusError, idle_query, matrix_series, matrix_totals, usage_queries
from .sacct import ParseError, parse_sacct
from .squeue import parse_squeue
from .time_range import window
from .usage import UsageReport, job_metrics, usage_report


def metrics_missing(monitoring: Monitoring) -> str | None:
    """Why the cluster has no per-job GPU metrics (`monitoring.components has no ...`), or None when it collects
    them: Prometheus, and the DCGM exporter whose job mapping labels each allocated GPU."""
    missing = [c for c in ("prometheus", "dcgm_exporter") if c not in monitoring.components]
    return f"monitoring.components has no {' and no '.join(missing)}" if missing else None


def _require_slurm(loaded: LoadedCluster) -> None:
    if loaded.model.slurm is None:
        raise Refused(f"cluster {loaded.model.name!r} has no Slurm (slurm:), which this report reads")


def usage(
    loaded: LoadedCluster, since: str, until: str | None, now: int, extra_vars: Mapping[str, Any] | None = None
) -> UsageReport:
    """GPU-hours per account, user and partition in the window, with utilisation where the cluster collects it.
    Prometheus's refusals are in the report's `errors`."""
    _require_slurm(loaded)
    try:
        span = window(since, until, now)
    except ValueError as exc:
        raise Refused(str(exc)) from None
    missing = metrics_missing(loaded.model.monitoring)
    queries = usage_queries(span) if missing is None else []
    collected = collect(loaded, "sacct", queries, span, extra_vars)
    try:
        records = parse_sacct(collected.slurm or "")
    except ParseError as exc:
        raise ReportError(str(exc)) from None
    errors = [answer.error for answer in collected.answers if answer.error]
    if missing is not None:
        return usage_report(records, span, None, f"not collected ({missing})")
    if not errors:
        try:
            metrics = job_metrics({a.query.name: matrix_totals(a.body) for a in collected.answers})
            return usage_report(records, span, metrics)
        except PrometheusError as exc:
            errors.append(f"Prometheus: {exc}")
    return usage_report(records, span, None, "n/a (the Prometheus query failed)", errors)


def idle(loaded: LoadedCluster, now: int, extra_vars: Mapping[str, Any] | None = None) -> IdleReport:
    """Running jobs whose GPUs stayed below the idle threshold for the idle time, by the GpuIdleWhileAllocated
    alert's rule."""
    _require_slurm(loaded)
    monitoring = loaded.model.monitoring
    missing = metrics_missing(monitoring)
    if missing is not None:
        raise Refused(f"cluster {loaded.model.name!r} does not collect GPU utilisation per job ({missing})")
    alerts = monitoring.alerts
    rule = IdleRule(
        float(alerts.idle_util_pct), duration_seconds(alerts.idle_for), duration_seconds(monitoring.scrape_interval)
    )
    start = now - rule.lookback_s()
    query = idle_query(now, rule.lookback_s(), rule.query_step_s())
    collected = collect(loaded, "squeue", [query], extra_vars=extra_vars)
    [answer] = collected.answers
    try:
        running = parse_squeue(collected.slurm or "")
        if answer.error:
            raise ReportError(answer.error)
        series = matrix_series(answer.body)
    except ParseError as exc:
        raise ReportError(str(exc)) from None
    except PrometheusError as exc:
        raise ReportError(f"Prometheus: {exc}") from None
    return idle_report(rule, idle_gpus(series, rule, start, now), running)
