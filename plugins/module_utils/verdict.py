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
from .xid_catalog import DRAINING, HARDWARE, IGNORE, REBOOT, RESET, catalog_class
from .xid_log import XidEvent

# The process an XID names comes first in its message ("pid=..., name=..., "); the cause follows.
_XID_PROCESS = re.compile(r"^pid=[^,]*,\s*(?:name=[^,]*,\s*)?")

# A node check's three answers. `unknown`: a check could not look, so nothing is known to be wrong, nor right.
HEALTHY, UNHEALTHY, UNKNOWN = "healthy", "unhealthy", "unknown"
VERDICTS = (HEALTHY, UNHEALTHY, UNKNOWN)

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
    """XIDs that never drain, whatever their class: the older spelling of `xid_classes` {N: ignore}."""
    xid_classes: Mapping[int, str] = field(default_factory=dict)
    """XID -> class (xid_catalog.CLASSES), where the site overrides NVIDIA's catalog."""
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


def gpu_problems(
    gpu: Gpu, policy: Policy, xids: Sequence[XidEvent] = (), repeated: Sequence[RepeatedFault] = ()
) -> list[str]:
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
    problems.extend(xid_problems(xids, policy, since=policy.xid_window))
    problems.extend(fault.text() for fault in repeated)
    return problems


# What each draining class asks of the operator, in the problem and the drain reason; `node` asks nothing more.
CLASS_ACTION = {
    RESET: "reset the GPU",
    REBOOT: "reboot",
    HARDWARE: "hardware fault: repair or replace the GPU",
}


def xid_class(event: XidEvent, policy: Policy) -> str:
    """The class the policy gives this XID: never draining when allowed, else the site's, else NVIDIA's catalog's."""
    if event.xid in policy.allowed_xids:
        return IGNORE
    return policy.xid_classes.get(event.xid) or catalog_class(event.xid, event.message)


def xid_problems(events: Sequence[XidEvent], policy: Policy, where: str = "", since: str = "since boot") -> list[str]:
    """One problem per XID of a draining class; the others are reported (xid_reports), not judged."""
    counts: dict[int, list[XidEvent]] = {}
    classes: dict[int, str] = {}
    for event in events:
        kind = xid_class(event, policy)
        if kind in DRAINING:
            counts.setdefault(event.xid, []).append(event)
            classes[event.xid] = kind
    problems = []
    for xid in sorted(counts):
        seen = counts[xid]
        times = "1 time" if len(seen) == 1 else f"{len(seen)} times"
        cause = _XID_PROCESS.sub("", seen[0].message)
        detail = f": {cause}" if cause else ""
        action = CLASS_ACTION.get(classes[xid])
        asks = f" ({action})" if action else ""
        problems.append(f"XID {xid}{asks} in the kernel log {since}{where} ({times}){detail}")
    return problems


# --- the repetition rule ----------------------------------------------------------------------------------------


def duration_text(seconds: int) -> str:
    """3600 -> "1h", 5400 -> "90m": the largest unit that divides it."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


@dataclass
class RepeatedFault:
    """Application XIDs on one GPU from several different jobs (processes, where the job is unknown) within a
    window: more than bad luck in user code, so the GPU's fault."""

    pci: str
    xids: list[int]
    sources: list[str]
    """The jobs ("job 4711") or processes ("pid 4242") the XIDs came from, in the order they were seen."""
    window: int
    """Seconds."""

    def text(self, where: str = "") -> str:
        """`XID 13 from 3 different jobs on GPU 1 within 1h: treated as a GPU fault`, `where` naming the GPU."""
        jobs = sum(source.startswith("job ") for source in self.sources)
        noun = "jobs" if jobs == len(self.sources) else "processes" if jobs == 0 else "jobs or processes"
        xids = f"XID {self.xids[0]}" if len(self.xids) == 1 else f"XIDs {', '.join(map(str, self.xids))}"
        return (
            f"{xids} from {len(self.sources)} different {noun}{where} within {duration_text(self.window)}: "
            "treated as a GPU fault"
        )


def fault_source(fault: Mapping[str, Any]) -> str:
    """What tells one application fault's cause from another's: its job, else its process; empty when neither is
    known (such a fault cannot be told apart, and is not counted)."""
    if fault.get("job"):
        return f"job {fault['job']}"
    return f"pid {fault['pid']}" if fault.get("pid") else ""


