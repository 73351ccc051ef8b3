# Copyright: gpuinfra maintainers
# Apache License 2.0 (see LICENSE)
"""A node's verdict: its GPUs (smi_report), XIDs (xid_log) and node problems judged against a health policy,
as per-GPU and node problems, each a sentence an operator can act on.

Standard library only, Python 3.9 or newer, no I/O: it runs on managed hosts (the gpu_health and
nvidia_dkms_status modules, the gpuinfra-health program) and on the controller (testinfra, tests).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from .dkms import version_matches
from .smi_report import Gpu, SmiReport, pci_key
from .xid_log import XidEvent

# The process an XID names comes first in its message ("pid=..., name=..., "); the cause follows.
_XID_PROCESS = re.compile(r"^pid=[^,]*,\s*(?:name=[^,]*,\s*)?")

# Clock event (throttle) reasons that mean the GPU is being slowed by heat or by the board, not by choice: idle,
# application clocks, sync boost, display clocks and the software power cap are normal operation.
BAD_CLOCK_REASONS = ("hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown", "sw_thermal_slowdown")


@dataclass
class Policy:
    """What counts as healthy. Mirrors the model's `health` section plus the per-host facts."""

    expected_count: int | None = None
    expected_model: str = ""
    """The catalog name of the node's GPU model (H100-SXM5-80GB); empty: not checked."""
    expected_pci_ids: Sequence[str] = ()
    """The model's PCI device IDs ("0x2330"); a GPU with another ID is the wrong model."""
    fabric_manager: bool = False
    """The GPUs sit on an NVSwitch fabric: each must report its fabric registration complete."""
    driver_version: str = ""
    """Exact pin (535.261.03) or a branch (535); empty: not checked."""
    max_temperature_c: int = 85
    max_uncorrectable_ecc: int = 0
    allowed_xids: Sequence[int] = ()
    require_persistence: bool = True
    check_pcie_link: bool = True
    check_mig: bool = True
    mig_layouts: Mapping[str, str] = field(default_factory=dict)
    """GPU index (as a string) -> MIG layout name; GPUs without an entry must have MIG disabled."""
    xid_window: str = "since boot"
    """Which part of the kernel log the XIDs handed to `assess` come from, for the problem's wording."""


# --- verdict ----------------------------------------------------------------------------------------------------


def _mig_problems(gpu: Gpu, policy: Policy) -> list[str]:
    layout = policy.mig_layouts.get(str(gpu.index))
    current, pending = gpu.mig_current, gpu.mig_pending
    problems = []
    if layout:
        if current is None:
            problems.append(f"MIG layout {layout!r} is assigned, but this GPU does not support MIG")
            return problems
        if current != "Enabled":
            problems.append(f"MIG mode is {current}, the model assigns layout {layout!r} (MIG enabled)")
        elif gpu.mig_devices == 0:
            problems.append(f"MIG is enabled but no MIG devices exist: layout {layout!r} is not applied")
    elif current == "Enabled":
        problems.append("MIG mode is Enabled, the model assigns no MIG layout to this GPU")
    if current is not None and pending is not None and pending != current:
        problems.append(f"MIG mode change to {pending} is pending a GPU reset")
    return problems


def gpu_problems(gpu: Gpu, policy: Policy, xids: Sequence[XidEvent] = ()) -> list[str]:
    """Every reason this GPU is not healthy under the policy, in a fixed order."""
    problems = []
    if policy.expected_pci_ids and gpu.pci_device_id and gpu.pci_device_id not in policy.expected_pci_ids:
        expected = policy.expected_model or ", ".join(policy.expected_pci_ids)
        problems.append(f"is a {gpu.name} (PCI device {gpu.pci_device_id}), the model expects {expected}")
    if gpu.lost:
        problems.append("nvidia-smi reports the GPU as lost or needing a reset: it has fallen off the bus")
    elif gpu.reset_required:
        problems.append("nvidia-smi reports that the GPU requires a reset")
    if policy.require_persistence and gpu.persistence_mode is not None and gpu.persistence_mode != "Enabled":
        problems.append(f"persistence mode is {gpu.persistence_mode} (is nvidia-persistenced running?)")
    if gpu.temperature_c is not None and gpu.temperature_c > policy.max_temperature_c:
        problems.append(f"temperature {gpu.temperature_c} C is above the {policy.max_temperature_c} C limit")
    volatile = gpu.ecc_volatile_uncorrectable
    if volatile is not None and volatile > policy.max_uncorrectable_ecc:
        problems.append(
            f"{volatile} uncorrectable ECC error(s) since the driver loaded (limit {policy.max_uncorrectable_ecc})"
        )
    rows = gpu.remapped_rows or {}
    if rows.get("failure"):
        problems.append("row remapping failed: the GPU memory has no spare rows left (replace the GPU)")
    if rows.get("pending"):
        problems.append("row remapping is pending: reset the GPU (or reboot) to apply it")
    pages = gpu.retired_pages or {}
    if pages.get("pending"):
        problems.append("retired pages are pending: reset the GPU (or reboot) to retire them")
    bad = [reason for reason in gpu.clock_reasons if reason in BAD_CLOCK_REASONS]
    if bad:
        problems.append(f"clocks slowed down: {', '.join(bad)}")
    if policy.check_pcie_link:
        if gpu.pcie_width_current is not None and gpu.pcie_width_max and gpu.pcie_width_current < gpu.pcie_width_max:
            problems.append(f"PCIe link width x{gpu.pcie_width_current} is below its maximum x{gpu.pcie_width_max}")
        # An idle GPU lowers its link generation to save power; only a busy GPU below its maximum is downtrained.
        if (
            not gpu.idle
            and gpu.pcie_gen_current is not None
            and gpu.pcie_gen_max
            and gpu.pcie_gen_current < gpu.pcie_gen_max
        ):
            problems.append(f"PCIe link Gen{gpu.pcie_gen_current} is below its maximum Gen{gpu.pcie_gen_max}")
    fabric_done = gpu.fabric_state == "Completed" and (gpu.fabric_status or "Success") == "Success"
    if policy.fabric_manager and gpu.fabric_state is not None and not fabric_done:
        problems.append(
            f"NVSwitch fabric registration is {gpu.fabric_state} ({gpu.fabric_status or 'no status'}): "
            "is nvidia-fabricmanager running, at the driver's version?"
        )
    if policy.check_mig:
        problems.extend(_mig_problems(gpu, policy))
    problems.extend(xid_problems(xids, policy.allowed_xids, since=policy.xid_window))
    return problems


