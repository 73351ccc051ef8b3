"""A health sweep: every GPU node judged by the gpu_health module (playbooks/health.yml), one verdict per node, and
the unhealthy Slurm nodes drained on request (playbooks/drain.yml), their running jobs left to finish.

The module fails an unhealthy node and returns its `problems`, each prefixed with its GPU or with `node:`, and a node
no check could fully look at with what it could not see (`unknown`); a node it passes has no failure. The verdict is
read from that structured return, never from the failure's message. A node with emulated GPUs is judged by its own
health program where that is installed (the role publishes the verdicts it took, `gpuinfra_health_verdicts`).

On Slurm, the sweep (playbooks/sweep.yml) also shows what the controller holds of each node (the gpu_admission
role's report, `gpuinfra_fleet_state`): its drain and reason, its place in the admission gate and its last
admission, and for each partition the nodes the health checks hold drained against the breaker's limit, so a node
the breaker spared is named as such.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from .errors import Cancelled, Refused
from .render.inventory import inventory_yaml
from .run import OnUpdate, Outcome, RunOptions, RunResult, one_line, run_playbook
from .targets import matching, target_hosts
from .validate.load import LoadedCluster

HEALTH_PLAYBOOK = "health.yml"
# The sweep's own: the controller's report of the nodes, then health.yml (which an apply imports alone).
SWEEP_PLAYBOOK = "sweep.yml"
DRAIN_PLAYBOOK = "drain.yml"
DRAIN_REASON_PREFIX = "gpuinfra health: "

HEALTH_MODULES = frozenset({"gpuinfra.cluster.gpu_health", "gpu_health"})

Status = Literal["healthy", "unhealthy", "unknown", "unreachable", "error", "not run", "emulated"]
# What the gpu_health role publishes (set_stats): node -> the verdict its health program gave.
JUDGED_STAT = "gpuinfra_health_verdicts"
# What the gpu_admission role's report publishes: the Slurm controller's view of the nodes and the breaker.
FLEET_STAT = "gpuinfra_fleet_state"
SLURM_BUSY = frozenset({"ALLOCATED", "MIXED", "COMPLETING"})


@dataclass(frozen=True)
class InSlurm:
    """What the Slurm controller holds of a node."""

    state: str
    """in service, drained, draining, down, reserved, or unknown to Slurm."""
    reason: str = ""
    admission: str = ""
    """waiting (drained for the admission gate), checking (its check job in the gate's reservation), or empty."""
    last_admission: dict[str, Any] | None = None
    """The gate's history's last record of the node: time, verdict, reason, kind (gate or scheduled)."""
    spared: bool = False
    """Unhealthy, yet in service: a partition of its is at the breaker's limit."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def slurm_state(flags: AbstractSet[str]) -> str:
    """One word for scontrol's state flags (IDLE+DRAIN, MIXED+DRAIN, DOWN+NOT_RESPONDING, ...)."""
    if not flags:
        return "unknown to Slurm"
    if flags & {"DOWN", "FAIL"}:
        return "down"
    if flags & {"DRAIN", "DRAINED", "DRAINING"}:
        return "draining" if flags & SLURM_BUSY else "drained"
    if flags & {"MAINT", "RESERVED"}:
        return "reserved"
    return "in service"


@dataclass(frozen=True)
class NodeHealth:
    node: str
    status: Status
    problems: list[str] = field(default_factory=list)
    slurm: InSlurm | None = None
    """The controller's view, on Slurm clusters."""

    def as_dict(self) -> dict[str, Any]:
        slurm = self.slurm.as_dict() if self.slurm else None
        return {"node": self.node, "status": self.status, "problems": self.problems, "slurm": slurm}

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
class Breaker:
    """One partition's count of nodes the health checks hold drained, against the breaker's limit."""

    partition: str
    nodes: int
    held: list[str]
    limit: int

    @property
    def at_limit(self) -> bool:
        return self.nodes > 0 and len(self.held) >= self.limit

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "at_limit": self.at_limit}


def fleet_view(report: Any, found: list[NodeHealth]) -> tuple[list[NodeHealth], list[Breaker]]:
    """The verdicts with what the controller holds of each node, and the breakers of their partitions, from the
    report's JSON (anything else in it is ignored: it is a host's answer)."""
    if not isinstance(report, dict) or not isinstance(report.get("nodes"), dict):
        return found, []
    breakers = [
        Breaker(str(b.get("partition")), b["nodes"], [str(n) for n in b["held"]], b["limit"])
        for b in report.get("breaker") or []
        if isinstance(b, dict)
        and isinstance(b.get("held"), list)
        and isinstance(b.get("nodes"), int)
        and isinstance(b.get("limit"), int)
    ]
    at_limit = {b.partition for b in breakers if b.at_limit}
    out = []
    for health in found:
        seen = report["nodes"].get(health.node.split(".")[0])
        if not isinstance(seen, dict):
            out.append(health)
            continue
        state = slurm_state({str(f) for f in seen.get("state") or []})
        partitions = {str(p) for p in seen.get("partitions") or []}
        last = seen.get("last")
        last = last if isinstance(last, dict) and isinstance(last.get("time"), (int, float)) else None
        spared = health.status == "unhealthy" and state == "in service" and bool(partitions & at_limit)
        view = InSlurm(state, str(seen.get("reason") or ""), str(seen.get("admission") or ""), last, spared)
        out.append(NodeHealth(health.node, health.status, health.problems, view))
    return out, breakers


@dataclass(frozen=True)
class Sweep:
    nodes: list[NodeHealth]
    breakers: list[Breaker] = field(default_factory=list)
    """Per partition of the nodes (Slurm): the health checks' drains against the breaker's limit."""
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
            "breakers": [b.as_dict() for b in self.breakers],
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
    options = RunOptions(playbook=SWEEP_PLAYBOOK, limit=",".join(nodes), extra_vars=extra)
    result = run_playbook(inventory, options, hosts=nodes, on_update=on_update)
    if result.outcome is Outcome.CANCELLED:
        raise Cancelled("interrupted")
    emulated = {h.name for h in loaded.resolved.hosts.values() if h.gpu_emulated}
    judged, breakers = fleet_view(result.artifacts.get(FLEET_STAT), verdicts(result, nodes, emulated))
    found = Sweep(judged, breakers, errors=result.errors)
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
