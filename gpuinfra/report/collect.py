"""Read a cluster's state for a report through playbooks/report.yml, and hand back what was read as data.

The playbook publishes Slurm's output and Prometheus's answers with set_stats; they come back in the run's
`artifacts`, never from Ansible's printed output. What the playbook is asked for is passed as extra vars that
are all marked unsafe, so that Ansible never evaluates one as a template, whatever it holds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from ..errors import Cancelled, GpuinfraError
from ..render.inventory import inventory_yaml
from ..run import Outcome, RunOptions, one_line, run_playbook
from ..targets import target_hosts
from ..unsafe import unsafe
from ..validate.load import LoadedCluster
from . import sacct, squeue
from .prometheus import Query
from .time_range import TimeRange, sacct_time

REPORT_PLAYBOOK = "report.yml"

Slurm = Literal["sacct", "squeue", "none"]


class ReportError(GpuinfraError):
    """The cluster could not be read: a host unreachable, or a command that failed there."""


@dataclass(frozen=True)
class Answer:
    query: Query
    status: int
    """HTTP status, -1 when Prometheus could not be reached."""
    body: Mapping[str, Any]
    message: str

    @property
    def error(self) -> str | None:
        if self.status == 200 and self.body.get("status") == "success":
            return None
        detail = self.body.get("error") or self.message or "no answer"
        return f"Prometheus query {self.query.name}: HTTP {self.status}: {one_line(str(detail))}"


@dataclass(frozen=True)
class Collected:
    slurm: str | None
    """sacct's or squeue's output; None when not asked for."""
    answers: list[Answer] = field(default_factory=list)


def playbook_vars(slurm: Slurm, queries: Sequence[Query], window: TimeRange | None = None) -> dict[str, Any]:
    """The extra vars of playbooks/report.yml (the slurm_report and prometheus_query roles' variables), every
    string marked unsafe."""
    found: dict[str, Any] = {"slurm_report_read": slurm, "prometheus_query_queries": [q.as_var() for q in queries]}
    if slurm == "sacct":
        if window is None:
            raise ValueError("sacct needs a window")
        found |= {
            "slurm_report_sacct_format": sacct.FORMAT,
            "slurm_report_separator": sacct.SEPARATOR,
            "slurm_report_start": sacct_time(window.since),
            "slurm_report_end": sacct_time(window.until),
        }
    if slurm == "squeue":
        found["slurm_report_squeue_format"] = squeue.FORMAT
    return {key: unsafe(value) for key, value in found.items()}


def hosts_for(inventory: Mapping[str, Any], slurm: Slurm, queries: Sequence[Query]) -> list[str]:
    """The controller (for Slurm) and the monitoring host (for Prometheus) the run needs, first of each group."""
    hosts: list[str] = []
    for group, wanted in (("slurm_controller", slurm != "none"), ("monitoring", bool(queries))):
        found = target_hosts(inventory, group) if wanted else []
        if wanted and not found:
            raise ReportError(f"the cluster has no host in the group {group}")
        if found and found[0] not in hosts:
            hosts.append(found[0])
    return hosts


def collect(
    loaded: LoadedCluster,
    slurm: Slurm,
    queries: Sequence[Query] = (),
    window: TimeRange | None = None,
    extra_vars: Mapping[str, Any] | None = None,
) -> Collected:
    """Run playbooks/report.yml for what is asked, and return what it read."""
    inventory = inventory_yaml(loaded.resolved)
    hosts = hosts_for(inventory, slurm, queries)
    options = RunOptions(
        playbook=REPORT_PLAYBOOK,
        limit=",".join(hosts),
        extra_vars={**(extra_vars or {}), **playbook_vars(slurm, queries, window)},
    )
    result = run_playbook(inventory, options, hosts=hosts)
    if result.outcome is Outcome.CANCELLED:
        raise Cancelled("interrupted")
    if result.outcome not in (Outcome.OK, Outcome.CHANGED):
        reasons = [f"{f.host}: {f.task}: {one_line(f.message)}" for f in result.failures] or result.errors
        raise ReportError("; ".join(reasons) or f"the run ended {result.status} (exit status {result.rc})")
    return from_artifacts(result.artifacts, slurm, queries)


def from_artifacts(artifacts: Mapping[str, Any], slurm: Slurm, queries: Sequence[Query]) -> Collected:
    """What playbooks/report.yml published, checked against what it was asked for."""
    output = artifacts.get("gpuinfra_report_slurm")
    if slurm != "none" and not isinstance(output, str):
        raise ReportError(f"the playbook returned no {slurm} output")
    answers: list[Answer] = []
    if queries:
        published = artifacts.get("gpuinfra_report_prometheus") or {}
        status, bodies, messages = (list(published.get(key) or []) for key in ("status", "answers", "messages"))
        if not len(status) == len(bodies) == len(messages) == len(queries):
            raise ReportError(f"the playbook returned {len(bodies)} Prometheus answers for {len(queries)} queries")
        for query, code, body, message in zip(queries, status, bodies, messages, strict=True):
            answers.append(Answer(query, int(code), body if isinstance(body, Mapping) else {}, str(message or "")))
    return Collected(output if slurm != "none" else None, answers)
