"""A health sweep: every GPU node judged by the gpu_health module (playbooks/health.yml), one verdict per node.

The module fails an unhealthy node and returns its `problems`, each prefixed with its GPU or with `node:`; a node
it passes has no failure. The verdict is read from that structured return, never from the failure's message.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from .run import RunResult

HEALTH_PLAYBOOK = "health.yml"
DRAIN_PLAYBOOK = "drain.yml"
DRAIN_REASON_PREFIX = "gpuinfra health: "

HEALTH_MODULES = frozenset({"gpuinfra.cluster.gpu_health", "gpu_health"})

Status = Literal["healthy", "unhealthy", "unreachable", "error", "not run", "emulated"]


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
    """One verdict per node, in the order given. Nodes with emulated GPUs are reachable but never judged."""
    failures = {f.host: f for f in result.failures}
    out = []
    for node in nodes:
        failure = failures.get(node)
        stats = result.hosts.get(node)
        if failure is not None and failure.unreachable:
            out.append(NodeHealth(node, "unreachable", [" ".join(failure.message.split())]))
        elif failure is not None and failure.action in HEALTH_MODULES and failure.problems:
            out.append(NodeHealth(node, "unhealthy", list(failure.problems)))
        elif failure is not None:
            out.append(NodeHealth(node, "error", [f"{failure.task}: {' '.join(failure.message.split())}"]))
        elif stats is not None and stats.ok > 0 and node in emulated:
            out.append(NodeHealth(node, "emulated", ["GPU device nodes without hardware (gpu.emulated): not checked"]))
        elif stats is not None and stats.ok > 0 and not stats.failed:
            out.append(NodeHealth(node, "healthy"))
        else:
            out.append(NodeHealth(node, "not run", ["the health check did not run on this node"]))
    return out
