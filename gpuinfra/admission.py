"""`gpuinfra health --admit`: GPU nodes put back in service through the admission gate (playbooks/admit.yml), on an
operator's request: their active checks run as a Slurm job on each, and only the nodes that pass are resumed. A node
an operator drained is taken over, since the operator asked for it by name."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .errors import Cancelled, Refused
from .render.inventory import inventory_yaml
from .run import OnUpdate, Outcome, RunOptions, one_line, run_playbook
from .targets import matching, target_hosts
from .validate.load import LoadedCluster

ADMIT_PLAYBOOK = "admit.yml"


@dataclass(frozen=True)
class Admission:
    node: str
    admitted: bool
    reason: str
    """Why it stays out of service; empty when admitted."""

    def as_dict(self) -> dict[str, Any]:
        return {"node": self.node, "admitted": self.admitted, "reason": self.reason}


def admit(
    loaded: LoadedCluster,
    pattern: str,
    extra_vars: Mapping[str, Any] | None = None,
    on_update: OnUpdate | None = None,
) -> list[Admission]:
    """Admit the GPU nodes `pattern` matches (an Ansible host pattern). Raises Refused when none matches, RunError
    when the run could not start, Cancelled when it was interrupted."""
    inventory = inventory_yaml(loaded.resolved)
    nodes = matching(inventory, target_hosts(inventory, "gpu_nodes"), pattern)
    if not nodes:
        raise Refused(f"no GPU node in cluster {loaded.model.name!r} matches {pattern!r}")
    extra = {**(extra_vars or {}), "gpu_admission_take_over": True}
    options = RunOptions(playbook=ADMIT_PLAYBOOK, only=tuple(nodes), extra_vars=extra)
    result = run_playbook(inventory, options, hosts=nodes, on_update=on_update)
    if result.outcome is Outcome.CANCELLED:
        raise Cancelled("interrupted")
    failures = {f.host: f for f in result.failures}
    out = []
    for node in nodes:
        if node in failures:
            out.append(Admission(node, False, one_line(failures[node].message)))
        elif node in result.hosts:
            out.append(Admission(node, True, ""))
        else:
            out.append(Admission(node, False, one_line("; ".join(result.errors)) or "not run"))
    return out
