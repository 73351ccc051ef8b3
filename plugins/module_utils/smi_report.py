# Copyright: gpuinfra maintainers
# Apache License 2.0 (see LICENSE)
"""`nvidia-smi -q -x` read into a report of the node's GPUs, and its failures into sentences.

Standard library only, Python 3.9 or newer, no I/O: it runs on managed hosts (the gpu_health and
nvidia_dkms_status modules, the gpuinfra-health program) and on the controller (testinfra, tests).
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

# Texts nvidia-smi prints in a field it could not read.
_UNAVAILABLE = {"", "n/a", "[n/a]", "not supported", "[not supported]", "unknown error", "[unknown error]", "none"}
_LOST = ("gpu is lost", "gpu requires reset")

_BUS_ID = re.compile(r"^(?:PCI:)?([0-9A-Fa-f]{4,8}):([0-9A-Fa-f]{2}):([0-9A-Fa-f]{2})(?:\.[0-7])?$")
_LEADING_INT = re.compile(r"^\s*(-?[0-9]+)")


class SmiError(Exception):
    """Output of nvidia-smi that is not a usable report. The message is a sentence for the operator."""


@dataclass
class Gpu:
    """One GPU as `nvidia-smi -q -x` describes it. Fields it could not read are None."""

    index: int
    name: str | None = None
    uuid: str | None = None
    pci_bus_id: str | None = None
    pci_device_id: str | None = None
    """Device ID as the catalog writes it, "0x" and four upper-case hex digits (0x2330), from `pci_device_id`."""
    minor_number: int | None = None
    persistence_mode: str | None = None
    mig_current: str | None = None
    mig_pending: str | None = None
    mig_devices: int = 0
    ecc_mode: str | None = None
    ecc_volatile_uncorrectable: int | None = None
    ecc_aggregate_uncorrectable: int | None = None
    remapped_rows: dict[str, Any] | None = None
    retired_pages: dict[str, Any] | None = None
    temperature_c: int | None = None
    performance_state: str | None = None
    clock_reasons: list[str] = field(default_factory=list)
    clock_reasons_source: str | None = None
    pcie_gen_current: int | None = None
    pcie_gen_max: int | None = None
    pcie_width_current: int | None = None
    pcie_width_max: int | None = None
    lost: bool = False
    reset_required: bool | None = None
    fabric_state: str | None = None
    fabric_status: str | None = None

    @property
    def label(self) -> str:
        return f"GPU {self.index} ({self.pci_bus_id or 'unknown PCI address'})"

    @property
    def idle(self) -> bool:
        return "gpu_idle" in self.clock_reasons


@dataclass
class SmiReport:
    driver_version: str | None
    cuda_version: str | None
    attached_gpus: int | None
    dtd: str | None
    gpus: list[Gpu]


# --- nvidia-smi -q -x ------------------------------------------------------------------------------------------


def _text(element: ET.Element | None, path: str) -> str | None:
    if element is None:
        return None
    node = element.find(path)
    if node is None or node.text is None:
        return None
    value = node.text.strip()
    return None if value.lower() in _UNAVAILABLE else value


def _int(element: ET.Element | None, path: str) -> int | None:
    value = _text(element, path)
    if value is None:
        return None
    match = _LEADING_INT.match(value)
    return int(match.group(1)) if match else None


def _yes_no(value: str | None) -> bool | None:
    if value is None:
        return None
    lowered = value.lower()
    if lowered == "yes":
        return True
    if lowered == "no":
        return False
    return None


def _sum(values: Iterable[int | None]) -> int | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def _uncorrectable(section: ET.Element | None) -> int | None:
    """Uncorrectable ECC errors in a `volatile` or `aggregate` block, in any layout nvidia-smi has used.

    R535 on Ampere and Hopper: sram_uncorrectable + dram_uncorrectable. R550 and newer: the SRAM count split into
    sram_uncorrectable_parity + sram_uncorrectable_secded. Older drivers and pre-Ampere GPUs: double_bit/total.
    """
    if section is None:
        return None
    split = _sum(
        _int(section, tag)
        for tag in (
            "dram_uncorrectable",
            "sram_uncorrectable",
            "sram_uncorrectable_parity",
            "sram_uncorrectable_secded",
        )
    )
    return split if split is not None else _int(section, "double_bit/total")


def _remapped_rows(gpu: ET.Element) -> dict[str, Any] | None:
    block = gpu.find("remapped_rows")
    if block is None or len(block) == 0:  # "N/A" text: no row remapper (pre-Ampere)
        return None
    out = {
        "correctable": _int(block, "remapped_row_corr"),
        "uncorrectable": _int(block, "remapped_row_unc"),
        "pending": _yes_no(_text(block, "remapped_row_pending")),
        "failure": _yes_no(_text(block, "remapped_row_failure")),
    }
    return out if any(v is not None for v in out.values()) else None


def _retired_pages(gpu: ET.Element) -> dict[str, Any] | None:
    block = gpu.find("retired_pages")
    if block is None:
        return None
    # pending_blacklist is the older name of pending_retirement; drivers of the R4xx era print both.
    flags = [_yes_no(_text(block, tag)) for tag in ("pending_retirement", "pending_blacklist")]
    pending = True if True in flags else (False if False in flags else None)
    out = {
        "single_bit": _int(block, "multiple_single_bit_retirement/retired_count"),
        "double_bit": _int(block, "double_bit_retirement/retired_count"),
        "pending": pending,
    }
    return out if any(v is not None for v in out.values()) else None


def _clock_reasons(gpu: ET.Element) -> tuple[list[str], str | None]:
    """Active clock event reasons, without their prefix (R550 renamed clocks_throttle_reasons: handle both)."""
    for tag, prefix in (
        ("clocks_event_reasons", "clocks_event_reason_"),
        ("clocks_throttle_reasons", "clocks_throttle_reason_"),
    ):
        block = gpu.find(tag)
        if block is None:
            continue
        active = []
        for child in block:
            if (child.text or "").strip().lower() == "active":
                name = child.tag[len(prefix) :] if child.tag.startswith(prefix) else child.tag
                active.append(name)
        return active, tag
    return [], None


def _is_lost(gpu: ET.Element) -> bool:
    for node in gpu.iter():
        text = (node.text or "").strip().lower()
        if text and any(marker in text for marker in _LOST):
            return True
    return False


def _gpu(index: int, element: ET.Element) -> Gpu:
    link = element.find("pci/pci_gpu_link_info")
    reasons, source = _clock_reasons(element)
    ecc = element.find("ecc_errors")
    mig_devices = element.find("mig_devices")
    return Gpu(
        index=index,
        name=_text(element, "product_name"),
        uuid=_text(element, "uuid"),
        pci_bus_id=_text(element, "pci/pci_bus_id") or (element.get("id") or None),
        pci_device_id=_device_id(_text(element, "pci/pci_device_id")),
        minor_number=_int(element, "minor_number"),
        persistence_mode=_text(element, "persistence_mode"),
        mig_current=_text(element, "mig_mode/current_mig"),
        mig_pending=_text(element, "mig_mode/pending_mig"),
        mig_devices=len(mig_devices.findall("mig_device")) if mig_devices is not None else 0,
        ecc_mode=_text(element, "ecc_mode/current_ecc"),
        ecc_volatile_uncorrectable=_uncorrectable(ecc.find("volatile") if ecc is not None else None),
        ecc_aggregate_uncorrectable=_uncorrectable(ecc.find("aggregate") if ecc is not None else None),
        remapped_rows=_remapped_rows(element),
        retired_pages=_retired_pages(element),
        temperature_c=_int(element, "temperature/gpu_temp"),
        performance_state=_text(element, "performance_state"),
        clock_reasons=reasons,
        clock_reasons_source=source,
        pcie_gen_current=_int(link, "pcie_gen/current_link_gen"),
        pcie_gen_max=_int(link, "pcie_gen/max_link_gen"),
        pcie_width_current=_int(link, "link_widths/current_link_width"),
        pcie_width_max=_int(link, "link_widths/max_link_width"),
        lost=_is_lost(element),
        reset_required=_yes_no(_text(element, "gpu_reset_status/reset_required")),
        fabric_state=_text(element, "fabric/state"),
        fabric_status=_text(element, "fabric/status"),
    )


def _device_id(value: str | None) -> str | None:
    """`233010DE` (device, then vendor) -> `0x2330`."""
    if not value or not re.match(r"^(0x)?[0-9A-Fa-f]{8}$", value):
        return None
    return "0x" + value[-8:-4].upper()


def parse_smi_xml(data: Any) -> SmiReport:
    """Parse the output of `nvidia-smi -q -x`. Raises SmiError, and nothing else, on anything that is not a report.

    GPUs are indexed in document order, which is nvidia-smi's own index order (the index `nvidia-smi -i`, MIG
    configurations and CUDA_VISIBLE_DEVICES with CUDA_DEVICE_ORDER=PCI_BUS_ID use).
    """
    if isinstance(data, str):
        data = data.encode("utf-8", "surrogateescape")
    if not isinstance(data, (bytes, bytearray)):
        raise SmiError(f"nvidia-smi output must be text, not {type(data).__name__}")
    if not data.strip():
        raise SmiError("nvidia-smi printed nothing")
    if b"<!ENTITY" in data:
        raise SmiError("nvidia-smi output declares XML entities, which nvidia-smi never does; refusing to parse it")
    try:
        root = ET.fromstring(bytes(data))
    except (ET.ParseError, ValueError, UnicodeError, LookupError) as exc:
        raise SmiError(f"nvidia-smi output is not XML ({exc}): {first_line(data)}") from None
    if root.tag != "nvidia_smi_log":
        raise SmiError(f"nvidia-smi output is XML but not an nvidia_smi_log document (root element <{root.tag}>)")
    doctype = re.search(rb"<!DOCTYPE\s+nvidia_smi_log\s+SYSTEM\s+\"([^\"]+)\"", bytes(data[:512]))
    return SmiReport(
        driver_version=_text(root, "driver_version"),
        cuda_version=_text(root, "cuda_version"),
        attached_gpus=_int(root, "attached_gpus"),
        dtd=doctype.group(1).decode("ascii", "replace") if doctype else None,
        gpus=[_gpu(index, element) for index, element in enumerate(root.findall("gpu"))],
    )


def first_line(data: Any, limit: int = 200) -> str:
    if isinstance(data, (bytes, bytearray)):
        data = bytes(data).decode("utf-8", "replace")
    for line in str(data).splitlines():
        if line.strip():
            return line.strip()[:limit]
    return ""


def smi_failure(rc: int | None, stdout: Any, stderr: Any) -> str:
    """A node problem, in words, for an nvidia-smi run that produced no report."""
    text = "\n".join(
        bytes(part).decode("utf-8", "replace") if isinstance(part, (bytes, bytearray)) else str(part or "")
        for part in (stdout, stderr)
    )
    lowered = text.lower()
    if "driver/library version mismatch" in lowered:
        return (
            "nvidia-smi: Driver/library version mismatch: the loaded nvidia kernel module is not the version of the "
            "installed driver libraries; reboot (or unload and reload the nvidia modules) to load the installed driver"
        )
    if "couldn't communicate with the nvidia driver" in lowered or "driver is not loaded" in lowered:
        return (
            "nvidia-smi cannot communicate with the NVIDIA driver: the nvidia kernel module is not loaded "
            "(not built for the running kernel, blacklisted, or failed to load; see dmesg)"
        )
    if "no devices were found" in lowered:
        return "nvidia-smi finds no GPUs (No devices were found): the driver is loaded but sees no usable GPU"
    if "gpu is lost" in lowered or "fallen off the bus" in lowered:
        return "nvidia-smi reports a GPU that has fallen off the bus (GPU is lost): the node needs a power cycle"
    # `timeout` ended it: 124 on SIGTERM; on SIGKILL (it ignored SIGTERM) `timeout` kills its own process group
    # too, itself included, so the caller sees 137 or -9.
    if rc in (124, 137, -9):
        return "nvidia-smi did not answer in time: a GPU or the driver is hung"
    return f"nvidia-smi failed (exit code {rc}): {first_line(text) or 'no output'}"


def pci_key(address: str | None) -> str | None:
    """`00000000:3B:00.0`, `PCI:0000:3b:00` or `0000:3b:00` -> `0000:3b:00` (domain:bus:device, lower case)."""
    if not address:
        return None
    match = _BUS_ID.match(address.strip())
    if not match:
        return None
    domain, bus, device = match.groups()
    return f"{int(domain, 16):04x}:{bus.lower()}:{device.lower()}"