def repeated_faults(faults: Sequence[Mapping[str, Any]], now: float, window: int, jobs: int) -> list[RepeatedFault]:
    """The GPUs whose application faults (dicts with xid, pci, time, and job or pid) within `window` seconds before
    `now` came from `jobs` or more different jobs or processes."""
    per_gpu: dict[str, list[Mapping[str, Any]]] = {}
    for fault in faults:
        if now - window <= float(fault.get("time", 0)) <= now and fault_source(fault):
            per_gpu.setdefault(str(fault.get("pci", "")), []).append(fault)
    out = []
    for pci in sorted(per_gpu):
        sources = list(dict.fromkeys(fault_source(f) for f in per_gpu[pci]))
        if jobs > 0 and len(sources) >= jobs:
            xids = sorted({int(f["xid"]) for f in per_gpu[pci]})
            out.append(RepeatedFault(pci=pci, xids=xids, sources=sources, window=window))
    return out


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


def xid_report(event: XidEvent, kind: str, gpu: int | None) -> dict[str, Any]:
    """An XID that does not drain, as it is reported: against the process, job and user that caused it."""
    return {
        "xid": event.xid,
        "class": kind,
        "gpu": gpu,
        "pci": event.pci,
        "gpu_instance": event.gpu_instance,
        "pid": event.pid,
        "process": event.process,
        "job": event.job,
        "user": event.user,
        "message": event.message,
    }


def assess(
    report: SmiReport | None,
    policy: Policy,
    xid_events: Sequence[XidEvent] = (),
    node_problems: Sequence[str] = (),
    repeated: Sequence[RepeatedFault] = (),
    unknown: Sequence[str] = (),
) -> dict[str, Any]:
    """The verdict for a node: its GPUs with their problems, node problems, and a flat list of both, and the XIDs
    that are reported rather than judged (`xid_reports`).

    `report` is None when nvidia-smi gave none; the caller passes the reason as a node problem. `repeated` are the
    GPUs the repetition rule (kept by the caller, which sees the checks over time) makes faulty. `unknown` are the
    checks that could not look (a log it cannot read, a tool that failed to start): with no problem found, the
    verdict is `unknown`, neither healthy nor unhealthy (VERDICTS).
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
    repeated_per_gpu: dict[int, list[RepeatedFault]] = {}
    for fault in repeated:
        if fault.pci in by_pci:
            repeated_per_gpu.setdefault(by_pci[fault.pci], []).append(fault)
        else:
            node.append(fault.text(f" on PCI {fault.pci}"))
    for pci in sorted(unmatched):
        where = f" for PCI {pci}, a GPU nvidia-smi does not list" if report is not None else f" for PCI {pci}"
        node.extend(xid_problems(unmatched[pci], policy, where, policy.xid_window))
    reports = [
        xid_report(event, kind, by_pci.get(event.pci))
        for event in xid_events
        for kind in [xid_class(event, policy)]
        if kind not in DRAINING
    ]
    flat: list[str] = []
    for gpu in listed:
        xids = per_gpu.get(gpu.index, [])
        problems = gpu_problems(gpu, policy, xids, repeated_per_gpu.get(gpu.index, []))
        gpus.append(gpu_summary(gpu, policy, xids, problems))
        flat.extend(f"{gpu.label}: {p}" for p in problems)
    flat.extend(f"node: {p}" for p in node)
    verdict = UNHEALTHY if flat else UNKNOWN if unknown else HEALTHY
    return {
        "verdict": verdict,
        "healthy": verdict == HEALTHY,
        "unknown": list(unknown),
        "gpu_count": len(listed),
        "expected_count": policy.expected_count,
        "driver_version": report.driver_version if report is not None else None,
        "driver_pin": policy.driver_version,
        "gpus": gpus,
        "node_problems": node,
        "problems": flat,
        "xid_reports": reports,
    }


def failure_message(verdict: Mapping[str, Any]) -> str:
    problems = list(verdict.get("problems") or [])
    if not problems and verdict.get("unknown"):
        return f"GPU node health unknown: a check could not look: {'; '.join(verdict['unknown'])}"
    count = "1 problem" if len(problems) == 1 else f"{len(problems)} problems"
    return f"GPU node unhealthy ({count}): {'; '.join(problems)}"
