"""Variables of the gpu_operator, k8s_tenants and kueue roles, the plan's Kubernetes artifacts, and GPU capacity
warnings.

Kubernetes node names are the inventory host names. MIG layouts reach the operator's MIG manager as the same
mig-parted configuration the mig role writes on other hosts (see `mig.py` beside this module); each GPU node is
labelled with the configuration it applies.
"""

from __future__ import annotations

import re
from typing import Any

from ...k8s_resources import (
    MIG_RESOURCE_PREFIX,
    NODE_GROUP_LABEL,
    WORKER_ROLE,
    gpu_capacity,
    gpu_resources,
    queue_quota,
    worker_gpu_models,
)
from ...model.grammar import duration_seconds
from ...model.kubernetes import Kubernetes, Queues, Tenant
from ...model.nodes import NodeGroup
from ...resolve import ResolvedCluster
from ..artifacts import Artifact
from . import LEFT_OUT
from . import mig as mig_vars
from .concern import Concern

ARTIFACTS: tuple[Artifact, ...] = (
    Artifact("gpu-operator/values.yaml", "gpu_operator", "values.yaml.j2", "k8s_control"),
    Artifact("gpu-operator/namespace.yaml", "gpu_operator", "namespace.yaml.j2", "k8s_control"),
    Artifact("gpu-operator/mig-parted-configmap.yaml", "gpu_operator", "mig-parted-configmap.yaml.j2", "k8s_control"),
    Artifact(
        "gpu-operator/device-plugin-configmap.yaml", "gpu_operator", "device-plugin-configmap.yaml.j2", "k8s_control"
    ),
    Artifact("k8s-tenants/tenants.yaml", "k8s_tenants", "tenants.yaml.j2", "k8s_control"),
    Artifact("k8s-tenants/alert-rules.yaml", "k8s_tenants", "alert-rules.yaml.j2", "k8s_control"),
    Artifact("kueue/values.yaml", "kueue", "values.yaml.j2", "k8s_control"),
    Artifact("kueue/queues.yaml", "kueue", "queues.yaml.j2", "k8s_control"),
    # The health program's identity on each GPU node (k8s_node_health); the role's defaults take the nodes from the
    # k8s_gpu_worker group.
    Artifact("k8s-node-health/identities.yaml", "k8s_node_health", "identities.yaml.j2", WORKER_ROLE),
)


def group_vars(rc: ResolvedCluster) -> dict[str, Any]:
    k8s = rc.model.kubernetes
    if k8s is None:
        return {}
    return {**_operator_vars(rc, k8s), **_tenant_vars(rc, k8s), **_queue_vars(rc, k8s)}


def _operator_vars(rc: ResolvedCluster, k8s: Kubernetes) -> dict[str, Any]:
    op = k8s.gpu_operator
    driver = rc.model.driver
    workers = rc.with_role(WORKER_ROLE)
    mig_config = mig_vars.parted_config(rc, workers) if any(h.mig_layouts for h in workers) else {}
    ts = k8s.time_slicing
    return {
        "gpu_operator_chart_version": op.chart_version,
        "gpu_operator_namespace": op.namespace,
        "gpu_operator_driver_enabled": op.driver == "operator",
        "gpu_operator_driver_version": str(driver.version) if driver and driver.version else "",
        "gpu_operator_driver_kernel_module_type": driver.kernel_modules if driver else "auto",
        "gpu_operator_driver_use_precompiled": op.use_precompiled,
        "gpu_operator_driver_repo_config_map": op.repo_config_map or "",
        "gpu_operator_driver_auto_upgrade": op.upgrade.auto_upgrade,
        "gpu_operator_driver_max_parallel_upgrades": op.upgrade.max_parallel_upgrades,
        "gpu_operator_driver_max_unavailable": op.upgrade.max_unavailable,
        "gpu_operator_driver_drain": op.upgrade.drain,
        "gpu_operator_driver_drain_timeout_seconds": op.upgrade.drain_timeout_seconds,
        "gpu_operator_driver_drain_delete_emptydir_data": op.upgrade.drain_delete_emptydir_data,
        "gpu_operator_toolkit_enabled": op.toolkit == "operator",
        "gpu_operator_container_runtime": op.container_runtime,
        "gpu_operator_cdi_enabled": rc.model.container_toolkit.cdi,
        "gpu_operator_mig_strategy": k8s.mig_strategy,
        "gpu_operator_mig_parted_config": mig_config,
        "gpu_operator_mig_node_configs": mig_vars.host_configs(rc, workers) if mig_config else {},
        "gpu_operator_time_slicing_replicas": ts.replicas if ts else 0,
        "gpu_operator_time_slicing_rename_by_default": ts.rename_by_default if ts else False,
        "gpu_operator_time_slicing_fail_requests_greater_than_one": ts.fail_requests_greater_than_one if ts else True,
        "gpu_operator_daemonset_tolerations": daemonset_tolerations(rc, k8s),
        "gpu_operator_dcgm_exporter_enabled": op.dcgm_exporter,
        "gpu_operator_service_monitor_enabled": op.service_monitor,
        "gpu_operator_extra_values": op.extra_values,
    }


