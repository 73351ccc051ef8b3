"""A health sweep: every GPU node judged by the gpu_health module (playbooks/health.yml), one verdict per node, and
the unhealthy Slurm nodes drained on request (playbooks/drain.yml), their running jobs left to finish.

The module fails an unhealthy node and returns its `problems`, each prefixed with its GPU or with `node:`, and a node
no check could fully look at with what it could not see (`unknown`); a node it passes has no failure. The verdict is
read from that structured return, never from the failure's message. A node with emulated GPUs is judged by its own
health program where that is installed (the role publishes the verdicts it took, `gpuinfra_health_verdicts`).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from .errors import Cancelled, Refused
from .render.inventory import inventory_yaml
from .run import OnUpdate, Outcome, RunOptions, RunResult, one_line, run_playbook
from .targets import matching, target_hosts
from .validate.load import LoadedCluster

HEALTH_PLAYBOOK = "health.yml"
DRAIN_PLAYBOOK = "drain.yml"
DRAIN_REASON_PREFIX = "gpuinfra health: "

HEALTH_MODULES = frozenset({"gpuinfra.cluster.gpu_health", "gpu_health"})

Status = Literal["healthy", "unhealthy", "unknown", "unreachable", "error", "not run", "emulated"]
# What the gpu_health role publishes (set_stats): node -> the verdict its health program gave.
JUDGED_STAT = "gpuinfra_health_verdicts"


@dataclass(frozen=True)
class NodeHealth:
    node: str
    status: Status
    problems: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"node": self.node, "status": self.status, "problems": self.problems}

    @property
    def drain_reason(self) -> str:
        first = self.problems[0] if self.problems else self.status
        more = f" (+{len(self.problems) - 1} more)" if len(self.problems) > 1 else ""
        return f"{DRAIN_REASON_PREFIX}{first}{more}"


def verdicts(result: RunResult, nodes: Sequence[str], emulated: Collection[str] = ()) -> list[NodeHealth]:
    """One verdict per node, in the order given. Nodes with emulated GPUs are judged by their health program where
    it is installed, else reachable but not judged."""
    failures = {f.host: f for f in result.failures}
    judged = result.artifacts.get(JUDGED_STAT)
    judged = judged if isinstance(judged, dict) else {}
    out = []
    for node in nodes:
        failure = failures.get(node)
        stats = result.hosts.get(node)
        if failure is not None and failure.unreachable:
            out.append(NodeHealth(node, "unreachable", [" ".join(failure.message.split())]))
        elif failure is not None and failure.action in HEALTH_MODULES and failure.problems:
            out.append(NodeHealth(node, "unhealthy", list(failure.problems)))
        elif failure is not None and failure.action in HEALTH_MODULES and failure.unknown:
            out.append(NodeHealth(node, "unknown", [f"could not look: {text}" for text in failure.unknown]))
        elif failure is not None:
            out.append(NodeHealth(node, "error", [f"{failure.task}: {' '.join(failure.message.split())}"]))
        elif stats is not None and stats.ok > 0 and node in emulated and judged.get(node) != "healthy":
            out.append(NodeHealth(node, "emulated", ["GPU device nodes without hardware (gpu.emulated): not checked"]))
        elif stats is not None and stats.ok > 0 and not stats.failed:
            out.append(NodeHealth(node, "healthy"))
        else:
            out.append(NodeHealth(node, "not run", ["the health check did not run on this node"]))
    return out


@dataclass(frozen=True)
class Sweep:
    nodes: list[NodeHealth]
    drained: dict[str, str] = field(default_factory=dict)
    """Node -> the reason it was drained with."""
    drain_errors: dict[str, str] = field(default_factory=dict)
    """Node -> why it could not be drained."""
    errors: list[str] = field(default_factory=list)
    """Ansible's own errors during the sweep."""

    @property
    def healthy(self) -> bool:
        return all(h.status in ("healthy", "emulated") for h in self.nodes)

    def count(self, status: Status) -> int:
        return sum(1 for h in self.nodes if h.status == status)

    def as_dict(self) -> dict[str, Any]:
        return {
            "status": "healthy" if self.healthy else "unhealthy",
            "nodes": [h.as_dict() for h in self.nodes],
            "counts": {s: self.count(s) for s in sorted({h.status for h in self.nodes})},
            "drained": self.drained,
            "drain_errors": self.drain_errors,
            "errors": self.errors,
        }


def sweep(
    loaded: LoadedCluster,
    limit: str | None = None,
    drain_unhealthy: bool = False,
    extra_vars: Mapping[str, Any] | None = None,
    on_update: OnUpdate | None = None,
) -> Sweep:
    """Judge the cluster's GPU nodes (those `limit` matches); with `drain_unhealthy`, drain the unhealthy Slurm
    nodes with their first problem as the reason. Raises Refused when no GPU node matches, RunError when the run
    could not start, Cancelled when it was interrupted."""
    extra = dict(extra_vars or {})
    inventory = inventory_yaml(loaded.resolved)
    nodes = matching(inventory, target_hosts(inventory, "gpu_nodes"), limit)
    if not nodes:
        raise Refused(f"no GPU node in cluster {loaded.model.name!r} matches")
    options = RunOptions(playbook=HEALTH_PLAYBOOK, limit=",".join(nodes), extra_vars=extra)
    result = run_playbook(inventory, options, hosts=nodes, on_update=on_update)
    if result.outcome is Outcome.CANCELLED:
        raise Cancelled("interrupted")
    emulated = {h.name for h in loaded.resolved.hosts.values() if h.gpu_emulated}
    found = Sweep(verdicts(result, nodes, emulated), errors=result.errors)
    if drain_unhealthy:
        slurm_nodes = set(target_hosts(inventory, "slurm_compute"))
        for health in found.nodes:
            if health.status == "unhealthy" and health.node in slurm_nodes:
                error = _drain(inventory, health, extra)
                if error:
                    found.drain_errors[health.node] = error
                else:
                    found.drained[health.node] = health.drain_reason
    return found


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
