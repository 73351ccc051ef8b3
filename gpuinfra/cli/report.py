"""`gpuinfra report usage|idle FILE`: what the cluster's GPUs were used for, read from Slurm and Prometheus.

`usage --since 30d`: GPU-hours per account, user and partition from Slurm's accounting, with the mean GPU
utilisation and memory used of those GPUs where the cluster collects DCGM metrics (prometheus and dcgm_exporter
in monitoring.components). `idle`: running jobs whose GPUs have stayed below monitoring.alerts.idle_util_pct for
monitoring.alerts.idle_for, by the rule of the GpuIdleWhileAllocated alert. Nothing is changed or cancelled: the
alert already routes idle GPUs to Alertmanager's receivers, so the report only lists them.

Exit codes: 0 the report is complete; 1 the cluster could not be read, or a Prometheus query failed (the rest of
the report is still printed); 3 invalid input, or a cluster that lacks what the report reads (Slurm; for idle,
Prometheus with the DCGM exporter).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from ..model.grammar import duration_seconds
from ..model.monitoring import Monitoring
from ..report import render
from ..report.collect import Cancelled, ReportError, collect
from ..report.idle import IdleRule, idle_gpus, idle_report
from ..report.prometheus import PrometheusError, idle_query, matrix_series, matrix_totals, usage_queries
from ..report.sacct import ParseError, parse_sacct
from ..report.squeue import parse_squeue
from ..report.usage import job_metrics, usage_report
from ..report.window import window
from ..validate.load import LoadedCluster
from . import exitcodes
from .common import DEFAULT_CLUSTER, add_extra_vars, load_or_report, parse_extra_vars, print_json


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("report", help="GPU usage per account/user/partition, and idle GPUs (Slurm)")
    reports = parser.add_subparsers(dest="report", required=True, metavar="REPORT")

    usage = reports.add_parser("usage", help="GPU-hours per account, user and partition, with GPU utilisation")
    _common(usage)
    usage.add_argument(
        "--since", default="30d", metavar="WHEN", help="start: a duration back from now (30d, 12h) or a UTC date"
    )
    usage.add_argument("--until", metavar="WHEN", help="end: a duration back from now or a UTC date (default: now)")
    usage.set_defaults(func=run_usage)

    idle = reports.add_parser("idle", help="running jobs whose GPUs stay idle (the GpuIdleWhileAllocated rule)")
    _common(idle)
    idle.set_defaults(func=run_idle)


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", nargs="?", default=DEFAULT_CLUSTER, metavar="FILE", help="cluster file")
    add_extra_vars(parser)
    formats = parser.add_mutually_exclusive_group()
    formats.add_argument("--json", action="store_true", help="print machine-readable JSON on stdout")
    formats.add_argument("--csv", action="store_true", help="print CSV on stdout")


def _fail(args: argparse.Namespace, code: int, message: str) -> int:
    print(f"gpuinfra report {args.report}: {message}", file=sys.stderr)
    if args.json:
        print_json(
            {"status": "failed" if code == exitcodes.FAILED else "invalid", "errors": [message], "exit_code": code}
        )
    return code


def _prepare(args: argparse.Namespace) -> tuple[LoadedCluster, dict[str, Any]] | int:
    loaded = load_or_report(args.file, args.json)
    if loaded is None:
        return exitcodes.INVALID_INPUT
    try:
        extra = parse_extra_vars(args.extra_vars)
    except (OSError, ValueError) as exc:
        return _fail(args, exitcodes.INVALID_INPUT, f"--extra-vars: {exc}")
    if loaded.model.slurm is None:
        return _fail(
            args,
            exitcodes.INVALID_INPUT,
            f"cluster {loaded.model.name!r} has no Slurm (slurm:), which this report reads",
        )
    return loaded, extra


def metrics_missing(monitoring: Monitoring) -> str | None:
    """Why the cluster has no per-job GPU metrics (`monitoring.components has no ...`), or None when it collects
    them: Prometheus, and the DCGM exporter whose job mapping labels each allocated GPU."""
    missing = [c for c in ("prometheus", "dcgm_exporter") if c not in monitoring.components]
    return f"monitoring.components has no {' and no '.join(missing)}" if missing else None


def run_usage(args: argparse.Namespace) -> int:
    prepared = _prepare(args)
    if isinstance(prepared, int):
        return prepared
    loaded, extra = prepared
    try:
        span = window(args.since, args.until, int(time.time()))
    except ValueError as exc:
        return _fail(args, exitcodes.INVALID_INPUT, str(exc))
    missing = metrics_missing(loaded.model.monitoring)
    not_collected = f"not collected ({missing})" if missing else None
    queries = usage_queries(span) if missing is None else []
    try:
        collected = collect(loaded, "sacct", queries, span, extra)
        records = parse_sacct(collected.slurm or "")
    except Cancelled:
        return _fail(args, exitcodes.CANCELLED, "interrupted")
    except (ReportError, ParseError) as exc:
        return _fail(args, exitcodes.FAILED, str(exc))

    errors = [answer.error for answer in collected.answers if answer.error]
    metrics = None
    if queries and not errors:
        try:
            metrics = job_metrics({a.query.name: matrix_totals(a.body) for a in collected.answers})
        except PrometheusError as exc:
            errors.append(f"Prometheus: {exc}")
    if errors:
        not_collected = "n/a (the Prometheus query failed)"
    report = usage_report(records, span, metrics, not_collected, errors)
    code = exitcodes.FAILED if errors else exitcodes.OK
    if args.json:
        print_json({**report.as_dict(), "exit_code": code})
    elif args.csv:
        sys.stdout.write(render.usage_csv(report))
    else:
        sys.stdout.write(render.usage_table(report))
    for error in errors if args.csv or args.json else []:
        print(f"gpuinfra report usage: {error}", file=sys.stderr)
    return code


def run_idle(args: argparse.Namespace) -> int:
    prepared = _prepare(args)
    if isinstance(prepared, int):
        return prepared
    loaded, extra = prepared
    monitoring = loaded.model.monitoring
    missing = metrics_missing(monitoring)
    if missing is not None:
        return _fail(
            args,
            exitcodes.INVALID_INPUT,
            f"cluster {loaded.model.name!r} does not collect GPU utilisation per job ({missing})",
        )
    alerts = monitoring.alerts
    rule = IdleRule(
        float(alerts.idle_util_pct), duration_seconds(alerts.idle_for), duration_seconds(monitoring.scrape_interval)
    )
    end = int(time.time())
    start = end - rule.lookback_s()
    query = idle_query(end, rule.lookback_s(), rule.query_step_s())
    try:
        collected = collect(loaded, "squeue", [query], extra_vars=extra)
        running = parse_squeue(collected.slurm or "")
    except Cancelled:
        return _fail(args, exitcodes.CANCELLED, "interrupted")
    except (ReportError, ParseError) as exc:
        return _fail(args, exitcodes.FAILED, str(exc))
    [answer] = collected.answers
    if answer.error:
        return _fail(args, exitcodes.FAILED, answer.error)
    try:
        series = matrix_series(answer.body)
    except PrometheusError as exc:
        return _fail(args, exitcodes.FAILED, f"Prometheus: {exc}")
    report = idle_report(rule, idle_gpus(series, rule, start, end), running)
    if args.json:
        print_json({**report.as_dict(), "exit_code": exitcodes.OK})
    elif args.csv:
        sys.stdout.write(render.idle_csv(report))
    else:
        sys.stdout.write(render.idle_table(report))
    return exitcodes.OK
