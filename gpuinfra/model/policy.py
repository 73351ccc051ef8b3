"""Health and upgrade policies: what counts as a healthy node, and how many may be out at once."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, Field, ValidationInfo, field_validator

from .. import catalog
from .base import Model
from .driver import PackageSource
from .grammar import AbsolutePath, Duration, NonNegativeInt, PackageName, Percentage, PositiveInt, duration_seconds

# A check reads nvidia-smi once (well under a second on a healthy node); a day is the longest a broken GPU should
# keep taking jobs.
MIN_CHECK_INTERVAL = 10
MAX_CHECK_INTERVAL = 86400
# A week unknown is a node nobody looks at.
MAX_UNKNOWN_LIMIT = 7 * 86400
# DCGM's level 1 takes seconds and level 4 hours; an admission longer than a working day holds a node for nothing.
MIN_ADMISSION_TIMEOUT = 60
MAX_ADMISSION_TIMEOUT = 12 * 3600
# Scheduled checks: more often than a minute is a node never idle for users; less often than a quarter, a fault
# found by users first.
MIN_CHECKS_EVERY = 60
MAX_CHECKS_EVERY = 90 * 86400

ActiveCheck = Literal["dcgm_diag", "nccl_all_reduce", "host_bandwidth"]
ActiveTool = Literal["dcgmi", "all_reduce_perf", "nvbandwidth"]
# The tool each check runs.
# Where gpuinfra looks for each tool unless `health.admission.tools.paths` says otherwise (the gpu_health role's
# default gpu_health_active_tools is the same).
DEFAULT_TOOL_PATHS: dict[str, str] = {
    "dcgmi": "/usr/bin/dcgmi",
    "all_reduce_perf": "/usr/local/bin/all_reduce_perf",
    "nvbandwidth": "/usr/local/bin/nvbandwidth",
}
CHECK_TOOLS: dict[str, str] = {
    "dcgm_diag": "dcgmi",
    "nccl_all_reduce": "all_reduce_perf",
    "host_bandwidth": "nvbandwidth",
}


class HealthCheck(Model):
    enabled: bool = True
    """Run gpuinfra-health on every GPU node: it drains (Slurm) or taints (Kubernetes) a node whose GPUs fail the
    health policy, and resumes it when they pass again, never touching a drain it did not make."""
    interval: Duration = "5m"
    """How often: Slurm's HealthCheckInterval, or the Kubernetes nodes' timer."""
    on_job_start: bool = False
    """Slurm: also check each node in the job's prolog, so that a job never starts on a node that broke since the
    last check; the job goes back to the queue. Adds the check's run time (about a second) to every job start."""
    max_drained: PositiveInt | Percentage = "10%"
    """How many nodes of a Slurm partition health checks may hold drained, or of a Kubernetes node group tainted, at
    once: a count or a percentage of its nodes (never below 1). Past it an unhealthy node is left in service, its
    check says why, and the alert GpuHealthSpared fires: a fault seen on every node at once (a wrong pin, a changed
    log) is more likely the check's than the fleet's."""
    mode: Literal["enforce", "observe"] = "enforce"
    """observe: the checks only report what they would do (drain, resume); for a new policy's first days."""
    unknown_limit: Duration = "30m"
    """How long a node's health may stay unknown (a check could not look: its kernel log unreadable, a tool
    missing, the package manager's lock held past its limit) before the node is drained with a reason that says so.
    Until then an unknown verdict drains nothing: a log moved across the fleet must not empty it."""

    @field_validator("interval")
    @classmethod
    def _interval_in_range(cls, value: str) -> str:
        seconds = duration_seconds(value)
        if not MIN_CHECK_INTERVAL <= seconds <= MAX_CHECK_INTERVAL:
            raise ValueError(f"must be between 10s and 1d, not {value}")
        return value

    @field_validator("unknown_limit")
    @classmethod
    def _unknown_limit_in_range(cls, value: str) -> str:
        if not MIN_CHECK_INTERVAL <= duration_seconds(value) <= MAX_UNKNOWN_LIMIT:
            raise ValueError(f"must be between 10s and 7d, not {value}")
        return value


# What a health check does with an XID (gpuinfra.catalog.XID_CLASSES, from NVIDIA's XID catalog); a test keeps the
# two equal.
XidClass = Literal["application", "ignore", "node", "reset", "reboot", "hardware"]


def _xid_number(value: int) -> int:
    if not 1 <= value <= catalog.XID_MAX:
        raise ValueError(f"{value} is not an XID number (1 to {catalog.XID_MAX})")
    return value


XidNumber = Annotated[int, AfterValidator(_xid_number)]
# The repetition rule's window: long enough for several jobs to start on a GPU, short enough that unrelated bugs
# months apart never add up.
MIN_REPEAT_WINDOW = 60
MAX_REPEAT_WINDOW = 7 * 86400


class XidRepetition(Model):
    jobs: Annotated[int, Field(ge=2, le=1000)] = 3
    """Application XIDs on one GPU from this many different jobs (processes, where Slurm cannot tell the job)
    within `window` are the GPU's fault: the node is drained until it reboots or an operator clears it."""
    window: Duration = "1h"

    @field_validator("window")
    @classmethod
    def _window_in_range(cls, value: str) -> str:
        if not MIN_REPEAT_WINDOW <= duration_seconds(value) <= MAX_REPEAT_WINDOW:
            raise ValueError(f"must be between 1m and 7d, not {value}")
        return value


