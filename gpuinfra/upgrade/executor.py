"""Phases as Ansible runs: one ansible-runner run of the upgrade playbook per node and phase.

`--limit NODE --tags PHASE` selects the node and the phase; the playbook's rescue (tagged `always`) keeps a failed
node drained with the failure as its reason before the run ends, so the controller only has to read the outcome.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..run import Outcome, RunOptions, RunResult, one_line, run_playbook
from .pipeline import PhaseResult

DRIVER_PLAYBOOK = "upgrade_driver.yml"
KERNEL_PLAYBOOK = "kernel_update.yml"
INSTALLED_PLAYBOOK = "driver_installed.yml"
# What driver_installed.yml publishes (set_stats, merged over hosts): {node: {version, pinned}}.
INSTALLED = "gpuinfra_driver_installed"

# What the playbooks' rescue publishes (set_stats) when the drain gave up (timeout, or drained by someone else):
# the node was left as it was, so it is skipped rather than failed.
OUTCOME = "gpuinfra_upgrade_outcome"


@dataclass
class AnsibleExecutor:
    inventory: Mapping[str, Any]
    playbook: str
    extra_vars: Mapping[str, Any] = field(default_factory=dict)
    cancel: threading.Event = field(default_factory=threading.Event)
    phase_timeout: int | None = None
    """Seconds a phase may run besides waiting for jobs; None for no limit."""
    drain_timeout: int = 0
    """Seconds the drain phase may wait for jobs, on top of phase_timeout."""

    def timeout(self, phase: str) -> int | None:
        if self.phase_timeout is None:
            return None
        return self.phase_timeout + (self.drain_timeout if phase == "drain" else 0)

    def __call__(self, node: str, phase: str) -> PhaseResult:
        options = RunOptions(
            playbook=self.playbook,
            limit=node,
            tags=(phase,),
            extra_vars=dict(self.extra_vars),
            timeout=self.timeout(phase),
        )
        result = run_playbook(self.inventory, options, hosts=[node], cancel=self.cancel.is_set)
        return phase_result(result, node)


def phase_result(result: RunResult, node: str) -> PhaseResult:
    if result.outcome is Outcome.CANCELLED:
        return PhaseResult("cancelled")
    if result.outcome in (Outcome.OK, Outcome.CHANGED):
        return PhaseResult("ok")
    if result.outcome is Outcome.TIMEOUT:
        return PhaseResult("failed", f"the run took longer than {result.duration_s:.0f}s and was stopped")
    failures = [f for f in result.failures if f.host == node] or result.failures
    if result.artifacts.get(OUTCOME) == "skipped":
        return PhaseResult("skipped", one_line(failures[-1].message if failures else "left as it was"))
    if failures:
        last = failures[-1]
        kind = "unreachable" if last.unreachable else "failed"
        return PhaseResult("failed", one_line(f"{kind}: {last.message}" if last.unreachable else last.message))
    detail = "; ".join(result.errors) or f"ansible-runner status {result.status}, rc {result.rc}"
    return PhaseResult("failed", one_line(detail))


@dataclass(frozen=True)
class Installed:
    version: str
    """The driver versions DKMS has installed for the kernel that boots next, comma-separated; empty for none."""
    pinned: bool
    """Whether one of them is the pinned version (or of the pinned branch)."""


def installed_drivers(
    inventory: Mapping[str, Any], nodes: list[str], extra_vars: Mapping[str, Any] | None = None
) -> dict[str, Installed]:
    """The driver each node has installed, read in one run. A node that could not be read is left out, so the
    caller treats it as off the pin: the upgrade then reaches it and reports why it cannot go on."""
    if not nodes:
        return {}
    options = RunOptions(playbook=INSTALLED_PLAYBOOK, limit=",".join(nodes), extra_vars=dict(extra_vars or {}))
    found = run_playbook(inventory, options, hosts=nodes).artifacts.get(INSTALLED)
    if not isinstance(found, Mapping):
        return {}
    return {
        node: Installed(str(value.get("version", "")), bool(value.get("pinned")))
        for node, value in found.items()
        if node in nodes and isinstance(value, Mapping)
    }
