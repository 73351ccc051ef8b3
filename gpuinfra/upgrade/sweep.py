"""A health sweep: every GPU node judged by the gpu_health module (playbooks/health.yml), one verdict per node.

The module fails an unhealthy node with `GPU node unhealthy (N problems): p1; p2`, each problem prefixed with its
GPU or with `node:`; a node it passes has no failure. Those are the only two verdicts it gives, so the run's
outcome per host is the whole answer: nothing is parsed from Ansible's output.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from ..run import RunResult

HEALTH_PLAYBOOK = "health.yml"
DRAIN_PLAYBOOK = "drain.yml"
DRAIN_REASON_PREFIX = "gpuinfra health: "

_UNHEALTHY = re.compile(r"^GPU node unhealthy \([0-9]+ problems?\): ")
# Problems are joined with "; " and each starts with its GPU ("GPU 3 (0000...):") or "node:".
_NEXT_PROBLEM = re.compile(r"; (?=GPU [0-9]+ \(|node: )")

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


def problems_of(message: str) -> list[str] | None:
    """The problems in the module's failure message, or None when the message is not its verdict."""
    first_line = message.splitlines()[0] if message else ""
    match = _UNHEALTHY.match(first_line)
    if match is None:
        return None
    return [p.strip() for p in _NEXT_PROBLEM.split(first_line[match.end() :]) if p.strip()]


def verdicts(result: RunResult, nodes: Sequence[str], emulated: Collection[str] = ()) -> list[NodeHealth]:
    """One verdict per node, in the order given. Nodes with emulated GPUs are reachable but never judged."""
    failures = {f.host: f for f in result.failures}
    out = []
    for node in nodes:
        failure = failures.get(node)
        stats = result.hosts.get(node)
        if failure is not None and failure.unreachable:
            out.append(NodeHealth(node, "unreachable", [" ".join(failure.message.split())]))
        elif failure is not None:
            problems = problems_of(failure.message)
            if problems is None:
                out.append(NodeHealth(node, "error", [f"{failure.task}: {' '.join(failure.message.split())}"]))
            else:
                out.append(NodeHealth(node, "unhealthy", problems))
        elif stats is not None and stats.ok > 0 and node in emulated:
            out.append(NodeHealth(node, "emulated", ["GPU device nodes without hardware (gpu.emulated): not checked"]))
        elif stats is not None and stats.ok > 0 and not stats.failed:
            out.append(NodeHealth(node, "healthy"))
        else:
            out.append(NodeHealth(node, "not run", ["the health check did not run on this node"]))
    return out
