"""Health and upgrade policies: what counts as a healthy node, and how many may be out at once."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator

from .base import Model
from .grammar import Duration, NonNegativeInt, Percentage, PositiveInt, duration_seconds

# A check reads nvidia-smi once (well under a second on a healthy node); a day is the longest a broken GPU should
# keep taking jobs.
MIN_CHECK_INTERVAL = 10
MAX_CHECK_INTERVAL = 86400


class HealthCheck(Model):
    enabled: bool = True
    """Run gpuinfra-health on every GPU node: it drains (Slurm) or taints (Kubernetes) a node whose GPUs fail the
    health policy, and resumes it when they pass again, never touching a drain it did not make."""
    interval: Duration = "5m"
    """How often: Slurm's HealthCheckInterval, or the Kubernetes nodes' timer."""
    on_job_start: bool = False
    """Slurm: also check each node in the job's prolog, so that a job never starts on a node that broke since the
    last check; the job goes back to the queue. Adds the check's run time (about a second) to every job start."""

    @field_validator("interval")
    @classmethod
    def _interval_in_range(cls, value: str) -> str:
        seconds = duration_seconds(value)
        if not MIN_CHECK_INTERVAL <= seconds <= MAX_CHECK_INTERVAL:
            raise ValueError(f"must be between 10s and 1d, not {value}")
        return value


class Health(Model):
    max_temperature_c: Annotated[int, Field(ge=40, le=110)] = 85
    max_uncorrectable_ecc: NonNegativeInt = 0
    allowed_xids: list[int] = []
    """XIDs that do not fail a node (e.g. 13 or 31: application faults)."""
    require_persistence: bool = True
    check_pcie_link: bool = True
    check: HealthCheck = HealthCheck()
    """The continuous check on every GPU node, and what it does to the scheduler."""


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
