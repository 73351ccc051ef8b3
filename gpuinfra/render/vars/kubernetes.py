"""Variables of the gpu_operator and k8s_tenants roles, the plan's Kubernetes artifacts, and GPU capacity warnings.

Kubernetes node names are the inventory host names. MIG layouts reach the operator's MIG manager as the same
mig-parted configuration the mig role writes on other hosts (see `mig.py` beside this module); each GPU node is
labelled with the configuration it applies.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from ...model.kubernetes import Kubernetes, Tenant
from ...resolve import Host, ResolvedCluster
from ..artifacts import Artifact
from . import mig as mig_vars

ARTIFACTS: tuple[Artifact, ...] = (
    Artifact("gpu-operator/values.yaml", "gpu_operator", "values.yaml.j2", "k8s_control"),
    Artifact("gpu-operator/namespace.yaml", "gpu_operator", "namespace.yaml.j2", "k8s_control"),
    Artifact("gpu-operator/mig-parted-configmap.yaml", "gpu_operator", "mig-parted-configmap.yaml.j2", "k8s_control"),
    Artifact(
        "gpu-operator/device-plugin-configmap.yaml", "gpu_operator", "device-plugin-configmap.yaml.j2", "k8s_control"
    ),
    Artifact("k8s-tenants/tenants.yaml", "k8s_tenants", "tenants.yaml.j2", "k8s_control"),
)

GPU_RESOURCE = "nvidia.com/gpu"
SHARED_GPU_RESOURCE = "nvidia.com/gpu.shared"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
WORKER_ROLE = "k8s_gpu_worker"

Loc = tuple[str | int, ...]


def group_vars(rc: ResolvedCluster) -> dict[str, Any]:
    k8s = rc.model.kubernetes
    if k8s is None:
        return {}
    return {**_operator_vars(rc, k8s), **_tenant_vars(rc, k8s)}


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


def gpu_resources(k8s: Kubernetes) -> list[str]:
    """The extended resources a tenant's gpu_quota limits; the last is the one full GPUs are advertised as."""
    if k8s.time_slicing and k8s.time_slicing.rename_by_default:
        return [GPU_RESOURCE, SHARED_GPU_RESOURCE]
    return [GPU_RESOURCE]


def _tenant(name: str, tenant: Tenant, mixed: bool) -> dict[str, Any]:
    limits = tenant.gpus_per_container
    return {
        "namespace": tenant.namespace or name,
        "gpu_quota": tenant.gpu_quota,
        # MIG resources exist only under the mixed strategy; capacity_warnings says so when they are dropped.
        "mig_quota": dict(sorted(tenant.mig_quota.items())) if mixed else {},
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
                "labels": {**k8s.gpu_node_labels, **group.labels},
                "taints": cluster_taints + [t for t in own if t not in cluster_taints],
            }
        )
    return {
        "k8s_tenants_tenants": {name: _tenant(name, t, k8s.mig_strategy == "mixed") for name, t in k8s.tenants.items()},
        "k8s_tenants_gpu_resources": gpu_resources(k8s),
        "k8s_tenants_mig_resource_prefix": MIG_RESOURCE_PREFIX,
        "k8s_tenants_nodes": nodes,
    }


# --- capacity --------------------------------------------------------------------------------------------------


def host_capacity(host: Host, k8s: Kubernetes, layouts: dict[str, dict[str, int]]) -> Counter[str]:
    """Extended resources one GPU worker advertises: full GPUs (times time-slicing replicas) and MIG slices.

    Under `mixed` each slice is `nvidia.com/mig-<profile>`; under `single` slices count as `nvidia.com/gpu` (and are
    time-sliced like full GPUs); under `none` the device plugin ignores MIG and advertises nothing for those GPUs.
    """
    out: Counter[str] = Counter()
    mig_gpus = [i for i in host.mig_layouts if i < host.gpu_count]
    full = host.gpu_count - len(mig_gpus)
    slices: Counter[str] = Counter()
    for index in mig_gpus:
        slices.update(layouts.get(host.mig_layouts[index], {}))
    if k8s.mig_strategy == "mixed":
        for profile, count in slices.items():
            out[MIG_RESOURCE_PREFIX + profile] += count
    elif k8s.mig_strategy == "single":
        full += sum(slices.values())
    replicas = k8s.time_slicing.replicas if k8s.time_slicing else 1
    if full:
        out[gpu_resources(k8s)[-1]] += full * replicas
    return out


def gpu_capacity(rc: ResolvedCluster) -> Counter[str]:
    """Extended resources all k8s_gpu_worker hosts advertise together."""
    k8s = rc.model.kubernetes
    total: Counter[str] = Counter()
    if k8s is None:
        return total
    layouts = mig_vars.layouts(rc)
    for host in rc.with_role(WORKER_ROLE):
        total.update(host_capacity(host, k8s, layouts))
    return total


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
    layouts = mig_vars.layouts(rc)
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
        if limits.min > limits.max:
            out.append(((*loc, "gpus_per_container", "min"), f"min {limits.min} is above max {limits.max}"))
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
    layouts = mig_vars.layouts(rc)
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
