"""A cluster's driver upgrade or kernel update as library calls: `plan_upgrade` says what a run would do, and
`upgrade` carries the plan out, node by node, never more than `upgrade.max_unavailable` out of service, with a
journal that lets a later call resume after a crash or an interruption.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import hostlist

from ..errors import Refused
from ..model.grammar import duration_seconds
from ..render.inventory import inventory_yaml
from ..run import RunError
from ..targets import matching, target_hosts
from ..validate.load import LoadedCluster
from .executor import DRIVER_PLAYBOOK, KERNEL_PLAYBOOK, AnsibleExecutor, Installed, installed_drivers
from .journal import Entry, Journal, JournalBusy, State
from .pipeline import Interrupted, Listener, Rollout, UpgradeReport
from .rolling_window import resolve_max_unavailable


def default_journal(cluster: str) -> Path:
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "gpuinfra" / cluster / "upgrade.jsonl"


@dataclass(frozen=True)
class UpgradePlan:
    loaded: LoadedCluster
    kernel: bool
    """A kernel update (playbooks/kernel_update.yml) rather than a driver upgrade."""
    target: str
    """The driver version or branch, or `kernel@<start time>`: the journal's key for this rollout."""
    nodes: list[str]
    """The GPU nodes to work on, in inventory order."""
    handed_over: list[str]
    """GPU nodes whose driver the GPU Operator owns: left to it."""
    journal: Journal
    inventory: dict[str, Any] = field(repr=False)
    max_unavailable: int

    @property
    def resuming(self) -> list[Entry]:
        """Nodes an earlier run left out of service, which this one takes through first."""
        return [entry for entry in self.journal.out_of_service(self.target) if entry.node in self.nodes]


@dataclass(frozen=True)
class UpgradeOutcome:
    status: Literal["ok", "failed", "cancelled"]
    message: str
    report: UpgradeReport | None = None
    """Every node's state; None when the run ended before any node's state was known."""


def plan_upgrade(
    loaded: LoadedCluster, kernel: bool = False, limit: str | None = None, journal: Path | None = None
) -> UpgradePlan:
    """What an upgrade of this cluster would do. Raises Refused when it cannot be planned."""
    model = loaded.model
    inventory = inventory_yaml(loaded.resolved)  # built once: at fleet scale it is most of the start-up
    all_gpu = target_hosts(inventory, "gpu_nodes")
    nodes = matching(inventory, all_gpu, limit)
    if not nodes and limit:
        raise Refused(f"--limit {limit!r} matches no GPU node of cluster {model.name!r}")
    handed_over: list[str] = []
    operator = model.kubernetes.gpu_operator if model.kubernetes else None
    if operator is not None and operator.driver == "operator":
        workers = set(target_hosts(inventory, "k8s_gpu_worker"))
        handed_over = [node for node in nodes if node in workers]
        nodes = [node for node in nodes if node not in workers]
    log = Journal(journal or default_journal(model.name))
    if kernel:
        target = log.open_target("kernel@") or f"kernel@{datetime.now(UTC).strftime('%Y-%m-%dT%H:%M:%SZ')}"
    elif model.driver is None:
        raise Refused("the cluster file pins no driver (driver.version): there is nothing to upgrade to")
    else:
        target = str(model.driver.version or model.driver.branch)
    max_unavailable = resolve_max_unavailable(model.upgrade.max_unavailable, len(all_gpu))
    return UpgradePlan(loaded, kernel, target, nodes, handed_over, log, inventory, max_unavailable)


def upgrade(
    plan: UpgradePlan,
    extra_vars: Mapping[str, Any] | None = None,
    retry_failed: bool = False,
    listener: Listener | None = None,
    note: Callable[[str], None] | None = None,
) -> UpgradeOutcome:
    """Carry the plan out. `listener` hears every state recorded; `note` hears what is decided before the first
    node starts. An interruption (KeyboardInterrupt, from Ctrl-C or a SIGTERM handler) ends it `cancelled`, with
    the journal recording where each node is."""
    extra = dict(extra_vars or {})
    if not plan.nodes:
        return UpgradeOutcome("ok", "nothing to do: no GPU node to upgrade")
    nodes, current, found = list(plan.nodes), [], {}
    # What each node has installed decides the work; the journal only resumes what a run left in flight.
    if not plan.kernel:
        try:
            found = installed_drivers(plan.inventory, nodes, extra)
        except RunError as exc:
            return UpgradeOutcome("failed", str(exc))
        in_flight = {entry.node for entry in plan.resuming}
        current = [n for n in nodes if n in found and found[n].pinned and n not in in_flight]
        nodes = [n for n in nodes if n not in current]
        if current and note is not None:
            note(f"already at {plan.target}, left alone: {hostlist.collect_hostlist(current)}")
        if not nodes:
            report = UpgradeReport(plan.target, current=current, found={n: found[n].version for n in current})
            return UpgradeOutcome("ok", f"nothing to do: every GPU node has driver {plan.target} installed", report)

    policy = plan.loaded.model.upgrade
    drain_timeout = duration_seconds(policy.drain_timeout)
    cancel = threading.Event()
    executor = AnsibleExecutor(
        inventory=plan.inventory,
        playbook=KERNEL_PLAYBOOK if plan.kernel else DRIVER_PLAYBOOK,
        extra_vars={"node_drain_timeout": drain_timeout, "node_upgrade_reboot": policy.reboot, **extra},
        cancel=cancel,
        phase_timeout=duration_seconds(policy.phase_timeout),
        drain_timeout=drain_timeout,
    )
    rollout = Rollout(
        journal=plan.journal,
        target=plan.target,
        nodes=nodes,
        executor=executor,
        max_unavailable=plan.max_unavailable,
        canary=policy.canary,
        max_failures=policy.max_failures,
        health_gate=policy.health_gate,
        retry_failed=retry_failed,
        off_target=[n for n in nodes if not plan.kernel and not (n in found and found[n].pinned)],
        listener=listener,
        cancel=cancel,
    )
    try:
        with plan.journal.exclusive():
            report = rollout.run()
    except JournalBusy as exc:
        return UpgradeOutcome("failed", str(exc))
    except (Interrupted, KeyboardInterrupt):
        message = f"interrupted; run the same command again to resume (journal: {plan.journal.path})"
        return UpgradeOutcome("cancelled", message, _snapshot(plan.journal, plan.target, nodes))
    except RunError as exc:
        return UpgradeOutcome("failed", str(exc), _snapshot(plan.journal, plan.target, nodes))
    if not plan.kernel:
        report.found = {n: found[n].version if n in found else "unknown" for n in [*current, *nodes]}
        report.current = current
        try:
            left: dict[str, Installed] = installed_drivers(plan.inventory, nodes, extra)
        except RunError:
            left = {}  # the nodes' states are known; only the versions they were left at are not
        report.left = {n: left[n].version if n in left else "unknown" for n in nodes}
    return UpgradeOutcome("ok" if report.complete else "failed", verdict(report), report)


def _snapshot(journal: Journal, target: str, nodes: list[str]) -> UpgradeReport:
    report = UpgradeReport(target)
    for node, entry in journal.last_states(target).items():
        if node in nodes:
            report.states[node] = entry.state
            report.reasons[node] = entry.reason
    report.not_started = [node for node in nodes if node not in report.states]
    return report


def verdict(report: UpgradeReport) -> str:
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