def daemonset_tolerations(rc: ResolvedCluster, k8s: Kubernetes) -> list[dict[str, str]]:
    """Tolerations for every taint on the GPU workers (the cluster's and each group's), so that the operator's
    daemonsets run there; nvidia.com/gpu is always tolerated, as the chart does by default."""
    out = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    taints = list(k8s.gpu_node_taints)
    for group in rc.model.node_groups.values():
        if WORKER_ROLE in group.roles:
            taints.extend(group.taints)
    for taint in taints:
        toleration = {"key": taint.key, "operator": "Exists", "effect": taint.effect}
        if toleration not in out:
            out.append(toleration)
    return out


def _lendable(quota: int, lending_limit: int | None) -> int:
    """What a team lends of one flavor's resource: its lending limit, at most its quota (Kueue's lendingLimit)."""
    return quota if lending_limit is None else min(lending_limit, quota)


def _borrowable(borrowing_limit: int, others: list[tuple[int, int | None]]) -> int:
    """The most a team can borrow of one flavor's resource: its borrowing limit, at most what the others lend."""
    return min(borrowing_limit, sum(_lendable(quota, lending) for quota, lending in others))


def _mig_profiles(rc: ResolvedCluster, k8s: Kubernetes) -> list[str]:
    """Every MIG profile a tenant could ask for under the mixed strategy: those the workers advertise and those any
    quota names. A ResourceQuota leaves a resource it does not list unbounded, so each namespace lists them all."""
    if k8s.mig_strategy != "mixed":  # the resources exist only then; capacity_warnings says so when quotas are dropped
        return []
    advertised = {r.removeprefix(MIG_RESOURCE_PREFIX) for r in gpu_capacity(rc) if r.startswith(MIG_RESOURCE_PREFIX)}
    return sorted(advertised | {p for t in k8s.tenants.values() for p in t.mig_quota})


def _namespace_quota(rc: ResolvedCluster, k8s: Kubernetes, name: str) -> tuple[int, dict[str, int]]:
    """A team's ResourceQuota: full GPUs and slices per MIG profile (0 for those it has no quota of).

    It is what bounds the team wherever Kueue does not admit its pods (before Kueue is installed, without it, or a
    pod Kueue does not manage), so it is the team's own quota plus no more than its queue may borrow: the borrowing
    limit of each flavor, at most what the other teams lend of it. Kueue never admits more, so the ResourceQuota
    never refuses a pod of an admitted job; borrowing is always bounded (the model refuses an unbounded limit)."""
    tenant = k8s.tenants[name]
    gpus = tenant.gpu_quota
    mig = {p: tenant.mig_quota.get(p, 0) for p in _mig_profiles(rc, k8s)}
    if k8s.queues is None:
        return gpus, mig
    borrowing = tenant.queue.borrowing_limit
    others = [t for other, t in k8s.tenants.items() if other != name]
    for model in worker_gpu_models(rc):  # one flavor per model, each with its own borrowing limit
        gpus += _borrowable(borrowing, [(queue_quota(rc, t).get(model, 0), t.queue.lending_limit) for t in others])
    for profile in mig:
        mig[profile] += _borrowable(borrowing, [(t.mig_quota.get(profile, 0), t.queue.lending_limit) for t in others])
    return gpus, mig


def _tenant(rc: ResolvedCluster, k8s: Kubernetes, name: str) -> dict[str, Any]:
    tenant = k8s.tenants[name]
    limits = tenant.gpus_per_container
    gpu_quota, mig_quota = _namespace_quota(rc, k8s, name)
    return {
        "namespace": tenant.namespace or name,
        "gpu_quota": gpu_quota,
        "mig_quota": mig_quota,
        "gpus_per_container": {"min": limits.min, "max": limits.max} if limits else None,
        "subjects": [s.model_dump(exclude_none=True) for s in tenant.subjects],
        "access": tenant.access,
    }


