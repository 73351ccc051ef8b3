"""Health and upgrade policies: what counts as a healthy node, and how many may be out at once."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from ..validate.grammar import Duration, NonNegativeInt, Percentage, PositiveInt
from .base import Model


class Health(Model):
    max_temperature_c: Annotated[int, Field(ge=40, le=110)] = 85
    max_uncorrectable_ecc: NonNegativeInt = 0
    allowed_xids: list[int] = []
    """XIDs that do not fail a node (e.g. 13 or 31: application faults)."""
    require_persistence: bool = True
    check_pcie_link: bool = True


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
