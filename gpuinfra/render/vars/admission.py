"""Variables of the gpu_admission role: whether the admission gate runs (the model names active checks), how long
a node may take, and gpuinfra's partition and QoS its check jobs run in. The checks themselves are the gpu_health role's
settings (health.py), since the node's program reads them."""

from __future__ import annotations

from typing import Any

from ...model.grammar import duration_seconds
from ...model.slurm import CHECKS_PARTITION
from ...resolve import ResolvedCluster
from .concern import Concern
from .slurm import checks_qos


def group_vars(rc: ResolvedCluster) -> dict[str, Any]:
    admission = rc.model.health.admission
    return {
        "gpu_admission_enabled": bool(admission.checks),
        "gpu_admission_timeout": duration_seconds(admission.timeout),
        "gpu_admission_partition": CHECKS_PARTITION,
        "gpu_admission_qos": next(iter(checks_qos(rc)), ""),
    }


CONCERN = Concern("admission", (), group_vars)
