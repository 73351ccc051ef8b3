"""Variables of the gpu_operator, k8s_tenants and kueue roles, the plan's Kubernetes artifacts, and GPU capacity
warnings.

Kubernetes node names are the inventory host names. MIG layouts reach the operator's MIG manager as the same
mig-parted configuration the mig role writes on other hosts (see `mig.py` beside this module); each GPU node is
labelled with the configuration it applies.
"""

from __future__ import annotations

import re
from typing import Any

from ...k8s_resources import MIG_RESOURCE_PREFIX, WORKER_ROLE, gpu_resources, queue_quota, worker_gpu_models
from ...model.grammar import duration_seconds
from ...model.kubernetes import Kubernetes, Queues, Tenant
from ...model.nodes import NodeGroup
from ...resolve import ResolvedCluster
from ..artifacts import Artifact
from . import LEFT_OUT
from . import mig as mig_vars

ARTIFACTS: tuple[Artifact, ...] = (
    Artifact("gpu-operator/values.yaml", "gpu_operator", "values.yaml.j2", "k8s_control"),
    Artifact("gpu-operator/namespace.yaml", "gpu_operator", "namespace.yaml.j2", "k8s_control"),
    Artifact("gpu-operator/mig-parted-configmap.yaml", "gpu_operator", "mig-parted-configmap.yaml.j2", "k8s_control"),
    Artifact(
        "gpu-operator/device-plugin-configmap.yaml", "gpu_operator", "device-plugin-configmap.yaml.j2", "k8s_control"
    ),
    Artifact("k8s-tenants/tenants.yaml", "k8s_tenants", "tenants.yaml.j2", "k8s_control"),
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


def _ceiling(own: int, everyone: int, borrowing_limit: int | None) -> int:
    """What a team's namespace may hold with queues on: its quota plus what it may borrow, at most the cohort's."""
    return everyone if borrowing_limit is None else min(everyone, own + borrowing_limit)


def _tenant(name: str, tenant: Tenant, k8s: Kubernetes) -> dict[str, Any]:
    limits = tenant.gpus_per_container
    # MIG resources exist only under the mixed strategy; capacity_warnings says so when they are dropped.
    mig_quota = dict(sorted(tenant.mig_quota.items())) if k8s.mig_strategy == "mixed" else {}
    gpu_quota = tenant.gpu_quota
    if k8s.queues is not None:  # Kueue admits within the quota and what may be borrowed; the ResourceQuota backs it
        borrowing = tenant.queue.borrowing_limit
        gpu_quota = _ceiling(gpu_quota, sum(t.gpu_quota for t in k8s.tenants.values()), borrowing)
        mig_quota = {
            profile: _ceiling(count, sum(t.mig_quota.get(profile, 0) for t in k8s.tenants.values()), borrowing)
            for profile, count in mig_quota.items()
        }
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
                "labels": {**k8s.gpu_node_labels, **group.labels, **_model_label(group)},
                "taints": cluster_taints + [t for t in own if t not in cluster_taints],
            }
        )
    return {
        "k8s_tenants_tenants": {name: _tenant(name, t, k8s) for name, t in k8s.tenants.items()},
        "k8s_tenants_gpu_resources": gpu_resources(k8s),
        "k8s_tenants_mig_resource_prefix": MIG_RESOURCE_PREFIX,
        "k8s_tenants_nodes": nodes,
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
        limits = {} if borrowing is None else {"borrowingLimit": borrowing}
        if lending is not None:  # a team lends at most what it has of this flavor
            limits["lendingLimit"] = min(lending, nominal)
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
