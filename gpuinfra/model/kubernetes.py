"""Kubernetes with the NVIDIA GPU Operator: operator settings, GPU sharing and tenants."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from ..validate.grammar import (
    ChartVersion,
    CountOrPercentage,
    DnsLabel,
    DnsSubdomain,
    LabelKey,
    LabelValue,
    MigProfileName,
    Name,
    NonNegativeInt,
    PositiveInt,
    Text,
)
from .base import Model
from .nodes import Taint


class OperatorUpgrade(Model):
    """How the operator rolls out a new driver container (only when it owns the driver)."""

    auto_upgrade: bool = True
    """Let the operator upgrade the driver node by node when its version changes."""
    max_parallel_upgrades: NonNegativeInt = 1
    """Nodes upgraded at once; 0 means all of them."""
    max_unavailable: CountOrPercentage = "25%"
    """GPU nodes that may be unavailable during an upgrade: a count ('2') or a share of them ('25%')."""
    drain: bool = False
    """Also drain the node (`kubectl drain`) before reloading the driver; GPU pods are always evicted."""
    drain_timeout_seconds: NonNegativeInt = 300
    """How long to wait for GPU pods to go (and for the drain, when `drain` is on); 0 waits forever."""
    drain_delete_emptydir_data: bool = False
    """Evict pods that use emptyDir volumes too (their data is lost)."""


class GpuOperator(Model):
    chart_version: ChartVersion = "v26.7.0"
    """Version of the `gpu-operator` Helm chart."""
    namespace: DnsLabel = "gpu-operator"
    """Namespace the operator and its operands run in."""
    driver: Literal["host", "operator"] = "host"
    """`host`: the nvidia_driver role owns the driver; `operator`: the operator's driver container does."""
    toolkit: Literal["host", "operator"] = "host"
    """`host`: the nvidia_container_toolkit role configures the runtime; `operator`: the operator's toolkit container
    does (it then configures `container_runtime`)."""
    container_runtime: Literal["containerd", "cri-o"] = "containerd"
    """The runtime the kubelet uses, which the operator's toolkit container configures."""
    use_precompiled: bool = False
    """Precompiled (signed) driver containers, for secure boot."""
    repo_config_map: DnsSubdomain | None = None
    """ConfigMap holding repository files for a package mirror."""
    upgrade: OperatorUpgrade = OperatorUpgrade()
    dcgm_exporter: bool = True
    """Run the operator's DCGM exporter on every GPU node."""
    service_monitor: bool = True
    """Create a ServiceMonitor for the DCGM exporter (needs the Prometheus operator CRDs)."""
    extra_values: dict[str, Any] = {}
    """More values for the chart, given to Helm after gpuinfra's (they win where both set a key). Each key must be a
    value of the chart version gpuinfra pins (Helm would ignore any other without a word); strings are single-line,
    without template delimiters."""


class TimeSlicing(Model):
    replicas: Annotated[int, Field(ge=2, le=64)]
    """Pods that may share one GPU."""
    rename_by_default: bool = False
    """Advertise shared GPUs as `nvidia.com/gpu.shared` instead of `nvidia.com/gpu`."""
    fail_requests_greater_than_one: bool = True
    """Reject containers that ask for more than one shared GPU (a second replica gives no more compute)."""


class GpusPerContainer(Model):
    min: NonNegativeInt = 0
    """Least `nvidia.com/gpu` a container must ask for; above 0 every container of the namespace must ask."""
    max: PositiveInt
    """Most `nvidia.com/gpu` one container may ask for."""


class Subject(Model):
    kind: Literal["User", "Group", "ServiceAccount"]
    name: Text
    """User or group name as the cluster's authenticator reports it, or the service account's name."""
    namespace: DnsLabel | None = None
    """Only for ServiceAccount subjects; defaults to the tenant's namespace."""


class Tenant(Model):
    namespace: DnsLabel | None = None
    """Kubernetes namespace; defaults to the tenant's name."""
    gpu_quota: NonNegativeInt = 0
    """requests.nvidia.com/gpu for the namespace."""
    mig_quota: dict[MigProfileName, NonNegativeInt] = {}
    """Per MIG profile quota, e.g. {1g.10gb: 7}; used with the mixed strategy."""
    gpus_per_container: GpusPerContainer | None = None
    """Most `nvidia.com/gpu` per container (a LimitRange); unset leaves containers unbounded below the quota."""
    subjects: list[Subject] = []
    """Who gets `access` to the namespace."""
    access: Literal["edit", "view", "admin"] = "edit"
    """Built-in ClusterRole the subjects are bound to inside the namespace."""


class Kubernetes(Model):
    gpu_operator: GpuOperator = GpuOperator()
    mig_strategy: Literal["none", "single", "mixed"] = "none"
    """How MIG slices are advertised: `single` as `nvidia.com/gpu` (one profile per node), `mixed` as
    `nvidia.com/mig-<profile>`; `none` leaves MIG alone."""
    time_slicing: TimeSlicing | None = None
    """Share each full GPU between several pods (no memory or fault isolation between them)."""
    tenants: dict[Name, Tenant] = {}
    """Teams, each with a namespace, GPU quotas, limits and access."""
    gpu_node_taints: list[Taint] = [Taint(key="nvidia.com/gpu", value="present", effect="NoSchedule")]
    """Taints on every k8s_gpu_worker node, so that only pods that tolerate them land there."""
    gpu_node_labels: dict[LabelKey, LabelValue] = {}
    """Labels on every k8s_gpu_worker node (node groups add their own)."""
