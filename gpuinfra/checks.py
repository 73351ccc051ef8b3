"""Cross-field rules: what the schema alone cannot say. Each message says what to change.

Rules report through `Report`, which positions each finding in the file; all findings come back at once.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from pathlib import Path

from .errors import Diagnostic, InvalidInput
from .model import Cluster
from .resolve import HostlistError, ResolvedCluster, expand_hosts, resolve
from .yamlsource import Loc, YamlSource

SLURM_ROLES = {"slurm_controller", "slurm_dbd", "slurm_login", "slurm_compute"}
K8S_ROLES = {"k8s_control", "k8s_gpu_worker"}
SERVER_COMPONENTS = {"prometheus", "alertmanager", "grafana"}


@dataclass
class Report:
    source: YamlSource
    found: list[Diagnostic] = field(default_factory=list)

    def error(self, loc: Loc, message: str) -> None:
        self.found.append(self.source.diagnostic(loc, display(loc), message))

    def warning(self, loc: Loc, message: str) -> None:
        self.found.append(self.source.diagnostic(loc, display(loc), message, "warning"))


# Keys whose children are named items, shown as name[key] rather than name.key.
_COLLECTIONS = {"node_groups", "partitions", "qos", "accounts", "tenants", "layouts", "receivers", "addresses"}


def display(loc: Loc) -> str:
    out = ""
    previous: str | int | None = None
    for part in loc:
        if isinstance(part, int) or previous in _COLLECTIONS:
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
        previous = part
    return out


def suggest(name: str, choices: list[str]) -> str:
    close = difflib.get_close_matches(name, choices, n=1, cutoff=0.6)
    if close:
        return f"did you mean {close[0]!r}?"
    return f"known: {', '.join(choices)}" if choices else "none are defined"


def check(model: Cluster, source: YamlSource, base_dir: Path) -> tuple[ResolvedCluster, list[Diagnostic]]:
    """Run every rule; returns the resolved cluster and every finding (errors and warnings)."""
    report = Report(source)
    _hosts(model, report)
    if report.found:  # hosts that do not expand cannot be resolved; report them before anything else
        raise InvalidInput(report.found)
    rc = resolve(model)
    from . import gpu_checks  # the GPU, driver and MIG rules, which need the catalog

    gpu_checks.check(rc, report, base_dir)
    _slurm(rc, report)
    _kubernetes(rc, report)
    _monitoring(rc, report)
    _upgrade(rc, report)
    return rc, report.found


def _hosts(model: Cluster, report: Report) -> None:
    owner: dict[str, str] = {}
    for name, group in model.node_groups.items():
        loc = ("node_groups", name, "hosts")
        try:
            hosts = expand_hosts(group.hosts)
        except HostlistError as exc:
            report.error(loc, str(exc))
            continue
        if not hosts:
            report.error(loc, "expands to no hosts")
        for host in hosts:
            if host in owner and owner[host] != name:
                report.error(loc, f"host {host!r} is already in node group {owner[host]!r}; a host is in one group")
            owner.setdefault(host, name)
        for host in group.addresses:
            if host not in hosts:
                report.error(("node_groups", name, "addresses", host), f"{host!r} is not a host of this group")


def _slurm(rc: ResolvedCluster, report: Report) -> None:
    model = rc.model
    used = {role for host in rc.hosts.values() for role in host.roles} & SLURM_ROLES
    slurm = model.slurm
    if slurm is None:
        if used:
            report.error(
                ("node_groups",),
                f"hosts have Slurm roles ({', '.join(sorted(used))}) but there is no "
                "`slurm:` section; add one with at least one partition",
            )
        return
    controllers = rc.with_role("slurm_controller")
    if len(controllers) != 1:
        names = ", ".join(h.name for h in controllers) or "none"
        report.error(("slurm",), f"needs exactly one host with the slurm_controller role (found {names})")
    if slurm.accounting and not rc.with_role("slurm_dbd"):
        report.error(("slurm", "accounting"), "needs a host with the slurm_dbd role; add one or set accounting: false")
    compute_groups = [n for n, g in model.node_groups.items() if "slurm_compute" in g.roles]
    defaults = [name for name, p in slurm.partitions.items() if p.default]
    if len(defaults) > 1:
        report.error(
            ("slurm", "partitions", defaults[1], "default"),
            f"only one partition can be the default (also: {defaults[0]!r})",
        )
    for name, part in slurm.partitions.items():
        for i, group in enumerate(part.node_groups):
            if group not in compute_groups:
                what = "has no slurm_compute role" if group in model.node_groups else "is not a node group"
                report.error(
                    ("slurm", "partitions", name, "node_groups", i),
                    f"{group!r} {what}; {suggest(group, compute_groups)}",
                )
        for i, account_name in enumerate(part.allow_accounts):
            if account_name not in slurm.accounts:
                report.error(
                    ("slurm", "partitions", name, "allow_accounts", i),
                    f"account {account_name!r} is not defined under slurm.accounts; "
                    f"{suggest(account_name, list(slurm.accounts))}",
                )
        if part.qos and part.qos not in slurm.qos:
            report.error(
                ("slurm", "partitions", name, "qos"),
                f"QoS {part.qos!r} is not defined under slurm.qos; {suggest(part.qos, list(slurm.qos))}",
            )
    for name, qos in slurm.qos.items():
        for i, other in enumerate(qos.preempt):
            if other not in slurm.qos:
                report.error(
                    ("slurm", "qos", name, "preempt", i),
                    f"QoS {other!r} is not defined; {suggest(other, list(slurm.qos))}",
                )
        if qos.preempt and slurm.preempt_mode == "off":
            report.warning(
                ("slurm", "qos", name, "preempt"),
                "preemption is off cluster-wide (slurm.preempt_mode: off), so this has no effect",
            )
    for name, account in slurm.accounts.items():
        if account.parent and account.parent not in slurm.accounts:
            report.error(
                ("slurm", "accounts", name, "parent"),
                f"account {account.parent!r} is not defined; {suggest(account.parent, list(slurm.accounts))}",
            )
        for i, qos_name in enumerate(account.qos):
            if qos_name not in slurm.qos:
                report.error(
                    ("slurm", "accounts", name, "qos", i),
                    f"QoS {qos_name!r} is not defined under slurm.qos; {suggest(qos_name, list(slurm.qos))}",
                )
        if account.default_qos and account.default_qos not in account.qos:
            report.error(
                ("slurm", "accounts", name, "default_qos"),
                f"{account.default_qos!r} must also be listed in this account's qos",
            )
    _account_cycles(rc, report)
    capacity = sum(h.gpu_count for h in rc.with_role("slurm_compute"))
    for name, qos in slurm.qos.items():
        for key, limit in (("max_gpus_per_user", qos.max_gpus_per_user), ("max_gpus_per_job", qos.max_gpus_per_job)):
            if limit and limit > capacity:
                report.warning(
                    ("slurm", "qos", name, key), f"{limit} GPUs is more than the cluster's {capacity} Slurm GPUs"
                )
    for name, account in slurm.accounts.items():
        if account.max_gpus and account.max_gpus > capacity:
            report.warning(
                ("slurm", "accounts", name, "max_gpus"),
                f"{account.max_gpus} GPUs is more than the cluster's {capacity} Slurm GPUs",
            )


def _account_cycles(rc: ResolvedCluster, report: Report) -> None:
    accounts = rc.model.slurm.accounts if rc.model.slurm else {}
    for start in accounts:
        seen = [start]
        parent = accounts[start].parent
        while parent in accounts:
            if parent in seen:
                report.error(
                    ("slurm", "accounts", start, "parent"), f"accounts form a cycle: {' -> '.join([*seen, parent])}"
                )
                break
            seen.append(parent)
            parent = accounts[parent].parent


def _kubernetes(rc: ResolvedCluster, report: Report) -> None:
    used = {role for host in rc.hosts.values() for role in host.roles} & K8S_ROLES
    if rc.model.kubernetes is None:
        return
    if not used:
        report.error(("kubernetes",), "no host has a k8s_control or k8s_gpu_worker role")
        return
    from .render.vars import kubernetes as k8s_vars

    for loc, message in k8s_vars.capacity_warnings(rc):
        report.warning(loc, message)


def _monitoring(rc: ResolvedCluster, report: Report) -> None:
    mon = rc.model.monitoring
    servers = SERVER_COMPONENTS & set(mon.components)
    if servers and not rc.with_role("monitoring"):
        needs = f"{', '.join(sorted(servers))} need a host with the monitoring role"
        if "components" in mon.model_fields_set:
            report.error(("monitoring", "components"), f"{needs}; add the role to a node group or remove them")
        else:  # the default stack: say what will be missing, without failing a cluster that has no such host
            report.warning(("monitoring",), f"{needs}, so they are not installed; add the role to a node group")
    for severity in ("critical", "warning", "info"):
        for i, receiver in enumerate(getattr(mon.routes, severity)):
            if receiver not in mon.receivers:
                report.error(
                    ("monitoring", "routes", severity, i),
                    f"receiver {receiver!r} is not defined; {suggest(receiver, list(mon.receivers))}",
                )


def _upgrade(rc: ResolvedCluster, report: Report) -> None:
    policy = rc.model.upgrade
    gpu_nodes = len(rc.gpu_hosts)
    if isinstance(policy.max_unavailable, int) and gpu_nodes and policy.max_unavailable > gpu_nodes:
        report.warning(
            ("upgrade", "max_unavailable"),
            f"{policy.max_unavailable} exceeds the {gpu_nodes} GPU nodes: every node may be out at once",
        )