class CheckTools(Model):
    """Where the active checks' tools come from: packages, from a package source as every NVIDIA package is."""

    install: bool = True
    """Install `packages` on the GPU nodes; false when the nodes have the tools already (in their image, say)."""
    source: PackageSource | None = None
    """Where the packages come from: `nvidia` (the CUDA repository, which the driver's `nvidia` source adds), a
    signed `mirror` or a `local` folder on the controller (air-gapped sites). Absent: the driver's source."""
    packages: Annotated[list[PackageName], Field(max_length=64)] = []
    """The packages to install. Absent: DCGM's (`datacenter-gpu-manager-4-core` and the one for the driver's CUDA
    major) when `dcgm_diag` is named. nccl-tests and nvbandwidth have no NVIDIA package: a site builds its own
    against its CUDA and names them here, DCGM's too."""
    paths: dict[ActiveTool, AbsolutePath] = {}
    """Where a package puts a tool, where it is not gpuinfra's default (`/usr/bin/dcgmi`,
    `/usr/local/bin/all_reduce_perf`, `/usr/local/bin/nvbandwidth`)."""


class Admission(Model):
    checks: list[ActiveCheck] = []
    """The active checks a node passes before it takes jobs again: after `gpuinfra upgrade`, when it is resumed
    (playbooks/resume.yml) and on request (`gpuinfra health --admit NODES`). dcgm_diag is DCGM's diagnostic
    (`dcgmi`); nccl_all_reduce (nccl-tests' all_reduce_perf) and host_bandwidth (nvbandwidth) judge bandwidth against
    the catalog's floor for the GPU model. The tools must be on the nodes (see docs/health.md): a missing one keeps
    the node out of service. Empty (the default): no gate, nodes resume on the passive health check alone."""
    dcgm_level: Literal[1, 2, 3, 4] = 2
    """DCGM's run level: 1 takes seconds, 2 about two minutes, 3 about fifteen."""
    timeout: Duration = "30m"
    """How long one node's checks may take, the wait for its admission job included; past it the node stays out
    of service with a reason that says so."""
    every: Duration | None = None
    """Run the same checks again on each idle node this long after its last run (scheduled checks); off when
    absent. A check job takes a node only while it is idle, and any user job preempts it at once, so no user job
    waits for one; a failure drains the node through its health check, with the check's reason. Slurm only, with
    accounting and preemption (slurm.preempt_mode)."""
    tools: CheckTools = CheckTools()
    """How the checks' tools reach the nodes (see docs/health.md)."""

    @field_validator("checks")
    @classmethod
    def _once_each(cls, value: list[str]) -> list[str]:
        if len(set(value)) != len(value):
            raise ValueError("names a check more than once")
        return value

    @field_validator("timeout")
    @classmethod
    def _timeout_in_range(cls, value: str) -> str:
        if not MIN_ADMISSION_TIMEOUT <= duration_seconds(value) <= MAX_ADMISSION_TIMEOUT:
            raise ValueError(f"must be between 1m and 12h, not {value}")
        return value

    @field_validator("every")
    @classmethod
    def _every_in_range(cls, value: str | None) -> str | None:
        if value is not None and not MIN_CHECKS_EVERY <= duration_seconds(value) <= MAX_CHECKS_EVERY:
            raise ValueError(f"must be between 1m and 90d, not {value}")
        return value


class Health(Model):
    max_temperature_c: Annotated[int, Field(ge=40, le=110)] = 85
    max_uncorrectable_ecc: NonNegativeInt = 0
    allowed_xids: list[XidNumber] = []
    """XIDs that never fail a node, whatever their class: the older spelling of `xid_classes: {N: ignore}`."""
    xid_classes: dict[XidNumber, XidClass] = {}
    """Where the site overrides the class NVIDIA's XID catalog gives an XID, e.g. `{43: node}`."""
    xid_repetition: XidRepetition = XidRepetition()
    """When application XIDs are the GPU's fault after all."""
    require_persistence: bool = True
    check_pcie_link: bool = True
    check: HealthCheck = HealthCheck()
    """The continuous check on every GPU node, and what it does to the scheduler."""
    admission: Admission = Admission()
    """The gate a node passes, on active checks run as a Slurm job, before it takes jobs."""

    @field_validator("xid_classes")
    @classmethod
    def _not_also_allowed(cls, value: dict[int, str], info: ValidationInfo) -> dict[int, str]:
        allowed = set(info.data.get("allowed_xids") or ())
        draining = sorted(xid for xid, kind in value.items() if xid in allowed and kind in catalog.XID_DRAINING)
        if draining:
            listed = ", ".join(f"{xid}: {value[xid]}" for xid in draining)
            raise ValueError(
                f"{listed} drains, but allowed_xids says never: name each XID in one of the two "
                "(allowed_xids is the older spelling of class ignore)"
            )
        return value


class Upgrade(Model):
    max_unavailable: PositiveInt | Percentage = 1
    """Nodes out of service at once: a count, or a percentage of the GPU nodes."""
    canary: NonNegativeInt = 1
    """Nodes upgraded alone first."""
    health_gate: bool = True
    drain_timeout: Duration = "4h"
    phase_timeout: Duration = "1h"
    """Longest a phase may run besides waiting for jobs (the drain phase gets drain_timeout on top): a hung phase
    is stopped and its node reported failed, left drained."""
    max_failures: NonNegativeInt = 0
    """Failed nodes tolerated before the run stops."""
    reboot: Literal["when_needed", "always", "never"] = "when_needed"
