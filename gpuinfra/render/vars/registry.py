"""Every concern, in the order their variables are merged."""

from __future__ import annotations

from . import admission, driver, health, kubernetes, mig, monitoring, slurm, toolkit
from .concern import Concern

CONCERNS: tuple[Concern, ...] = (
    driver.CONCERN,
    toolkit.CONCERN,
    health.CONCERN,
    admission.CONCERN,
    mig.CONCERN,
    kubernetes.CONCERN,
    slurm.CONCERN,
    monitoring.CONCERN,
)
