"""Cross-field rules: what field types alone cannot say. Each message says what to change.

Rules report through `Diagnostics`, which positions each finding in the file; all findings come back at once. Hosts
come first, because nothing else can be resolved from hosts that do not expand.
"""

from __future__ import annotations

from ..errors import Diagnostic, InvalidInput
from ..model import Cluster
from ..resolve import ResolvedCluster, resolve
from . import gpu, hosts, kubernetes, package_sources, slurm
from .diagnostics import Diagnostics, suggest
from .source import YamlSource

SERVER_COMPONENTS = {"prometheus", "alertmanager", "grafana"}


def check(model: Cluster, source: YamlSource) -> tuple[ResolvedCluster, list[Diagnostic]]:
    """Run every rule; returns the resolved cluster and every finding (errors and warnings)."""
    report = Diagnostics(source)
    hosts.check(model, report)
    if report.has_errors:
        raise InvalidInput(report.found)
    rc = resolve(model, gpu.parted_layouts(model, report))
    gpu.check(rc, report)
    package_sources.check(model, report)
    slurm.check(rc, report)
    kubernetes.check(rc, report)
    _monitoring(rc, report)
    _upgrade(rc, report)
    return rc, report.found


def _monitoring(rc: ResolvedCluster, report: Diagnostics) -> None:
    mon = rc.model.monitoring
    servers = SERVER_COMPONENTS & set(mon.components)
    if servers and not rc.with_role("monitoring"):
        needs = f"{', '.join(sorted(servers))} need a host with the monitoring role"
        if "components" in mon.model_fields_set:
            report.error(("monitoring", "components"), f"{needs}; add the role to a node group or remove them")
        else:  # the default stack: say what will be missing, without failing a cluster that has no such host
            report.warning(("monitoring",), f"{needs}, so they are not installed; add the role to a node group")
    routes: list[tuple[tuple[str | int, ...], str]] = [
        ((severity, i), receiver)
        for severity in ("critical", "warning", "info")
        for i, receiver in enumerate(getattr(mon.routes, severity))
    ]
    routes += [(("teams", team, i), r) for team, names in mon.routes.teams.items() for i, r in enumerate(names)]
    for where, receiver in routes:
        if receiver not in mon.receivers:
            report.error(
                ("monitoring", "routes", *where),
                f"receiver {receiver!r} is not defined; {suggest(receiver, list(mon.receivers))}",
            )
    accounts = list(rc.model.slurm.accounts) if rc.model.slurm is not None else []
    for team in mon.routes.teams:
        if team not in accounts:
            why = suggest(team, accounts) if accounts else "teams are Slurm accounts, and this cluster has none"
            report.error(("monitoring", "routes", "teams", team), f"{team!r} is not a Slurm account; {why}")


def _upgrade(rc: ResolvedCluster, report: Diagnostics) -> None:
    policy = rc.model.upgrade
    gpu_nodes = len(rc.gpu_hosts)
    if isinstance(policy.max_unavailable, int) and gpu_nodes and policy.max_unavailable > gpu_nodes:
        report.warning(
            ("upgrade", "max_unavailable"),
            f"{policy.max_unavailable} exceeds the {gpu_nodes} GPU nodes: every node may be out at once",
        )
