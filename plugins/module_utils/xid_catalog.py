# Copyright: gpuinfra maintainers
# Apache License 2.0 (see LICENSE)
"""NVIDIA's XID catalog as gpuinfra acts on it: each XID's immediate action, and the class that decides whether a
node is drained for it.

Source: NVIDIA, "Analyzing Xid Errors with the Xid Catalog",
https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html (Ampere and newer: A100, H100, B100, GB200),
its column "Resolution Bucket (Immediate Action)", in the catalog's revision for the R610 driver family (XIDs 1 to
172), consulted 2026-12-06 and checked against NVIDIA's own reading of it in NVSentinel
(distros/kubernetes/nvsentinel/charts/gpu-health-monitor/xiderrorsmapping.csv). Only XIDs the catalog marks as used
on those GPUs are listed, and only where both agree on the action; any other XID is class `node`. Older GPUs (Volta
and before) log the same numbers for the same faults, with NVIDIA's older table.

A class says what a node health check does with the XID:
- application: the application's fault (RESTART_APP). The node stays in service; the XID is reported with the
  process, job and user that caused it. From several jobs on one GPU it is the GPU's (the repetition rule).
- ignore: nothing to do (IGNORE). The node stays in service; the XID is reported.
- node: drained until a check passes again (no catalog entry, UPDATE_SWFW).
- reset: the GPU needs a reset (RESET_GPU): drained until the node reboots or an operator clears it.
- reboot: the node needs a reboot (RESTART_BM, RESTART_VM): drained until it reboots or an operator clears it.
- hardware: repair or replace (CONTACT_SUPPORT, CHECK_MECHANICALS): drained, through reboots, until an operator
  clears it.

Standard library only, Python 3.9 or newer, no I/O, no imports of its neighbours: it runs on managed hosts (the
gpu_health module, the gpuinfra-health program) and on the controller, which loads it from its file (gpuinfra.catalog).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

SOURCE = "https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html"
VERSION = "catalog for the R610 driver family (XIDs 1-172), consulted 2026-12-06"

APPLICATION = "application"
IGNORE = "ignore"
NODE = "node"
RESET = "reset"
REBOOT = "reboot"
HARDWARE = "hardware"
CLASSES = (APPLICATION, IGNORE, NODE, RESET, REBOOT, HARDWARE)
DRAINING = frozenset({NODE, RESET, REBOOT, HARDWARE})
# Kept from check to check: a reset or a reboot clears these (a new boot), an operator's --clear-xids all of them.
LASTING = frozenset({RESET, REBOOT, HARDWARE})
# A reboot does not repair hardware: only the operator's word clears it.
THROUGH_REBOOTS = frozenset({HARDWARE})
# Highest XID number a setting may name: the catalog ends at 172, and leaves room for the ones NVIDIA adds.
XID_MAX = 999

# NVIDIA's immediate action -> the class.
BUCKET_CLASS = {
    "RESTART_APP": APPLICATION,
    "IGNORE": IGNORE,
    "UPDATE_SWFW": NODE,
    "RESET_GPU": RESET,
    "RESTART_BM": REBOOT,
    "RESTART_VM": REBOOT,
    "CONTACT_SUPPORT": HARDWARE,
    "CHECK_MECHANICALS": HARDWARE,
}


@dataclass(frozen=True)
class XidEntry:
    xid: int
    mnemonic: str
    bucket: str
    """NVIDIA's immediate action (resolution bucket), as the catalog spells it."""
    xid_class: str
    note: str = ""
    """Why the class is not the bucket's own (a WORKFLOW_* bucket names a procedure, not an action)."""


