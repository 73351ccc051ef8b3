"""What a run reports: its outcome, from runner's status and rc and Ansible's final stats (never from parsing
output), and what it did per host."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from ..errors import GpuinfraError
from ..progress import Change, Failure, HostStats, RunProgress, redact_data


class RunError(GpuinfraError):
    """A run that could not be started: missing playbook, unusable inventory or limit."""


class Outcome(StrEnum):
    OK = "ok"
    CHANGED = "changed"
    FAILED = "failed"
    TIMEOUT = "timeout"
    CANCELLED = "cancelled"


@dataclass(frozen=True)
class RunResult:
    outcome: Outcome
    status: str
    """ansible-runner's status: successful, failed, timeout or canceled."""
    rc: int
    playbook: Path
    check: bool
    hosts: dict[str, HostStats]
    failures: list[Failure]
    changes: list[Change]
    """Tasks that changed a host, or would have in check mode."""
    errors: list[str]
    warnings: list[str]
    duration_s: float
    artifacts: dict[str, Any] = field(default_factory=dict)
    """Data the playbook published with `ansible.builtin.set_stats` (aggregated, not per host): structured
    results of playbooks that read state, such as playbooks/report.yml."""

    @property
    def changed(self) -> bool:
        return any(stats.changed for stats in self.hosts.values())

    def redacted(self, redact: Callable[[str], str]) -> RunResult:
        """The same result with `redact` applied to every text that came from the run."""
        return dataclasses.replace(
            self,
            failures=[dataclasses.replace(f, task=redact(f.task), message=redact(f.message)) for f in self.failures],
            changes=[dataclasses.replace(c, task=redact(c.task), diff=redact(c.diff)) for c in self.changes],
            errors=[redact(e) for e in self.errors],
            warnings=[redact(w) for w in self.warnings],
            artifacts=redact_data(self.artifacts, redact),
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "status": self.outcome.value,
            "check": self.check,
            "playbook": str(self.playbook),
            "runner": {"status": self.status, "rc": self.rc},
            "duration_s": round(self.duration_s, 3),
            "hosts": {name: stats.as_dict() for name, stats in self.hosts.items()},
            "failures": [f.as_dict() for f in self.failures],
            "changes": [c.as_dict() for c in self.changes],
            "errors": self.errors,
            "warnings": self.warnings,
        }


def outcome_of(status: str, rc: int, progress: RunProgress) -> Outcome:
    if status == "canceled":
        return Outcome.CANCELLED
    if status == "timeout":
        return Outcome.TIMEOUT
    totals = progress.totals()
    if status != "successful" or rc != 0 or totals.failed or totals.unreachable:
        return Outcome.FAILED
    return Outcome.CHANGED if totals.changed else Outcome.OK


def one_line(text: str, limit: int = 500) -> str:
    """A message from a run on one line, cut at `limit` characters."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."