def xid_problems(
    events: Sequence[XidEvent], allowed: Sequence[int], where: str = "", since: str = "since boot"
) -> list[str]:
    counts: dict[int, list[XidEvent]] = {}
    for event in events:
        if event.xid not in allowed:
            counts.setdefault(event.xid, []).append(event)
    problems = []
    for xid in sorted(counts):
        seen = counts[xid]
        times = "1 time" if len(seen) == 1 else f"{len(seen)} times"
        cause = _XID_PROCESS.sub("", seen[0].message)
        detail = f": {cause}" if cause else ""
        problems.append(f"XID {xid} in the kernel log {since}{where} ({times}){detail}")
    return problems


def gpu_summary(gpu: Gpu, policy: Policy, xids: Sequence[XidEvent], problems: list[str]) -> dict[str, Any]:
    layout = policy.mig_layouts.get(str(gpu.index))
    return {
        "index": gpu.index,
        "name": gpu.name,
        "uuid": gpu.uuid,
        "pci_bus_id": gpu.pci_bus_id,
        "pci_device_id": gpu.pci_device_id,
        "minor_number": gpu.minor_number,
        "persistence_mode": gpu.persistence_mode,
        "temperature_c": gpu.temperature_c,
        "performance_state": gpu.performance_state,
        "ecc": {
            "mode": gpu.ecc_mode,
            "volatile_uncorrectable": gpu.ecc_volatile_uncorrectable,
            "aggregate_uncorrectable": gpu.ecc_aggregate_uncorrectable,
        },
        "remapped_rows": gpu.remapped_rows,
        "retired_pages": gpu.retired_pages,
        "clock_reasons": list(gpu.clock_reasons),
        "pcie": {
            "gen_current": gpu.pcie_gen_current,
            "gen_max": gpu.pcie_gen_max,
            "width_current": gpu.pcie_width_current,
            "width_max": gpu.pcie_width_max,
        },
        "mig": {
            "current": gpu.mig_current,
            "pending": gpu.mig_pending,
            "devices": gpu.mig_devices,
            "layout": layout,
            "expected": "Enabled" if layout else "Disabled",
        },
        "xids": [asdict(e) for e in xids],
        "problems": problems,
    }


def assess(
    report: SmiReport | None,
    policy: Policy,
    xid_events: Sequence[XidEvent] = (),
    node_problems: Sequence[str] = (),
) -> dict[str, Any]:
    """The verdict for a node: its GPUs with their problems, node problems, and a flat list of both.

    `report` is None when nvidia-smi gave none; the caller passes the reason as a node problem.
    """
    node = list(node_problems)
    gpus: list[dict[str, Any]] = []
    by_pci: dict[str, int] = {}
    listed = report.gpus if report is not None else []
    for gpu in listed:
        key = pci_key(gpu.pci_bus_id)
        if key is not None:
            by_pci[key] = gpu.index
    per_gpu: dict[int, list[XidEvent]] = {}
    unmatched: dict[str, list[XidEvent]] = {}
    for event in xid_events:
        if event.pci in by_pci:
            per_gpu.setdefault(by_pci[event.pci], []).append(event)
        else:
            unmatched.setdefault(event.pci, []).append(event)
    if report is not None:
        if policy.expected_count is not None and len(report.gpus) != policy.expected_count:
            node.append(f"nvidia-smi lists {len(report.gpus)} GPU(s), the model expects {policy.expected_count}")
        if policy.driver_version and not version_matches(report.driver_version, policy.driver_version):
            node.append(f"the driver in use is {report.driver_version}, the pin is {policy.driver_version}")
    for pci in sorted(unmatched):
        where = f" for PCI {pci}, a GPU nvidia-smi does not list" if report is not None else f" for PCI {pci}"
        node.extend(xid_problems(unmatched[pci], policy.allowed_xids, where, policy.xid_window))
    flat: list[str] = []
    for gpu in listed:
        xids = per_gpu.get(gpu.index, [])
        problems = gpu_problems(gpu, policy, xids)
        gpus.append(gpu_summary(gpu, policy, xids, problems))
        flat.extend(f"{gpu.label}: {p}" for p in problems)
    flat.extend(f"node: {p}" for p in node)
    return {
        "healthy": not flat,
        "gpu_count": len(listed),
        "expected_count": policy.expected_count,
        "driver_version": report.driver_version if report is not None else None,
        "driver_pin": policy.driver_version,
        "gpus": gpus,
        "node_problems": node,
        "problems": flat,
    }


def failure_message(verdict: Mapping[str, Any]) -> str:
    problems = list(verdict.get("problems") or [])
    count = "1 problem" if len(problems) == 1 else f"{len(problems)} problems"
    return f"GPU node unhealthy ({count}): {'; '.join(problems)}"
