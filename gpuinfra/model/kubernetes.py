"""Kubernetes with the NVIDIA GPU Operator: operator settings, GPU sharing, tenants and their queues (Kueue)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, field_validator

from .base import Model
from .grammar import (
    ChartVersion,
    CountOrPercentage,
    DnsLabel,
    DnsSubdomain,
    Duration,
    GpuModelName,
    LabelKey,
    LabelValue,
    MigProfileName,
    Name,
    NonNegativeInt,
    PositiveInt,
    Text,
)
from .nodes import Taint

UNBOUNDED_BORROWING = (
    "borrowing must be bounded: the namespace's ResourceQuota would have to allow every GPU of the cohort, and it "
    "is what bounds the team where Kueue does not admit its pods (before Kueue is installed, or without it); give "
    "the most GPUs of each model the team may borrow (0: none)"
)


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


class TenantQueue(Model):
    """The team's ClusterQueue in the cohort (only with `kubernetes.queues`)."""

    gpus: dict[GpuModelName, NonNegativeInt] = {}
    """The team's quota per GPU model, which must add up to its gpu_quota; empty puts all of gpu_quota on the
    cluster's only GPU model."""
    borrowing_limit: NonNegativeInt = 0
    """GPUs of each model (and slices of each MIG profile) the team may use beyond its quota while other teams leave
    theirs idle; 0: none. The namespace's ResourceQuota is raised by what this lets the team borrow, and bounds it
    wherever Kueue does not admit its pods, so borrowing is always bounded."""
    lending_limit: NonNegativeInt | None = None
    """GPUs of each model other teams may borrow from this team's idle quota (at most its quota of the model);
    unset: all of it."""

    @field_validator("borrowing_limit", mode="before")
    @classmethod
    def _bounded(cls, value: object) -> object:
        # Null is Kueue's "no limit": say why gpuinfra refuses it, not just that it is no number.
        if value is None or (isinstance(value, str) and not value.isdigit()):
            raise ValueError(UNBOUNDED_BORROWING)
        return value


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
    queue: TenantQueue = TenantQueue()
    """The team's queue, with `kubernetes.queues`."""


class QueuePreemption(Model):
    """What a waiting job may evict (Kueue's ClusterQueue preemption)."""

    within_team: Literal["Never", "LowerPriority", "LowerOrNewerEqualPriority"] = "LowerPriority"
    """Inside the team's own quota: evict the team's lower-priority jobs."""
    reclaim: Literal["Never", "LowerPriority", "Any"] = "Any"
    """A team within its quota takes back GPUs other teams borrowed: `Any` evicts borrowers whatever their
    priority, `LowerPriority` only lower-priority ones."""
    borrow_within_cohort: Literal["Never", "LowerPriority"] = "Never"
    """A job that needs to borrow may evict lower-priority jobs of other teams; needs `reclaim` other than Never."""


class Queues(Model):
    """Kueue: each tenant gets a ClusterQueue in one cohort and a LocalQueue named `default` in its namespace, so
    a team borrows what others leave idle, waits in order instead of failing on its ResourceQuota, and a job with
    several pods is admitted whole or not at all."""

    chart_version: ChartVersion = "0.19.2"
    """Version of the `kueue` Helm chart (its CRDs at v1beta2)."""
    namespace: DnsLabel = "kueue-system"
    cohort: DnsLabel = "gpuinfra"
    """The cohort every team's ClusterQueue belongs to: the teams that lend to and borrow from each other."""
    preemption: QueuePreemption = QueuePreemption()
    priorities: dict[DnsLabel, Annotated[int, Field(ge=-(2**31), le=2**31 - 1)]] = {}
    """WorkloadPriorityClasses by name and value, chosen by a job's `kueue.x-k8s.io/priority-class` label."""
    all_pods_ready_within: Duration | None = "10m"
    """All-or-nothing: a job whose pods are not all running this long after admission gives its quota back and
    waits again (Kueue's waitForPodsReady); unset: admission alone counts."""


class Kubernetes(Model):
    gpu_operator: GpuOperator = GpuOperator()
    mig_strategy: Literal["none", "single", "mixed"] = "none"
    """How MIG slices are advertised: `single` as `nvidia.com/gpu` (one profile per node), `mixed` as
    `nvidia.com/mig-<profile>`; `none` leaves MIG alone."""
    time_slicing: TimeSlicing | None = None
    """Share each full GPU between several pods (no memory or fault isolation between them)."""
    tenants: dict[Name, Tenant] = {}
    """Teams, each with a namespace, GPU quotas, limits and access."""
    queues: Queues | None = None
    """Queue the teams' jobs with Kueue; unset: the ResourceQuota alone refuses what is over a team's quota."""
    gpu_node_taints: list[Taint] = [Taint(key="nvidia.com/gpu", value="present", effect="NoSchedule")]
    """Taints on every k8s_gpu_worker node, so that only pods that tolerate them land there."""
    gpu_node_labels: dict[LabelKey, LabelValue] = {}
    """Labels on every k8s_gpu_worker node (node groups add their own)."""
    alert_rules: bool = True
    """Alert when a tenant's container is killed for running out of memory (`KubernetesContainerOOMKilled`): a
    PrometheusRule for the cluster's own Prometheus, from kube-state-metrics' series (needs the Prometheus operator's
    CRDs)."""
    alert_rule_labels: dict[LabelKey, LabelValue] = {}
    """Labels of that PrometheusRule, for the cluster's Prometheus to select it (kube-prometheus-stack's selects
    `release: <its release>` unless told otherwise)."""
