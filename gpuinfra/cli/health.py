"""`gpuinfra health FILE`: sweep every GPU node with the health module; a table or --json; --drain-unhealthy
drains the unhealthy nodes in Slurm, with their first problem as the reason (running jobs finish). `--admit NODES`
puts nodes back in service through the admission gate instead."""

from __future__ import annotations

import argparse
import time
from typing import Any, TextIO

from ..admission import Admission, admit
from ..errors import GpuinfraError
from ..health_sweep import NodeHealth, Status, Sweep, sweep
from . import exitcodes
from .common import DEFAULT_CLUSTER, add_extra_vars, add_json
from .display import display
from .output import Output


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("health", help="check every GPU node's health (table, or --json)")
    parser.add_argument("file", nargs="?", default=DEFAULT_CLUSTER, metavar="FILE", help="cluster file")
    parser.add_argument("--limit", metavar="PATTERN", help="only these GPU nodes (Ansible host pattern)")
    parser.add_argument(
        "--drain-unhealthy",
        action="store_true",
        help="drain unhealthy Slurm nodes, with the problem as the reason (jobs running there finish)",
    )
    parser.add_argument(
        "--admit",
        metavar="NODES",
        help="put these nodes (Ansible host pattern) back in service once their active checks pass, run as a Slurm "
        "job on each; a node that fails stays drained with the check and its figure as the reason",
    )
    add_extra_vars(parser)
    add_json(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    output = Output("health", args.json, args.file)
    loaded = output.load()
    extra = output.extra_vars(args.extra_vars) if loaded is not None else None
    if loaded is None or extra is None:
        return exitcodes.INVALID_INPUT
    if args.admit is not None:
        if args.limit or args.drain_unhealthy:
            return output.refuse("--admit names its own nodes: give it alone, without --limit or --drain-unhealthy")
        try:
            with display(output) as on_update:
                admitted = admit(loaded, args.admit, extra, on_update)
        except GpuinfraError as exc:
            return output.error(exc)
        if not args.json:
            _print_admissions(output.human, admitted)
        code = exitcodes.OK if all(a.admitted for a in admitted) else exitcodes.FAILED
        return output.finish({"admissions": [a.as_dict() for a in admitted]}, code)
    try:
        with display(output) as on_update:
            found = sweep(loaded, args.limit, args.drain_unhealthy, extra, on_update)
    except GpuinfraError as exc:
        return output.error(exc)
    code = exitcodes.OK if found.healthy and not found.drain_errors else exitcodes.FAILED
    if not args.json:
        _print_sweep(output.human, found)
    return output.finish(found.as_dict(), code)


def _print_sweep(out: TextIO, found: Sweep) -> None:
    print_table(out, found.nodes)
    print_slurm(out, found)
    for node, reason in found.drained.items():
        out.write(f"drained {node} in Slurm: {reason}\n")
    for node, error in found.drain_errors.items():
        out.write(f"could not drain {node}: {error}\n")
    others = [f"{found.count(kind)} {label}" for kind, label in OTHER_COUNTS if found.count(kind)]
    summary = [f"{found.count('healthy')} of {len(found.nodes)} GPU node(s) healthy", *others]
    out.write(f"\n{', '.join(summary)}\n")


def _print_admissions(out: TextIO, admitted: list[Admission]) -> None:
    width = max([len("NODE")] + [len(a.node) for a in admitted])
    out.write(f"{'NODE':<{width}}  {'ADMITTED':<8}  REASON\n")
    for a in admitted:
        out.write(f"{a.node:<{width}}  {'yes' if a.admitted else 'no':<8}  {a.reason or '-'}\n")
    out.write(f"\n{sum(a.admitted for a in admitted)} of {len(admitted)} node(s) admitted\n")


# Besides the healthy: what the summary line counts, in this order.
OTHER_COUNTS: tuple[tuple[Status, str], ...] = (
    ("unknown", "unknown (a check could not look)"),
    ("emulated", "emulated (not checked)"),
)


def print_slurm(out: TextIO, found: Sweep) -> None:
    """What the Slurm controller holds of each node (its drain, the admission gate, the breaker's sparing), then
    each partition's breaker."""
    seen = [h for h in found.nodes if h.slurm is not None]
    if not seen:
        return
    width = max(len(h.node) for h in seen)
    out.write("\nIn Slurm:\n")
    for health in seen:
        out.write(f"{health.node:<{width}}  {in_slurm(health)}\n")
    for b in found.breakers:
        held = f"{len(b.held)} of {b.nodes} node(s) drained by health checks" + (
            f" ({', '.join(b.held)})" if b.held else ""
        )
        state = "at its limit: further unhealthy nodes stay in service, spared" if b.at_limit else "below it"
        out.write(f"breaker of partition {b.partition}: {held}; limit {b.limit}, {state}\n")


def in_slurm(health: NodeHealth) -> str:
    view = health.slurm
    assert view is not None
    parts = [f"{view.state}" + (f" ({view.reason})" if view.reason else "")]
    if view.spared:
        parts.append("spared by the breaker: unhealthy, left in service")
    if view.admission == "waiting":
        parts.append("admission: waiting for its active checks")
    elif view.admission == "checking":
        parts.append("admission: its active checks are running")
    last = view.last_admission
    if last:
        when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(float(last.get("time", 0))))
        kind = "scheduled check" if last.get("kind") == "scheduled" else "admission"
        verdict = str(last.get("verdict", ""))
        parts.append(
            f"last {kind}: {verdict} at {when}"
            + (f" ({last['reason']})" if verdict != "pass" and last.get("reason") else "")
        )
    return "; ".join(parts)


def print_table(out: TextIO, found: list[NodeHealth]) -> None:
    width = max([len("NODE")] + [len(h.node) for h in found])
    out.write(f"{'NODE':<{width}}  {'STATUS':<11}  PROBLEMS\n")
    for health in found:
        problems = health.problems or ["-"]
        out.write(f"{health.node:<{width}}  {health.status:<11}  {problems[0]}\n")
        for problem in problems[1:]:
            out.write(f"{'':<{width}}  {'':<11}  {problem}\n")
