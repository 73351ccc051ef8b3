"""`gpuinfra health FILE`: sweep every GPU node with the health module; a table or --json; --drain-unhealthy
drains the unhealthy nodes in Slurm, with their first problem as the reason (running jobs finish)."""

from __future__ import annotations

import argparse
import sys
from typing import Any, TextIO

from ..health_sweep import DRAIN_PLAYBOOK, HEALTH_PLAYBOOK, NodeHealth, verdicts
from ..run import Outcome, RunError, RunOptions, cluster_inventory, one_line, run_playbook, target_hosts
from . import exitcodes
from .common import DEFAULT_CLUSTER, add_extra_vars, add_json, load_or_report, parse_extra_vars, print_json


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("health", help="check every GPU node's health (table, or --json)")
    parser.add_argument("file", nargs="?", default=DEFAULT_CLUSTER, metavar="FILE", help="cluster file")
    parser.add_argument("--limit", metavar="PATTERN", help="only these GPU nodes (Ansible host pattern)")
    parser.add_argument(
        "--drain-unhealthy",
        action="store_true",
        help="drain unhealthy Slurm nodes, with the problem as the reason (jobs running there finish)",
    )
    add_extra_vars(parser)
    add_json(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    out: TextIO = sys.stderr if args.json else sys.stdout
    loaded = load_or_report(args.file, args.json)
    if loaded is None:
        return exitcodes.INVALID_INPUT
    try:
        extra = parse_extra_vars(args.extra_vars)
    except (OSError, ValueError) as exc:
        print(f"gpuinfra health: --extra-vars: {exc}", file=sys.stderr)
        return exitcodes.INVALID_INPUT
    inventory = cluster_inventory(loaded)
    nodes = target_hosts(inventory, "gpu_nodes")
    if args.limit:
        limited = set(target_hosts(inventory, args.limit))
        nodes = [node for node in nodes if node in limited]
    if not nodes:
        print(f"gpuinfra health: no GPU node in cluster {loaded.model.name!r} matches", file=sys.stderr)
        return exitcodes.INVALID_INPUT

    limit = ",".join(nodes)
    try:
        options = RunOptions(playbook=HEALTH_PLAYBOOK, limit=limit, extra_vars=extra)
        result = run_playbook(inventory, options, hosts=nodes)
    except RunError as exc:
        print(f"gpuinfra health: {exc}", file=sys.stderr)
        return exitcodes.FAILED
    if result.outcome is Outcome.CANCELLED:
        print("gpuinfra health: interrupted", file=sys.stderr)
        return exitcodes.CANCELLED
    emulated = {h.name for h in loaded.resolved.hosts.values() if h.gpu_emulated}
    found = verdicts(result, nodes, emulated)

    drained: dict[str, str] = {}
    drain_errors: dict[str, str] = {}
    if args.drain_unhealthy:
        slurm_nodes = set(target_hosts(inventory, "slurm_compute"))
        for health in found:
            if health.status == "unhealthy" and health.node in slurm_nodes:
                error = _drain(inventory, health, extra)
                if error:
                    drain_errors[health.node] = error
                else:
                    drained[health.node] = health.drain_reason

    healthy = all(h.status in ("healthy", "emulated") for h in found)
    code = exitcodes.OK if healthy and not drain_errors else exitcodes.FAILED
    if args.json:
        print_json(
            {
                "status": "healthy" if healthy else "unhealthy",
                "nodes": [h.as_dict() for h in found],
                "counts": {s: sum(1 for h in found if h.status == s) for s in sorted({h.status for h in found})},
                "drained": drained,
                "drain_errors": drain_errors,
                "errors": result.errors,
                "exit_code": code,
            }
        )
        return code
    _print_table(out, found)
    for node, reason in drained.items():
        out.write(f"drained {node} in Slurm: {reason}\n")
    for node, error in drain_errors.items():
        out.write(f"could not drain {node}: {error}\n")
    good = sum(1 for h in found if h.status == "healthy")
    fake = sum(1 for h in found if h.status == "emulated")
    out.write(f"\n{good} of {len(found)} GPU node(s) healthy{f', {fake} emulated (not checked)' if fake else ''}\n")
    return code


def _drain(inventory: dict[str, Any], health: NodeHealth, extra: dict[str, Any]) -> str | None:
    """Drain one node in Slurm without waiting for its jobs; None when done, else why not."""
    options = RunOptions(
        playbook=DRAIN_PLAYBOOK,
        limit=health.node,
        extra_vars={**extra, "node_drain_reason": health.drain_reason, "node_drain_wait": False},
    )
    result = run_playbook(inventory, options, hosts=[health.node])
    if result.outcome in (Outcome.OK, Outcome.CHANGED):
        return None
    failures = [f.message for f in result.failures] or result.errors or [f"runner status {result.status}"]
    return one_line(failures[-1])


def _print_table(out: TextIO, found: list[NodeHealth]) -> None:
    width = max([len("NODE")] + [len(h.node) for h in found])
    out.write(f"{'NODE':<{width}}  {'STATUS':<11}  PROBLEMS\n")
    for health in found:
        problems = health.problems or ["-"]
        out.write(f"{health.node:<{width}}  {health.status:<11}  {problems[0]}\n")
        for problem in problems[1:]:
            out.write(f"{'':<{width}}  {'':<11}  {problem}\n")
