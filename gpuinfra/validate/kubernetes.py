"""Kubernetes rules: the GPU Operator's extra chart values, tenants' namespaces and queues, and quotas and limits
against the GPU capacity the workers advertise.

Capacity findings are warnings, not errors: a site may overcommit quotas on purpose, or add nodes later.
"""

from __future__ import annotations

import re
from collections import Counter

from ..k8s_resources import (
    K8S_ROLES,
    LABEL_VALUE_LENGTH,
    MIG_RESOURCE_PREFIX,
    NODE_GROUP_LABEL,
    WORKER_ROLE,
    gpu_capacity,
    gpu_resources,
    host_capacity,
    worker_gpu_models,
)
from ..model.grammar import DNS_LABEL_PATTERN
from ..model.kubernetes import Kubernetes, Tenant
from ..resolve import ResolvedCluster
from . import chart_values
from .diagnostics import Diagnostics
from .source import Loc


def check(rc: ResolvedCluster, report: Diagnostics) -> None:
    k8s = rc.model.kubernetes
    if k8s is None:
        return
    _extra_values(k8s, report)
    if not {role for host in rc.hosts.values() for role in host.roles} & K8S_ROLES:
        report.error(("kubernetes",), "no host has a k8s_control or k8s_gpu_worker role")
        return
    _node_names(rc, report)
    _group_labels(rc, report)
    seen: dict[str, str] = {}
    for name, tenant in k8s.tenants.items():
        if tenant.namespace is None and not re.fullmatch(DNS_LABEL_PATTERN, name):
            report.error(
                ("kubernetes", "tenants", name),
                f"{name!r} is not a valid Kubernetes namespace name (letters, digits and '-' only): "
                "set its `namespace`",
            )
        limits = tenant.gpus_per_container
        if limits is not None and limits.min > limits.max:
            report.error(
                ("kubernetes", "tenants", name, "gpus_per_container", "min"),
                f"min {limits.min} is above max {limits.max}, a LimitRange the API server refuses; lower min or "
                "raise max",
            )
        namespace = tenant.namespace or name
        if namespace in seen:
            report.error(
                ("kubernetes", "tenants", name), f"shares the namespace {namespace!r} with tenant {seen[namespace]!r}"
            )
        seen.setdefault(namespace, name)
    _queues(rc, k8s, report)
    for loc, message in capacity_warnings(rc):
        report.warning(loc, message)


def _queues(rc: ResolvedCluster, k8s: Kubernetes, report: Diagnostics) -> None:
    """A team's queue splits its gpu_quota between GPU models the workers have; nothing is written for queues that
    are not on."""
    queues = k8s.queues
    if queues is None:
        for name, tenant in k8s.tenants.items():
            if "queue" in tenant.model_fields_set:
                report.error(
                    ("kubernetes", "tenants", name, "queue"),
                    "kubernetes.queues is not set, so no queue is made: set it (Kueue) or remove this queue",
                )
        return
    if queues.preemption.reclaim == "Never" and queues.preemption.borrow_within_cohort != "Never":
        report.error(
            ("kubernetes", "queues", "preemption", "borrow_within_cohort"),
            "a borrower may evict others' jobs only where a team may reclaim its own quota (Kueue refuses the "
            "ClusterQueue): set reclaim to LowerPriority or Any, or this to Never",
        )
    models = worker_gpu_models(rc)
    for name, tenant in k8s.tenants.items():
        loc: Loc = ("kubernetes", "tenants", name)
        split = tenant.queue.gpus
        for model in split:
            if model not in models:
                report.error(
                    (*loc, "queue", "gpus", model),
                    f"no k8s_gpu_worker host has {model} GPUs (they have: {', '.join(models) or 'none'})",
                )
        if split and sum(split.values()) != tenant.gpu_quota:
            report.error(
                (*loc, "queue", "gpus"),
                f"the split adds up to {sum(split.values())} GPUs, not the tenant's gpu_quota of {tenant.gpu_quota}",
            )
        elif not split and len(models) > 1 and tenant.gpu_quota > 0:
            report.error(
                (*loc, "gpu_quota"),
                f"the k8s_gpu_worker hosts have several GPU models ({', '.join(models)}): say how the quota splits "
                "between them in queue.gpus",
            )


