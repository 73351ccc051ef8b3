"""Variables of the gpu_health role, from the model's health policy and driver pin.

The per-host facts the role also needs come from the inventory's host variables, which its defaults read:
`gpu_health_expected_count` from `gpuinfra_gpu_count` and `gpu_health_mig_layouts` from `gpuinfra_mig_layouts`.
The node health program (the role's install entry point) also gets the model's PCI IDs and its scheduler.
"""

from __future__ import annotations

from typing import Any

from ... import catalog
from ...model.grammar import duration_seconds
from ...model.policy import CHECK_TOOLS, DEFAULT_TOOL_PATHS
from ...resolve import Host, ResolvedCluster
from ..artifacts import Artifact
from . import sources
from .concern import Concern

# Emulated GPUs (the sandbox) have no hardware for nvidia-smi; `gpuinfra sandbox up` mounts a responder that
# answers with recorded outputs (gpuinfra/sandbox/gpus) here, and the health program reads it and the sandbox's
# kernel log instead. Their running kernel is the machine's own, without the nvidia module, so modinfo is skipped.
EMULATED_GPU_TOOLS = "/usr/local/lib/gpuinfra-sandbox"
EMULATED_KERNEL_LOG = "/var/lib/gpuinfra-sandbox/kern.log"
# The active checks' tools, which the sandbox also answers for with stand-ins (gpus/gpu_checks.py).
ACTIVE_TOOLS = ("dcgmi", "all_reduce_perf", "nvbandwidth")

# As the first GPU node has them: the health program's settings (the model's policy, the host's GPUs), and on a
# Kubernetes GPU node, where no Slurm health check runs it, the systemd timer that does.
ARTIFACTS: tuple[Artifact, ...] = (
    Artifact("gpu-health/health.json", "gpu_health", "health.json.j2", "gpu_nodes"),
    Artifact("gpu-health/gpuinfra-health.service", "gpu_health", "gpuinfra-health.service.j2", "k8s_gpu_worker"),
    Artifact("gpu-health/gpuinfra-health.timer", "gpu_health", "gpuinfra-health.timer.j2", "k8s_gpu_worker"),
)


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
        # JSON's keys are strings: the module and the program read them back as XID numbers.
        "gpu_health_xid_classes": {str(xid): kind for xid, kind in sorted(health.xid_classes.items())},
        "gpu_health_xid_repeat_jobs": health.xid_repetition.jobs,
        "gpu_health_xid_repeat_window": duration_seconds(health.xid_repetition.window),
        "gpu_health_require_persistence": health.require_persistence,
        "gpu_health_check_pcie_link": health.check_pcie_link,
        "gpu_health_driver_version": driver_pin(rc),
        "gpu_health_check_enabled": health.check.enabled,
        "gpu_health_interval": duration_seconds(health.check.interval),
        "gpu_health_unknown_limit": duration_seconds(health.check.unknown_limit),
        "gpu_health_max_drained": str(health.check.max_drained),
        "gpu_health_mode": health.check.mode,
        "gpu_health_active_checks": list(health.admission.checks),
        "gpu_health_dcgm_level": health.admission.dcgm_level,
        "gpu_health_active_timeout": duration_seconds(health.admission.timeout),
        **_check_tools(rc),
    }


def dcgm_packages(rc: ResolvedCluster) -> list[str]:
    """DCGM 4's packages: its core and the one for the CUDA major the driver branch supports (12 from R525, 13
    from R580), as NVIDIA's install guide names them."""
    pin = driver_pin(rc)
    branch = int(pin.split(".")[0]) if pin else 535  # a driver gpuinfra does not pin: the long-lived R535's CUDA 12
    cuda = 13 if branch >= 580 else 12 if branch >= 525 else 11
    return ["datacenter-gpu-manager-4-core", f"datacenter-gpu-manager-4-cuda{cuda}"]


def _check_tools(rc: ResolvedCluster) -> dict[str, Any]:
    """The gpu_check_tools role's settings: the named checks' tools, from their source (the driver's by default)."""
    admission = rc.model.health.admission
    tools = admission.tools
    paths = DEFAULT_TOOL_PATHS | {str(tool): path for tool, path in tools.paths.items()}
    out: dict[str, Any] = {
        "gpu_health_active_tools": paths,
        "gpu_check_tools_install": tools.install and bool(admission.checks),
        "gpu_check_tools_paths": {CHECK_TOOLS[check]: paths[CHECK_TOOLS[check]] for check in admission.checks},
        "gpu_check_tools_packages": list(tools.packages)
        or (dcgm_packages(rc) if "dcgm_diag" in admission.checks else []),
    }
    source = tools.source or (rc.model.driver.source if rc.model.driver is not None else None)
    if source is not None and source.type != "distribution":  # refused at load time where the tools install
        out.update(sources.source_vars("gpu_check_tools_source", source))
    return out


def host_vars(host: Host) -> dict[str, Any]:
    out: dict[str, Any] = {}
    spec = catalog.lookup(host.gpu_model) if host.gpu_model else None
    if spec is not None:
        out["gpu_health_expected_pci_ids"] = list(spec.pci_ids)
        out.update(_active_floors(spec.name))
    if "slurm_compute" in host.roles:
        out["gpu_health_scheduler"] = "slurm"
    elif "k8s_gpu_worker" in host.roles:
        out["gpu_health_scheduler"] = "kubernetes"
    if host.gpu_emulated:
        out["gpu_health_nvidia_smi"] = f"{EMULATED_GPU_TOOLS}/nvidia-smi"
        out["gpu_health_kernel_log"] = EMULATED_KERNEL_LOG
        out["gpu_health_check_kernel_module"] = False
        tools = {tool: f"{EMULATED_GPU_TOOLS}/{tool}" for tool in ACTIVE_TOOLS}
        # The stand-ins answer for the tools, so nothing is installed.
        out.update(gpu_health_active_tools=tools, gpu_check_tools_paths={}, gpu_check_tools_install=False)
    return out


def _active_floors(model: str) -> dict[str, Any]:
    """The catalog's bandwidth floors for the model at its own PCIe generation; none for a model it has no link
    figures for (the bandwidth checks then say they cannot judge)."""
    link = catalog.interconnect(model)
    if link is None:
        return {}
    floors = {
        "nccl": catalog.nccl_all_reduce_floor(model, link.pcie_gen),
        "host": catalog.host_bandwidth_floor(model, link.pcie_gen),
    }
    return {f"gpu_health_{kind}_floor": {"gbps": floor.gbps, "of": floor.of} for kind, floor in floors.items()}


CONCERN = Concern("health", ARTIFACTS, group_vars, host_vars=host_vars)