# XID, NVIDIA's mnemonic, its immediate action.
_ROWS: tuple[tuple[int, str, str], ...] = (
    (8, "ROBUST_CHANNEL_FIFO_ERROR_IDLE_TIMEOUT", "RESTART_APP"),
    (11, "ROBUST_CHANNEL_GR_ERROR_MISSING_HW", "RESTART_APP"),
    (13, "ROBUST_CHANNEL_GR_EXCEPTION", "RESTART_APP"),
    (14, "ROBUST_CHANNEL_FAKE_ERROR", "IGNORE"),
    (25, "ROBUST_CHANNEL_GR_ILLEGAL_NOTIFY", "RESTART_APP"),
    (31, "ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT", "RESTART_APP"),
    (32, "ROBUST_CHANNEL_PBDMA_ERROR", "RESTART_APP"),
    (37, "ROBUST_CHANNEL_FECS_ERR_UNIMP_FIRMWARE_METHOD", "IGNORE"),
    (38, "ROBUST_CHANNEL_FECS_ERR_WATCHDOG_TIMEOUT", "IGNORE"),
    (39, "ROBUST_CHANNEL_CE0_ERROR", "RESTART_APP"),
    (40, "ROBUST_CHANNEL_CE1_ERROR", "RESTART_APP"),
    (41, "ROBUST_CHANNEL_CE2_ERROR", "RESTART_APP"),
    (43, "ROBUST_CHANNEL_RESETCHANNEL_VERIF_ERROR", "IGNORE"),
    (44, "ROBUST_CHANNEL_GR_FAULT_DURING_CTXSW", "IGNORE"),
    (45, "ROBUST_CHANNEL_PREEMPTIVE_REMOVAL", "WORKFLOW_XID_45"),
    (46, "ROBUST_CHANNEL_GPU_TIMEOUT_ERROR", "RESET_GPU"),
    (48, "ROBUST_CHANNEL_GPU_ECC_DBE", "WORKFLOW_XID_48"),
    (54, "SILENT_RUNNING_PWR_REDUCED_CLOCKING", "CHECK_MECHANICALS"),
    (60, "ROBUST_CHANNEL_SEC2_ERROR", "RESTART_APP"),
    (61, "PMU_BREAKPOINT", "CONTACT_SUPPORT"),
    (62, "PMU_HALT_ERROR", "RESET_GPU"),
    (63, "INFOROM_DRAM_RETIREMENT_EVENT", "IGNORE"),
    (64, "INFOROM_DRAM_RETIREMENT_FAILURE", "RESET_GPU"),
    (66, "ROBUST_CHANNEL_FECS_ERR_REG_ACCESS_VIOLATION", "IGNORE"),
    (67, "ROBUST_CHANNEL_FECS_ERR_VERIF_VIOLATION", "IGNORE"),
    (68, "ROBUST_CHANNEL_NVDEC0_ERROR", "RESTART_APP"),
    (69, "ROBUST_CHANNEL_GR_CLASS_ERROR", "RESTART_APP"),
    (70, "ROBUST_CHANNEL_CE3_ERROR", "RESTART_APP"),
    (71, "ROBUST_CHANNEL_CE4_ERROR", "RESTART_APP"),
    (72, "ROBUST_CHANNEL_CE5_ERROR", "RESTART_APP"),
    (74, "NVLINK_ERROR", "WORKFLOW_NVLINK_ERR"),
    (75, "ROBUST_CHANNEL_CE6_ERROR", "RESTART_APP"),
    (76, "ROBUST_CHANNEL_CE7_ERROR", "RESTART_APP"),
    (77, "ROBUST_CHANNEL_CE8_ERROR", "RESTART_APP"),
    (78, "VGPU_START_ERROR", "UPDATE_SWFW"),
    (79, "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS", "RESTART_BM"),
    (80, "PBDMA_PUSHBUFFER_CRC_MISMATCH", "RESTART_APP"),
    (82, "ROBUST_CHANNEL_NVJPG0_ERROR", "RESTART_APP"),
    (83, "ROBUST_CHANNEL_NVDEC1_ERROR", "RESTART_APP"),
    (84, "ROBUST_CHANNEL_NVDEC2_ERROR", "RESTART_APP"),
    (85, "ROBUST_CHANNEL_CE9_ERROR", "RESTART_APP"),
    (86, "ROBUST_CHANNEL_OFA0_ERROR", "RESTART_APP"),
    (88, "ROBUST_CHANNEL_NVDEC3_ERROR", "RESTART_APP"),
    (89, "ROBUST_CHANNEL_NVDEC4_ERROR", "RESTART_APP"),
    (92, "EXCESSIVE_SBE_INTERRUPTS", "IGNORE"),
    (93, "INFOROM_ERASE_LIMIT_EXCEEDED", "IGNORE"),
    (94, "ROBUST_CHANNEL_CONTAINED_ERROR", "RESTART_APP"),
    (95, "ROBUST_CHANNEL_UNCONTAINED_ERROR", "RESET_GPU"),
    (96, "ROBUST_CHANNEL_NVDEC5_ERROR", "RESTART_APP"),
    (97, "ROBUST_CHANNEL_NVDEC6_ERROR", "RESTART_APP"),
    (98, "ROBUST_CHANNEL_NVDEC7_ERROR", "RESTART_APP"),
    *((99 + n, f"ROBUST_CHANNEL_NVJPG{n + 1}_ERROR", "RESTART_APP") for n in range(7)),  # 99-105
    (106, "SMBPBI_TEST_MESSAGE", "IGNORE"),
    (107, "SMBPBI_TEST_MESSAGE_SILENT", "IGNORE"),
    (109, "ROBUST_CHANNEL_CTXSW_TIMEOUT_ERROR", "RESET_GPU"),
    (110, "SEC_FAULT_ERROR", "RESET_GPU"),
    (119, "GSP_RPC_TIMEOUT", "RESET_GPU"),
    (120, "GSP_ERROR", "RESET_GPU"),
    (121, "C2C_ERROR", "IGNORE"),
    *((126 + n, f"ROBUST_CHANNEL_CE{10 + n}_ERROR", "RESTART_APP") for n in range(10)),  # 126-135
    (136, "ALI_TRAINING_FAIL", "RESET_GPU"),
    (139, "ROBUST_CHANNEL_OFA1_ERROR", "RESTART_APP"),
    (140, "UNRECOVERABLE_ECC_ERROR_ESCAPE", "RESET_GPU"),
    (141, "ROBUST_CHANNEL_FAST_PATH_ERROR", "IGNORE"),
    (142, "ROBUST_CHANNEL_NVENC3_ERROR", "CONTACT_SUPPORT"),
    (143, "GPU_INIT_ERROR", "RESET_GPU"),
    (144, "NVLINK_SAW_ERROR", "WORKFLOW_NVLINK5_ERR"),
    (145, "NVLINK_RLW_ERROR", "WORKFLOW_NVLINK5_ERR"),
    (146, "NVLINK_TLW_ERROR", "WORKFLOW_NVLINK5_ERR"),
    (147, "NVLINK_TREX_ERROR", "WORKFLOW_NVLINK5_ERR"),
    (148, "NVLINK_NVLPW_CTRL_ERROR", "WORKFLOW_NVLINK5_ERR"),
    (149, "NVLINK_NETIR_ERROR", "WORKFLOW_NVLINK5_ERR"),
    (150, "NVLINK_MSE_ERROR", "WORKFLOW_NVLINK5_ERR"),
    (151, "ROBUST_CHANNEL_KEY_ROTATION_ERROR", "RESTART_VM"),
    (154, "GPU_RECOVERY_ACTION_CHANGED", "XID_154"),
    (155, "NVLINK_SW_DEFINED_ERROR", "RESET_GPU"),
    (156, "RESOURCE_RETIREMENT_EVENT", "RESET_GPU"),
    (157, "RESOURCE_RETIREMENT_FAILURE", "IGNORE"),
    (158, "GPU_FATAL_TIMEOUT", "RESET_GPU"),
)