def _node_names(rc: ResolvedCluster, report: Diagnostics) -> None:
    """A Kubernetes node's name is its host name in lower case (the kubelet lowers it), and RFC 1123 subdomains are
    lower-case: a host named in upper case would be another node than the one gpuinfra labels and checks."""
    upper: dict[str, list[str]] = {}
    for host in rc.hosts.values():
        if set(host.roles) & K8S_ROLES and host.name != host.name.lower():
            upper.setdefault(host.group, []).append(host.name)
    for group, names in upper.items():
        shown = ", ".join(repr(name) for name in names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        report.error(
            ("node_groups", group, "hosts"),
            f"{shown}: a Kubernetes node's name is a lower-case RFC 1123 subdomain (the kubelet registers "
            f"{names[0].lower()!r}); write the host names in lower case",
        )


def _group_labels(rc: ResolvedCluster, report: Diagnostics) -> None:
    """Each GPU worker carries its node group as a label value (NODE_GROUP_LABEL, the health breaker's pool), which
    Kubernetes allows 63 characters, one fewer than a group's name."""
    for name, group in rc.model.node_groups.items():
        if WORKER_ROLE in group.roles and len(name) > LABEL_VALUE_LENGTH:
            report.error(
                ("node_groups", name),
                f"a group of Kubernetes GPU workers has a name of at most {LABEL_VALUE_LENGTH} characters: it is their "
                f"label {NODE_GROUP_LABEL}",
            )


def _extra_values(k8s: Kubernetes, report: Diagnostics) -> None:
    """Every key of `gpu_operator.extra_values` is a value of the chart, and every string fits in one."""
    op = k8s.gpu_operator
    if not op.extra_values:
        return
    loc: Loc = ("kubernetes", "gpu_operator", "extra_values")
    tree = chart_values.key_tree(op.chart_version)
    if tree is None:
        known = ", ".join(chart_values.shipped_versions()) or "none"
        report.warning(
            loc,
            f"keys not checked: gpuinfra knows the values of the chart {chart_values.CHART} {known}, not "
            f"{op.chart_version}, so a misspelt key is ignored by Helm without a word",
        )
        tree = "any"
    for where, message in chart_values.check(op.extra_values, tree, op.chart_version, loc):
        report.error(where, message)


def capacity_warnings(rc: ResolvedCluster) -> list[tuple[Loc, str]]:
    """Quotas and limits the GPU workers cannot satisfy, and settings the operator or device plugin will not honour.

    Each finding is (path in the cluster file, message). They are warnings, not errors: a site may overcommit quotas
    on purpose, or add nodes later.
    """
    k8s = rc.model.kubernetes
    if k8s is None:
        return []
    out = _operator_warnings(rc, k8s)
    workers = rc.with_role(WORKER_ROLE)
    layouts = rc.layouts
    capacity = gpu_capacity(rc)
    gpu_name = gpu_resources(k8s)[-1]
    largest = max((host_capacity(h, k8s, layouts)[gpu_name] for h in workers), default=0)
    sharing = f" ({k8s.time_slicing.replicas} time-sliced replicas per GPU)" if k8s.time_slicing else ""
    for name, tenant in k8s.tenants.items():
        loc: Loc = ("kubernetes", "tenants", name)
        if tenant.gpu_quota > capacity[gpu_name]:
            out.append(
                (
                    (*loc, "gpu_quota"),
                    f"{tenant.gpu_quota} {gpu_name} is more than the k8s_gpu_worker hosts provide: "
                    f"{capacity[gpu_name]}{sharing}",
                )
            )
        out.extend(_mig_quota_warnings(loc, tenant, k8s, capacity))
        limits = tenant.gpus_per_container
        if limits is None:
            continue
        if limits.max > largest:
            out.append(
                (
                    (*loc, "gpus_per_container", "max"),
                    f"{limits.max} {gpu_name} per container is more than any k8s_gpu_worker host has ({largest}), "
                    "so such a pod never schedules",
                )
            )
        ts = k8s.time_slicing
        if ts and ts.fail_requests_greater_than_one and limits.max > 1:
            out.append(
                (
                    (*loc, "gpus_per_container", "max"),
                    f"time-slicing rejects containers that ask for more than one shared GPU "
                    f"(fail_requests_greater_than_one), so a max of {limits.max} is never usable; set max: 1",
                )
            )
    out.extend(_overcommit_warnings(k8s, capacity, gpu_name, sharing))
    return out


def _operator_warnings(rc: ResolvedCluster, k8s: Kubernetes) -> list[tuple[Loc, str]]:
    out: list[tuple[Loc, str]] = []
    layouts = rc.layouts
    mig_hosts = [h for h in rc.with_role(WORKER_ROLE) if h.mig_layouts]
    if mig_hosts and k8s.mig_strategy == "none":
        groups = ", ".join(sorted({h.group for h in mig_hosts}))
        out.append(
            (
                ("kubernetes", "mig_strategy"),
                f"k8s_gpu_worker node groups {groups} have MIG layouts but mig_strategy is none, so the device plugin "
                "does not advertise their slices; set mixed (or single)",
            )
        )
    if k8s.mig_strategy == "single":
        for host in mig_hosts:
            profiles = {p for name in host.mig_layouts.values() for p in layouts.get(name, {})}
            if len(profiles) > 1 or len(host.mig_layouts) < host.gpu_count:
                out.append(
                    (
                        ("kubernetes", "mig_strategy"),
                        f"the single strategy needs every GPU of a node in MIG mode with one profile, but node group "
                        f"{host.group!r} has {', '.join(sorted(profiles))} on {len(host.mig_layouts)} of "
                        f"{host.gpu_count} GPUs; use mixed",
                    )
                )
                break
    driver = rc.model.driver
    if k8s.gpu_operator.driver == "operator" and driver is not None and driver.version is None:
        out.append(
            (
                ("driver", "branch"),
                f"the GPU Operator's driver container takes an exact version; with only branch {driver.branch} it "
                "installs its chart's default driver. Pin driver.version",
            )
        )
    return out


def _mig_quota_warnings(loc: Loc, tenant: Tenant, k8s: Kubernetes, capacity: Counter[str]) -> list[tuple[Loc, str]]:
    if not tenant.mig_quota:
        return []
    if k8s.mig_strategy != "mixed":
        return [
            (
                (*loc, "mig_quota"),
                f"MIG quotas need mig_strategy: mixed (it is {k8s.mig_strategy}); they are not applied",
            )
        ]
    out: list[tuple[Loc, str]] = []
    for profile, count in tenant.mig_quota.items():
        have = capacity[MIG_RESOURCE_PREFIX + profile]
        if have == 0:
            known = sorted(r.removeprefix(MIG_RESOURCE_PREFIX) for r in capacity if r.startswith(MIG_RESOURCE_PREFIX))
            out.append(
                (
                    (*loc, "mig_quota", profile),
                    f"no k8s_gpu_worker host has {profile} MIG slices (available: {', '.join(known) or 'none'})",
                )
            )
        elif count > have:
            out.append(
                (
                    (*loc, "mig_quota", profile),
                    f"{count} {profile} slices is more than the k8s_gpu_worker hosts provide: {have}",
                )
            )
    return out


def _overcommit_warnings(k8s: Kubernetes, capacity: Counter[str], gpu_name: str, sharing: str) -> list[tuple[Loc, str]]:
    """Quotas that fit one by one but not together (only with two or more tenants; one is reported above)."""
    out: list[tuple[Loc, str]] = []
    loc: Loc = ("kubernetes", "tenants")
    total = sum(t.gpu_quota for t in k8s.tenants.values())
    if total > capacity[gpu_name] and len(k8s.tenants) > 1:
        out.append(
            (
                loc,
                f"the tenants' gpu_quota add up to {total} {gpu_name}, more than the {capacity[gpu_name]} the "
                f"k8s_gpu_worker hosts provide{sharing}: quotas are overcommitted",
            )
        )
    if k8s.mig_strategy != "mixed":
        return out
    totals: Counter[str] = Counter()
    holders: Counter[str] = Counter()
    for tenant in k8s.tenants.values():
        totals.update(tenant.mig_quota)
        holders.update(tenant.mig_quota.keys())
    for profile, count in sorted(totals.items()):
        have = capacity[MIG_RESOURCE_PREFIX + profile]
        if have and count > have and holders[profile] > 1:
            out.append(
                (
                    loc,
                    f"the tenants' {profile} MIG quotas add up to {count}, more than the {have} slices the "
                    "k8s_gpu_worker hosts provide: quotas are overcommitted",
                )
            )
    return out
