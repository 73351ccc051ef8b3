"""Variables of the gpu_health role, from the model's health policy and driver pin.

The per-host facts the role also needs come from the inventory's host variables, which its defaults read:
`gpu_health_expected_count` from `gpuinfra_gpu_count` and `gpu_health_mig_layouts` from `gpuinfra_mig_layouts`.
"""

from __future__ import annotations

from typing import Any

from ...resolve import ResolvedCluster
from ..artifacts import Artifact

# The role renders no files.
ARTIFACTS: tuple[Artifact, ...] = ()


def driver_pin(rc: ResolvedCluster) -> str:
    """The exact version the model pins, else its branch ("535"), else empty (not checked)."""
    driver = rc.model.driver
    if driver is None:
        return ""
    if driver.version is not None:
        return str(driver.version)
    return str(driver.branch) if driver.branch is not None else ""


def group_vars(rc: ResolvedCluster) -> dict[str, Any]:
    health = rc.model.health
    return {
        "gpu_health_max_temperature_c": health.max_temperature_c,
        "gpu_health_max_uncorrectable_ecc": health.max_uncorrectable_ecc,
        "gpu_health_allowed_xids": sorted(set(health.allowed_xids)),
        "gpu_health_require_persistence": health.require_persistence,
        "gpu_health_check_pcie_link": health.check_pcie_link,
        "gpu_health_driver_version": driver_pin(rc),
    }
