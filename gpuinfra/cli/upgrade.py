"""`gpuinfra upgrade FILE`: roll the driver the cluster file pins (or, with --kernel, a kernel update) over the GPU
nodes, node by node, never more than `upgrade.max_unavailable` out of service, with a journal that lets a re-run
resume after a crash or Ctrl-C (gpuinfra/upgrade/cluster.py).
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any, TextIO

import hostlist

from ..errors import Refused
from ..upgrade.cluster import UpgradeOutcome, UpgradePlan, plan_upgrade, upgrade
from ..upgrade.journal import State
from ..upgrade.pipeline import UpgradeReport
from . import exitcodes
from .common import DEFAULT_CLUSTER, add_extra_vars, add_json
from .output import Output

_EXIT = {"ok": exitcodes.OK, "failed": exitcodes.FAILED, "cancelled": exitcodes.CANCELLED}


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "upgrade",
        help="roll the pinned driver (or a kernel update) over the GPU nodes without taking the cluster down",
    )
    parser.add_argument("file", nargs="?", default=DEFAULT_CLUSTER, metavar="FILE", help="cluster file")
    parser.add_argument(
        "--kernel", action="store_true", help="update the kernel instead (playbooks/kernel_update.yml), same pipeline"
    )
    parser.add_argument("--limit", metavar="PATTERN", help="only these GPU nodes (Ansible host pattern)")
    parser.add_argument("-y", "--yes", action="store_true", help="start without asking for confirmation")
    parser.add_argument("--retry-failed", action="store_true", help="take failed nodes (still drained) through again")
    parser.add_argument("--journal", metavar="PATH", help="journal file (default: under $XDG_STATE_HOME/gpuinfra)")
    add_extra_vars(parser)
    add_json(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    output = Output("upgrade", args.json, args.file)
    loaded = output.load()
    extra = output.extra_vars(args.extra_vars) if loaded is not None else None
    if loaded is None or extra is None:
        return exitcodes.INVALID_INPUT
    try:
        plan = plan_upgrade(loaded, args.kernel, args.limit, Path(args.journal) if args.journal else None)
    except Refused as exc:
        return output.refuse(str(exc))
    if not plan.nodes:
        return _finish(output, plan, UpgradeOutcome("ok", "nothing to do: no GPU node to upgrade"))
    out = output.human
    _print_plan(out, args.file, plan)
    if not args.yes:
        answer = output.confirm(f"Start on {len(plan.nodes)} node(s)?")
        if answer is None:
            return exitcodes.INVALID_INPUT
        if not answer:
            return _finish(output, plan, UpgradeOutcome("cancelled", "cancelled; nothing was run"))

    lock = threading.Lock()

    def listener(node: str, state: State, reason: str) -> None:
        with lock:
            out.write(f"{time.strftime('%H:%M:%S')} {node}: {state.value}{': ' + reason if reason else ''}\n")
            out.flush()

    def note(text: str) -> None:
        out.write(f"  {text}\n")

    with _sigterm_interrupts():
        outcome = upgrade(plan, extra, args.retry_failed, listener, note)
    return _finish(output, plan, outcome)


@contextlib.contextmanager
def _sigterm_interrupts() -> Iterator[None]:
    """SIGTERM stops the run like Ctrl-C: running phases are cancelled and the journal says where nodes are."""

    def on_sigterm(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _print_plan(out: TextIO, file: str, plan: UpgradePlan) -> None:
    policy = plan.loaded.model.upgrade
    what = f"kernel update ({plan.target})" if plan.kernel else f"driver upgrade to {plan.target}"
    lines = [
        f"Cluster {plan.loaded.model.name} ({file}): {what}",
        f"  nodes: {len(plan.nodes)} ({hostlist.collect_hostlist(plan.nodes)})",
        f"  at most {plan.max_unavailable} out of service, {policy.canary} canary first, stop after "
        f"{policy.max_failures} failure(s), drain timeout {policy.drain_timeout}, reboot {policy.reboot}, "
        f"health gate {'on' if policy.health_gate else 'off'}",
        f"  journal: {plan.journal.path}",
    ]
    for entry in plan.resuming:
        lines.append(
            f"  resuming {entry.node}: left {entry.state.value}{' (' + entry.reason + ')' if entry.reason else ''}"
        )
    if plan.handed_over:
        lines.append(_handover_note(plan.handed_over, plan.kernel))
    out.write("\n".join(lines) + "\n")
    out.flush()


def _handover_note(nodes: list[str], kernel: bool) -> str:
    names = hostlist.collect_hostlist(nodes)
    if kernel:
        return (
            f"  not here: {names}: the GPU Operator's driver container builds the module for the kernel each node "
            "boots; update their kernels with your Kubernetes node maintenance (cordon, drain, reboot)"
        )
    return (
        f"  handed over: {names}: the GPU Operator owns the driver there; `gpuinfra apply` gives it the new version "
        "and its upgrade policy (kubernetes.gpu_operator.upgrade) rolls it out"
    )


def _versions(report: UpgradeReport, node: str) -> dict[str, str]:
    """The driver a node was found at and left at: what it had before, for a node the run did not change."""
    if node not in report.found:
        return {}
    found = report.found[node]
    return {"found": found, "left": report.left.get(node, found)}


def _finish(output: Output, plan: UpgradePlan, outcome: UpgradeOutcome) -> int:
    report = outcome.report
    code = _EXIT[outcome.status]
    if not output.as_json:
        _print_report(output.human, report)
        output.human.write(f"\n{outcome.message}\n")
        return code
    nodes = {}
    if report is not None:
        nodes = {
            n: {"state": s.value, "reason": report.reasons.get(n, ""), **_versions(report, n)}
            for n, s in report.states.items()
        }
        nodes.update({n: {"state": "current", "reason": "", **_versions(report, n)} for n in report.current})
    doc = {
        "status": outcome.status,
        "target": plan.target,
        "kind": "kernel" if plan.kernel else "driver",
        "nodes": nodes,
        "not_started": report.not_started if report else [],
        "peak_unavailable": report.peak_unavailable if report else 0,
        "handed_over": plan.handed_over,
        "message": outcome.message,
    }
    return output.finish(doc, code)


def _print_report(out: TextIO, report: UpgradeReport | None) -> None:
    if report is None or not (report.states or report.current):
        return
    rows = [(n, s.value, report.reasons.get(n, "")) for n, s in report.states.items()]
    rows += [(n, "current", "") for n in report.current]
    width = max(len(node) for node, _, _ in rows)
    out.write("\n")
    for node, state, reason in rows:
        versions = _versions(report, node)
        moved = f"{versions['found'] or 'none'} -> {versions['left'] or 'none'}" if versions else ""
        out.write(f"{node:<{width}}  {state:<9}  {moved:<25}  {reason}".rstrip() + "\n")
