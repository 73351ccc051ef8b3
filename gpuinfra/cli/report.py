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
from collections.abc import Callable
from typing import Any

from ..errors import GpuinfraError
from ..report import reports, text
from ..report.idle import IdleReport
from ..report.usage import UsageReport
from ..validate.load import LoadedCluster
from . import exitcodes
from .common import DEFAULT_CLUSTER, add_extra_vars
from .output import Output


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


def run_usage(args: argparse.Namespace) -> int:
    def make(loaded: LoadedCluster, extra: dict[str, Any]) -> UsageReport:
        return reports.usage(loaded, args.since, args.until, int(time.time()), extra)

    return _report(args, make, text.usage_table, text.usage_csv)


def run_idle(args: argparse.Namespace) -> int:
    def make(loaded: LoadedCluster, extra: dict[str, Any]) -> IdleReport:
        return reports.idle(loaded, int(time.time()), extra)

    return _report(args, make, text.idle_table, text.idle_csv)


def _report[R: (UsageReport, IdleReport)](
    args: argparse.Namespace,
    make: Callable[[LoadedCluster, dict[str, Any]], R],
    table: Callable[[R], str],
    csv: Callable[[R], str],
) -> int:
    output = Output(f"report {args.report}", args.json, args.file)
    loaded = output.load()
    extra = output.extra_vars(args.extra_vars) if loaded is not None else None
    if loaded is None or extra is None:
        return exitcodes.INVALID_INPUT
    try:
        report = make(loaded, extra)
    except GpuinfraError as exc:
        return output.error(exc)
    if args.csv:
        sys.stdout.write(csv(report))
    elif not args.json:
        sys.stdout.write(table(report))
    # A failed utilisation query: the table says so; CSV and JSON readers see it on stderr as well.
    errors: list[str] = report.errors if isinstance(report, UsageReport) else []
    for error in errors if args.csv or args.json else []:
        print(f"gpuinfra report {args.report}: {error}", file=sys.stderr)
    return output.finish(report.as_dict(), exitcodes.FAILED if errors else exitcodes.OK)
