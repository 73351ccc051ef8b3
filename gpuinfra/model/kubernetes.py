"""Kubernetes with the NVIDIA GPU Operator: operator settings, GPU sharing and tenants."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from .base import Model, Name, NonNegativeInt, PositiveInt
from .nodes import Taint


class OperatorUpgrade(Model):
    auto_upgrade: bool = True
    max_parallel_upgrades: NonNegativeInt = 1
    max_unavailable: Annotated[str, Field(pattern=r"^[0-9]+%?$")] = "25%"
    drain_timeout_seconds: NonNegativeInt = 300
    drain_delete_emptydir_data: bool = False


class GpuOperator(Model):
    chart_version: str = "v25.10.0"
    namespace: str = "gpu-operator"
    driver: Literal["host", "operator"] = "host"
    """`host`: the nvidia_driver role owns the driver; `operator`: the operator's driver container does."""
    use_precompiled: bool = False
    """Precompiled (signed) driver containers, for secure boot."""
    repo_config_map: str | None = None
    """ConfigMap holding repository files for a package mirror."""
    upgrade: OperatorUpgrade = OperatorUpgrade()
    dcgm_exporter: bool = True
    service_monitor: bool = True
    """Create a ServiceMonitor for the DCGM exporter (needs the Prometheus operator CRDs)."""


class TimeSlicing(Model):
    replicas: Annotated[int, Field(ge=2, le=64)]
    """Pods that may share one GPU."""
    rename_by_default: bool = False
    fail_requests_greater_than_one: bool = True


class GpusPerContainer(Model):
    min: NonNegativeInt = 0
    max: PositiveInt


class Subject(Model):
    kind: Literal["User", "Group", "ServiceAccount"]
    name: str
    namespace: str | None = None
    """Only for ServiceAccount subjects."""


class Tenant(Model):
    namespace: Name | None = None
    """Defaults to the tenant's name."""
    gpu_quota: NonNegativeInt = 0
    """requests.nvidia.com/gpu for the namespace."""
    mig_quota: dict[str, NonNegativeInt] = {}
    """Per MIG profile quota, e.g. {1g.10gb: 7}; used with the mixed strategy."""
    gpus_per_container: GpusPerContainer | None = None
    subjects: list[Subject] = []
    access: Literal["edit", "view", "admin"] = "edit"


class Kubernetes(Model):
    gpu_operator: GpuOperator = GpuOperator()
    mig_strategy: Literal["none", "single", "mixed"] = "none"
    time_slicing: TimeSlicing | None = None
    tenants: dict[Name, Tenant] = {}
    gpu_node_taints: list[Taint] = [Taint(key="nvidia.com/gpu", value="present", effect="NoSchedule")]
    gpu_node_labels: dict[str, str] = {}
