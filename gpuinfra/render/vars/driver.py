"""The NVIDIA driver, its kernel gate and the kernel updates it survives: role variables from `driver:` and
`kernel:` in the cluster file.

Roles: nvidia_driver, gpu_kernel_gate, kernel_updates (and gpu_preflight, which needs nothing from the model).
"""

from __future__ import annotations

from typing import Any

from ...model.driver import DistributionSource, Driver
from ...resolve import Host, ResolvedCluster
from ..artifacts import Artifact
from . import sources
from .concern import Concern

ARTIFACTS: list[Artifact] = [
    Artifact(
        path="nvidia-driver/apt/preferences.d/gpuinfra-nvidia-driver.pref",
        role="nvidia_driver",
        template="nvidia-driver.pref.j2",
        host_role="gpu_nodes",
    ),
    Artifact(
        path="nvidia-driver/apt/apt.conf.d/51gpuinfra-nvidia-driver",
        role="nvidia_driver",
        template="unattended-upgrades-nvidia.conf.j2",
        host_role="gpu_nodes",
    ),
    Artifact(
        path="kernel-updates/apt/apt.conf.d/52gpuinfra-kernel-updates",
        role="kernel_updates",
        template="unattended-upgrades-kernel.conf.j2",
        host_role="gpu_nodes",
    ),
    Artifact(
        path="nvidia-driver/modprobe.d/gpuinfra-blacklist-nouveau.conf",
        role="nvidia_driver",
        template="blacklist-nouveau.conf.j2",
        host_role="gpu_nodes",
    ),
    Artifact(
        path="kernel-updates/systemd/gpuinfra-kernel-updates.service",
        role="kernel_updates",
        template="gpuinfra-kernel-updates.service.j2",
        host_role="gpu_nodes",
    ),
    Artifact(
        path="kernel-updates/systemd/gpuinfra-kernel-updates.timer",
        role="kernel_updates",
        template="gpuinfra-kernel-updates.timer.j2",
        host_role="gpu_nodes",
    ),
]


def source_vars(driver: Driver) -> dict[str, Any]:
    source = driver.source
    return {
        **sources.source_vars("nvidia_driver_source", source),
        "nvidia_driver_source_backports": source.backports if isinstance(source, DistributionSource) else False,
    }


def group_vars(rc: ResolvedCluster) -> dict[str, Any]:
    kernel = {"kernel_updates_unattended": rc.model.kernel.unattended_updates}
    driver = rc.model.driver
    if driver is None:
        return kernel
    version = driver.version or ""
    return {
        **kernel,
        "nvidia_driver_version": version,
        "nvidia_driver_branch": driver.major,
        "nvidia_driver_kernel_modules": driver.kernel_modules,
        **source_vars(driver),
        "nvidia_driver_hold": driver.hold,
        "nvidia_driver_fabric_manager_version": driver.fabric_manager_version or "",
        "nvidia_driver_reboot": driver.reboot,
        # The gate checks the same module the driver role installs.
        "gpu_kernel_gate_driver_version": version,
        "gpu_kernel_gate_driver_branch": driver.major,
        "gpu_kernel_gate_kernel_modules": driver.kernel_modules,
    }


def host_vars(host: Host) -> dict[str, Any]:
    """Per-host settings of GPU nodes: the fabric manager where the GPUs sit on an NVSwitch fabric; and on emulated
    GPUs (device nodes without hardware, in a container as in the sandbox) the driver is installed and its module
    built, but nothing is loaded or started and the host is never rebooted for it. Such a host runs its machine's
    kernel, so a reboot (`upgrade.reboot: always`) restarts its services only, and is recognised as such."""
    if not host.gpu_count:
        return {}
    return {
        "nvidia_driver_fabric_manager": host.nvswitch,
        "nvidia_driver_service_manage": not host.gpu_emulated,
        "gpu_kernel_gate_boots_own_kernel": not host.gpu_emulated,
    }


CONCERN = Concern("driver", ARTIFACTS, group_vars, host_vars=host_vars)
