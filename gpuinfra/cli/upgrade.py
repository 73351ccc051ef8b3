"""`gpuinfra upgrade FILE`: roll the driver the cluster file pins (or, with --kernel, a kernel update) over the GPU
nodes, node by node, never more than `upgrade.max_unavailable` out of service, with a journal that lets a re-run
resume after a crash or Ctrl-C.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Any, TextIO

import hostlist

from ..model.grammar import duration_seconds
from ..run import RunError, cluster_inventory, target_hosts
from ..upgrade.executor import DRIVER_PLAYBOOK, KERNEL_PLAYBOOK, AnsibleExecutor, Installed, installed_drivers
from ..upgrade.journal import Journal, JournalBusy, State
from ..upgrade.pipeline import Interrupted, Rollout, UpgradeReport
from ..upgrade.window import resolve_max_unavailable
from ..validate.load import LoadedCluster
from . import exitcodes
from .common import DEFAULT_CLUSTER, add_extra_vars, add_json, load_or_report, parse_extra_vars, print_json

# Room on top of the drain timeout for one drain phase run (Ansible start-up, the drain itself).
_DRAIN_SLACK_S = 600


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


def default_journal(cluster: str) -> Path:
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "gpuinfra" / cluster / "upgrade.jsonl"


def run(args: argparse.Namespace) -> int:
    out: TextIO = sys.stderr if args.json else sys.stdout
    loaded = load_or_report(args.file, args.json)
    if loaded is None:
        return exitcodes.INVALID_INPUT
    try:
        extra = parse_extra_vars(args.extra_vars)
    except (OSError, ValueError) as exc:
        return _refuse(args, f"--extra-vars: {exc}")
    plan = _plan(loaded, args)
    if isinstance(plan, str):
        return _refuse(args, plan)
    nodes, handed_over, target = plan
    if not nodes:
        return _finish(args, out, None, target, handed_over, "nothing to do: no GPU node to upgrade")

    model = loaded.model
    policy = model.upgrade
    journal = Journal(Path(args.journal) if args.journal else default_journal(model.name))
    inventory = cluster_inventory(loaded)  # built once: at fleet scale it is most of the start-up
    all_gpu = target_hosts(inventory, "gpu_nodes")
    max_unavailable = resolve_max_unavailable(policy.max_unavailable, len(all_gpu))
    drain_timeout = duration_seconds(policy.drain_timeout)
    _print_plan(out, args, loaded, nodes, handed_over, target, journal, max_unavailable)

    if not args.yes:
        if not sys.stdin.isatty():
            return _refuse(args, "stdin is not a terminal, so no one can confirm; pass --yes to start anyway")
        out.write(f"\nStart on {len(nodes)} node(s)? Only 'yes' is accepted: ")
        out.flush()
        if sys.stdin.readline().strip() != "yes":
            return _finish(args, out, None, target, handed_over, "cancelled; nothing was run", exitcodes.CANCELLED)

    # What each node has installed decides the work (read once confirmed, as every host contact is); the journal
    # only resumes what a run left in flight.
    found: dict[str, Installed] = {}
    current: list[str] = []
    if not args.kernel:
        try:
            found = installed_drivers(inventory, nodes, extra)
        except RunError as exc:
            return _finish(args, out, None, target, handed_over, str(exc), exitcodes.FAILED)
        in_flight = {entry.node for entry in journal.out_of_service(target)}
        current = [n for n in nodes if n in found and found[n].pinned and n not in in_flight]
        nodes = [n for n in nodes if n not in current]
        if current:
            out.write(f"  already at {target}, left alone: {hostlist.collect_hostlist(current)}\n")
        if not nodes:
            report = UpgradeReport(target, current=current, found={n: found[n].version for n in current})
            message = f"nothing to do: every GPU node has driver {target} installed"
            return _finish(args, out, report, target, handed_over, message)

    cancel = threading.Event()
    executor = AnsibleExecutor(
        inventory=inventory,
        playbook=KERNEL_PLAYBOOK if args.kernel else DRIVER_PLAYBOOK,
        extra_vars={"node_drain_timeout": drain_timeout, "upgrade_reboot": policy.reboot, **extra},
        cancel=cancel,
        phase_timeout=duration_seconds(policy.phase_timeout),
        drain_timeout=drain_timeout,
    )
    lock = threading.Lock()

    def listener(node: str, state: State, reason: str) -> None:
        with lock:
            stamp = time.strftime("%H:%M:%S")
            out.write(f"{stamp} {node}: {state.value}{': ' + reason if reason else ''}\n")
            out.flush()

    rollout = Rollout(
        journal=journal,
        target=target,
        nodes=nodes,
        executor=executor,
        max_unavailable=max_unavailable,
        canary=policy.canary,
        max_failures=policy.max_failures,
        health_gate=policy.health_gate,
        retry_failed=args.retry_failed,
        off_target=[n for n in nodes if not args.kernel and not (n in found and found[n].pinned)],
        listener=listener,
        cancel=cancel,
    )
    try:
        with journal.exclusive(), _sigterm_interrupts():
            report = rollout.run()
    except JournalBusy as exc:
        return _finish(args, out, None, target, handed_over, str(exc), exitcodes.FAILED)
    except (Interrupted, KeyboardInterrupt):
        message = f"interrupted; run the same command again to resume (journal: {journal.path})"
        return _finish(args, out, _snapshot(journal, target, nodes), target, handed_over, message, exitcodes.CANCELLED)
    except RunError as exc:
        return _finish(args, out, _snapshot(journal, target, nodes), target, handed_over, str(exc), exitcodes.FAILED)
    if not args.kernel:
        report.found = {n: found[n].version if n in found else "unknown" for n in [*current, *nodes]}
        report.current = current
        try:
            left = installed_drivers(inventory, nodes, extra)
        except RunError:
            left = {}  # the nodes' states are known; only the versions they were left at are not
        report.left = {n: left[n].version if n in left else "unknown" for n in nodes}
    code = exitcodes.OK if report.complete else exitcodes.FAILED
    return _finish(args, out, report, target, handed_over, _verdict(report), code)


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


def _plan(loaded: LoadedCluster, args: argparse.Namespace) -> tuple[list[str], list[str], str] | str:
    """(nodes to work on, nodes the GPU Operator upgrades itself, journal target), or why there is no plan."""
    model = loaded.model
    inventory = cluster_inventory(loaded)
    nodes = target_hosts(inventory, "gpu_nodes")
    if args.limit:
        limited = set(target_hosts(inventory, args.limit))
        nodes = [node for node in nodes if node in limited]
        if not nodes:
            return f"--limit {args.limit!r} matches no GPU node of cluster {model.name!r}"
    handed_over: list[str] = []
    operator = model.kubernetes.gpu_operator if model.kubernetes else None
    if operator is not None and operator.driver == "operator":
        workers = set(target_hosts(inventory, "k8s_gpu_worker"))
        handed_over = [node for node in nodes if node in workers]
        nodes = [node for node in nodes if node not in workers]
    journal = Journal(Path(args.journal) if args.journal else default_journal(model.name))
    if args.kernel:
        target = journal.open_target("kernel@") or f"kernel@{datetime.now(UTC).strftime('%Y-%m-%dT%H:%M:%SZ')}"
    else:
        if model.driver is None:
            return "the cluster file pins no driver (driver.version): there is nothing to upgrade to"
        target = str(model.driver.version or model.driver.branch)
    return nodes, handed_over, target


def _print_plan(
    out: TextIO,
    args: argparse.Namespace,
    loaded: LoadedCluster,
    nodes: list[str],
    handed_over: list[str],
    target: str,
    journal: Journal,
    max_unavailable: int,
) -> None:
    policy = loaded.model.upgrade
    what = f"kernel update ({target})" if args.kernel else f"driver upgrade to {target}"
    lines = [
        f"Cluster {loaded.model.name} ({args.file}): {what}",
        f"  nodes: {len(nodes)} ({hostlist.collect_hostlist(nodes)})",
        f"  at most {max_unavailable} out of service, {policy.canary} canary first, stop after "
        f"{policy.max_failures} failure(s), drain timeout {policy.drain_timeout}, reboot {policy.reboot}, "
        f"health gate {'on' if policy.health_gate else 'off'}",
        f"  journal: {journal.path}",
    ]
    for entry in journal.out_of_service(target):
        if entry.node in nodes:
            lines.append(
                f"  resuming {entry.node}: left {entry.state.value}{' (' + entry.reason + ')' if entry.reason else ''}"
            )
    if handed_over:
        lines.append(_handover_note(handed_over, args.kernel))
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


def _snapshot(journal: Journal, target: str, nodes: list[str]) -> UpgradeReport:
    report = UpgradeReport(target)
    for node, entry in journal.last_states(target).items():
        if node in nodes:
            report.states[node] = entry.state
            report.reasons[node] = entry.reason
    report.not_started = [node for node in nodes if node not in report.states]
    return report


def _verdict(report: UpgradeReport) -> str:
    done = len(report.nodes_in(State.RESUMED))
    failed, skipped = report.nodes_in(State.FAILED), report.nodes_in(State.SKIPPED)
    text = f"{done} of {len(report.states) + len(report.not_started)} node(s) upgraded and resumed"
    if failed:
        text += f"; failed: {hostlist.collect_hostlist(failed)}"
    if skipped:
        text += f"; skipped: {hostlist.collect_hostlist(skipped)}"
    if report.not_started:
        text += f"; not started (failure threshold reached): {hostlist.collect_hostlist(report.not_started)}"
    if report.current:
        text += f"; already at {report.target}: {hostlist.collect_hostlist(report.current)}"
    return text + f"; at most {report.peak_unavailable} out of service at once"


def _versions(report: UpgradeReport, node: str) -> dict[str, str]:
    """The driver a node was found at and left at: what it had before, for a node the run did not change."""
    if node not in report.found:
        return {}
    found = report.found[node]
    return {"found": found, "left": report.left.get(node, found)}


def _refuse(args: argparse.Namespace, message: str) -> int:
    print(f"gpuinfra upgrade: {message}", file=sys.stderr)
    if args.json:
        print_json({"status": "invalid", "errors": [message], "exit_code": exitcodes.INVALID_INPUT})
    return exitcodes.INVALID_INPUT


def _finish(
    args: argparse.Namespace,
    out: TextIO,
    report: UpgradeReport | None,
    target: str,
    handed_over: list[str],
    message: str,
    code: int = exitcodes.OK,
) -> int:
    if args.json:
        status = {exitcodes.OK: "ok", exitcodes.CANCELLED: "cancelled"}.get(code, "failed")
        nodes = {}
        if report is not None:
            nodes = {
                n: {"state": s.value, "reason": report.reasons.get(n, ""), **_versions(report, n)}
                for n, s in report.states.items()
            }
            nodes.update({n: {"state": "current", "reason": "", **_versions(report, n)} for n in report.current})
        print_json(
            {
                "status": status,
                "target": target,
                "kind": "kernel" if args.kernel else "driver",
                "nodes": nodes,
                "not_started": report.not_started if report else [],
                "peak_unavailable": report.peak_unavailable if report else 0,
                "handed_over": handed_over,
                "message": message,
                "exit_code": code,
            }
        )
        return code
    if report is not None and (report.states or report.current):
        rows = [(n, s.value, report.reasons.get(n, "")) for n, s in report.states.items()]
        rows += [(n, "current", "") for n in report.current]
        width = max(len(node) for node, _, _ in rows)
        out.write("\n")
        for node, state, reason in rows:
            versions = _versions(report, node)
            moved = f"{versions['found'] or 'none'} -> {versions['left'] or 'none'}" if versions else ""
            out.write(f"{node:<{width}}  {state:<9}  {moved:<25}  {reason}".rstrip() + "\n")
    out.write(f"\n{message}\n")
    return code