def _tenant_vars(rc: ResolvedCluster, k8s: Kubernetes) -> dict[str, Any]:
    nodes: list[dict[str, Any]] = []
    cluster_taints = [t.model_dump() for t in k8s.gpu_node_taints]
    for name, group in rc.model.node_groups.items():
        if WORKER_ROLE not in group.roles:
            continue
        own = [t.model_dump() for t in group.taints]
        nodes.append(
            {
                "nodes": [h.name for h in rc.hosts.values() if h.group == name],
                "labels": {**k8s.gpu_node_labels, **group.labels, **_model_label(group), NODE_GROUP_LABEL: name},
                "taints": cluster_taints + [t for t in own if t not in cluster_taints],
            }
        )
    return {
        "k8s_tenants_tenants": {name: _tenant(rc, k8s, name) for name in k8s.tenants},
        "k8s_tenants_gpu_resources": gpu_resources(k8s),
        "k8s_tenants_mig_resource_prefix": MIG_RESOURCE_PREFIX,
        "k8s_tenants_nodes": nodes,
        "k8s_tenants_alert_rules": k8s.alert_rules,
        "k8s_tenants_alert_rule_labels": dict(k8s.alert_rule_labels),
        "k8s_tenants_alert_rules_namespace": k8s.gpu_operator.namespace,
    }


# The label gpuinfra puts on each GPU worker with its GPU model: what a Kueue ResourceFlavor selects.
MODEL_LABEL = "gpuinfra.io/gpu-model"
MIG_FLAVOR = "mig"


def flavor_name(model: str) -> str:
    """A GPU model as a ResourceFlavor name and label value: lower case, '-' for what DNS names lack."""
    return re.sub(r"[^a-z0-9.-]", "-", model.lower()).strip(".-")


def _model_label(group: NodeGroup) -> dict[str, str]:
    return {MODEL_LABEL: flavor_name(group.gpu.model)} if group.gpu else {}


def _queue_vars(rc: ResolvedCluster, k8s: Kubernetes) -> dict[str, Any]:
    queues = k8s.queues
    if queues is None:
        return {LEFT_OUT: ["kueue"]}
    tolerations = daemonset_tolerations(rc, k8s)
    models = worker_gpu_models(rc)
    flavors = [{"name": flavor_name(m), "node_labels": {MODEL_LABEL: flavor_name(m)}} for m in models]
    profiles = sorted({p for t in k8s.tenants.values() for p in t.mig_quota}) if k8s.mig_strategy == "mixed" else []
    if profiles:
        flavors.append({"name": MIG_FLAVOR, "node_labels": {}})
    return {
        "kueue_chart_version": queues.chart_version,
        "kueue_namespace": queues.namespace,
        "kueue_managed_namespaces": sorted(t.namespace or name for name, t in k8s.tenants.items()),
        "kueue_all_pods_ready_timeout": (
            f"{duration_seconds(queues.all_pods_ready_within)}s" if queues.all_pods_ready_within else ""
        ),
        "kueue_flavors": [{**f, "tolerations": tolerations} for f in flavors],
        "kueue_priorities": dict(sorted(queues.priorities.items())),
        "kueue_cluster_queues": [
            _cluster_queue(rc, k8s, queues, name, tenant, profiles) for name, tenant in sorted(k8s.tenants.items())
        ],
    }


def _cluster_queue(
    rc: ResolvedCluster, k8s: Kubernetes, queues: Queues, name: str, tenant: Tenant, profiles: list[str]
) -> dict[str, Any]:
    """One team's ClusterQueue: its GPUs per model (one flavor each) and, under mixed MIG, its slices per profile."""
    borrowing, lending = tenant.queue.borrowing_limit, tenant.queue.lending_limit

    def resources(names: list[str], nominal: int) -> list[dict[str, Any]]:
        # Always a borrowing limit: the namespace's ResourceQuota, which bounds the team without Kueue, allows it.
        limits = {"borrowingLimit": borrowing}
        if lending is not None:  # a team lends at most what it has of this flavor
            limits["lendingLimit"] = _lendable(nominal, lending)
        return [{"name": resource, "nominalQuota": nominal, **limits} for resource in names]

    quota = queue_quota(rc, tenant)
    covered = gpu_resources(k8s)
    groups = [
        {
            "coveredResources": covered,
            "flavors": [
                {"name": flavor_name(m), "resources": resources(covered, quota.get(m, 0))}
                for m in worker_gpu_models(rc)
            ],
        }
    ]
    if profiles:
        mig = [MIG_RESOURCE_PREFIX + p for p in profiles]
        groups.append(
            {
                "coveredResources": mig,
                "flavors": [
                    {
                        "name": MIG_FLAVOR,
                        "resources": [
                            r
                            for p, resource in zip(profiles, mig, strict=True)
                            for r in resources([resource], tenant.mig_quota.get(p, 0))
                        ],
                    }
                ],
            }
        )
    preemption = queues.preemption
    return {
        "name": tenant.namespace or name,
        "namespace": tenant.namespace or name,
        "cohort": queues.cohort,
        "resource_groups": groups,
        "preemption": {
            "withinClusterQueue": preemption.within_team,
            "reclaimWithinCohort": preemption.reclaim,
            "borrowWithinCohort": {"policy": preemption.borrow_within_cohort},
        },
    }


CONCERN = Concern("kubernetes", ARTIFACTS, group_vars)