_NVLINK_WORKFLOW = (
    RESET,
    "the catalog's procedure decodes the error's registers; without that, the GPU is taken to need the reset the "
    "procedure ends in for a fatal link error",
)
# Where the bucket is a procedure, or not what gpuinfra does: the class chosen, and why.
_CHOSEN: dict[int, tuple[str, str]] = {
    45: (
        IGNORE,
        "logged when a channel is torn down, as when a job is cancelled; after another XID it follows that XID, which "
        "is judged itself, and alone it asks for a fabric manager restart, whose state the health check reads itself",
    ),
    48: (RESET, "a double-bit ECC error: the catalog's procedure resets the GPU"),
    61: (RESET, "unused on Ampere and newer; older GPUs log it when the GPU's micro-controller halts"),
    74: _NVLINK_WORKFLOW,
    **dict.fromkeys(range(144, 151), _NVLINK_WORKFLOW),
    154: (NODE, "the driver names the action in the message; the class follows it (see xid_154_class)"),
}


def _entry(xid: int, mnemonic: str, bucket: str) -> XidEntry:
    chosen = _CHOSEN.get(xid)
    if chosen is not None:
        return XidEntry(xid, mnemonic, bucket, chosen[0], chosen[1])
    return XidEntry(xid, mnemonic, bucket, BUCKET_CLASS[bucket])


CATALOG: dict[int, XidEntry] = {row[0]: _entry(*row) for row in _ROWS}

# XID 154's message: "GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)". Drivers word the
# action differently (OS Reboot, GPU Reset Required, PF FLR, Drain and Reset, Drain P2P, None).
_RECOVERY_ACTION = re.compile(r"\bto\s+0x[0-9A-Fa-f]+\s*\(([^)]*)\)")


def xid_154_class(message: str) -> str:
    """The class of the action XID 154 says the GPU needs now."""
    match = _RECOVERY_ACTION.search(message)
    action = match.group(1).lower() if match else ""
    if "reboot" in action:
        return REBOOT
    if "reset" in action or "flr" in action:
        return RESET
    if action.strip() == "none":
        return IGNORE
    return NODE


def catalog_class(xid: int, message: str = "") -> str:
    """The class NVIDIA's catalog gives an XID; `node` for one it does not list."""
    if xid == 154:
        return xid_154_class(message)
    entry = CATALOG.get(xid)
    return entry.xid_class if entry is not None else NODE
