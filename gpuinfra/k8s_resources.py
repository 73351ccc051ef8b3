"""What the GPU workers advertise to Kubernetes (full GPUs, time-sliced replicas, MIG slices per profile) and what
the teams' quotas and queues cover: read by the Kubernetes rules (gpuinfra.validate.kubernetes) and the roles'
variables (gpuinfra.render.vars.kubernetes)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

from .model.kubernetes import Kubernetes, Tenant
from .resolve import Host, ResolvedCluster

GPU_RESOURCE = "nvidia.com/gpu"
SHARED_GPU_RESOURCE = "nvidia.com/gpu.shared"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
WORKER_ROLE = "k8s_gpu_worker"
K8S_ROLES = {"k8s_control", WORKER_ROLE}
# The label gpuinfra puts on each GPU worker with its node group: the pool in which the node health program's breaker
# counts tainted nodes. A label value has at most 63 characters.
NODE_GROUP_LABEL = "gpuinfra.io/node-group"
LABEL_VALUE_LENGTH = 63


def worker_gpu_models(rc: ResolvedCluster) -> list[str]:
    """The GPU models of the k8s_gpu_worker hosts: one Kueue ResourceFlavor each."""
    return sorted({h.gpu_model for h in rc.with_role(WORKER_ROLE) if h.gpu_model})


def queue_quota(rc: ResolvedCluster, tenant: Tenant) -> dict[str, int]:
    """The team's nominal quota of full GPUs per model: its queue's split, or all of gpu_quota on the only model."""
    if tenant.queue.gpus:
        return dict(tenant.queue.gpus)
    models = worker_gpu_models(rc)
    return {models[0]: tenant.gpu_quota} if len(models) == 1 else {}


def gpu_resources(k8s: Kubernetes) -> list[str]:
    """The extended resources a tenant's gpu_quota limits; the last is the one full GPUs are advertised as."""
    if k8s.time_slicing and k8s.time_slicing.rename_by_default:
        return [GPU_RESOURCE, SHARED_GPU_RESOURCE]
    return [GPU_RESOURCE]


def host_capacity(host: Host, k8s: Kubernetes, layouts: Mapping[str, Mapping[str, int]]) -> Counter[str]:
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
    layouts = rc.layouts
    for host in rc.with_role(WORKER_ROLE):
        total.update(host_capacity(host, k8s, layouts))
    return total
