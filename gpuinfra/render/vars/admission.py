"""Variables of the gpu_admission role (whether the admission gate runs: the model names active checks; how long a
node may take; gpuinfra's partition and QoS its check jobs run in) and of the gpu_scheduled_checks role (the same
checks again on idle nodes, health.admission.every). The checks themselves are the gpu_health role's settings
(health.py), since the node's program reads them."""

from __future__ import annotations

from typing import Any

from ...model.grammar import duration_seconds
from ...model.slurm import CHECKS_PARTITION, CHECKS_QOS, IDLE_CHECKS_QOS
from ...resolve import ResolvedCluster
from ..artifacts import Artifact
from .concern import Concern
from .slurm import checks_qos

ARTIFACTS: tuple[Artifact, ...] = (
    Artifact("scheduled-checks/scheduled-checks.json", "gpu_scheduled_checks", "scheduled-checks.json.j2",
             "slurm_controller"),
    Artifact("scheduled-checks/gpuinfra-scheduled-checks.service", "gpu_scheduled_checks",
             "gpuinfra-scheduled-checks.service.j2", "slurm_controller"),
    Artifact("scheduled-checks/gpuinfra-scheduled-checks.timer", "gpu_scheduled_checks",
             "gpuinfra-scheduled-checks.timer.j2", "slurm_controller"),
)  # fmt: skip


def group_vars(rc: ResolvedCluster) -> dict[str, Any]:
    admission = rc.model.health.admission
    own = checks_qos(rc)
    scheduled = IDLE_CHECKS_QOS in own
    return {
        "gpu_admission_enabled": bool(admission.checks),
        "gpu_admission_timeout": duration_seconds(admission.timeout),
        "gpu_admission_partition": CHECKS_PARTITION,
        "gpu_admission_qos": CHECKS_QOS if CHECKS_QOS in own else "",
        "gpu_admission_max_drained": str(rc.model.health.check.max_drained),
        "gpu_scheduled_checks_enabled": scheduled,
        "gpu_scheduled_checks_every": duration_seconds(admission.every) if scheduled and admission.every else 0,
        "gpu_scheduled_checks_timeout": duration_seconds(admission.timeout),
        "gpu_scheduled_checks_partition": CHECKS_PARTITION,
        "gpu_scheduled_checks_qos": IDLE_CHECKS_QOS,
        # A drain (an upgrade's, a kernel update's) cancels the scheduled checks' jobs rather than wait for them.
        "node_drain_yield_qos": IDLE_CHECKS_QOS if scheduled else "",
    }


CONCERN = Concern("admission", ARTIFACTS, group_vars)
