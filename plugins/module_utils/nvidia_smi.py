# Copyright: gpuinfra maintainers
# Apache License 2.0 (see LICENSE)
"""Read a GPU node's state and judge it against a health policy.

Parses `nvidia-smi -q -x`, the NVRM XID lines of the kernel log and `dkms status`, and turns them, with a policy,
into a verdict: per-GPU problems and node problems, each a sentence an operator can act on.

This is the one copy of that parsing. It runs on managed hosts (the `gpu_health` and `nvidia_dkms_status` modules,
the `gpuinfra-health` program the gpu_health role installs) and on the controller (the testinfra suite,
tests): standard library only, Python 3.9 or newer, no I/O here. node_probe.py runs the commands.
"""

from __future__ import annotations

import functools
import glob
import os
import re
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

# Clock event (throttle) reasons that mean the GPU is being slowed by heat or by the board, not by choice: idle,
# application clocks, sync boost, display clocks and the software power cap are normal operation.
BAD_CLOCK_REASONS = ("hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown", "sw_thermal_slowdown")

# Names DKMS registers the NVIDIA kernel module under: Debian (nvidia-current, nvidia-tesla-NNN), NVIDIA's and
# Ubuntu's repositories (nvidia), and the open kernel modules of each.
NVIDIA_DKMS_NAME = re.compile(r"^nvidia(-current|-tesla-[0-9]+)?(-open)?$")

# Texts nvidia-smi prints in a field it could not read.
_UNAVAILABLE = {"", "n/a", "[n/a]", "not supported", "[not supported]", "unknown error", "[unknown error]", "none"}
_LOST = ("gpu is lost", "gpu requires reset")

_XID = re.compile(
    r"NVRM: Xid \((?:PCI:)?(?P<domain>[0-9A-Fa-f]{4,8}):(?P<bus>[0-9A-Fa-f]{2}):(?P<device>[0-9A-Fa-f]{2})"
    r"(?:\.[0-7])?(?:\s+GPU-I:(?P<gi>[0-9]+))?\):\s*(?P<xid>[0-9]+)(?:,\s*(?P<message>.*))?"
)
_BUS_ID = re.compile(r"^(?:PCI:)?([0-9A-Fa-f]{4,8}):([0-9A-Fa-f]{2}):([0-9A-Fa-f]{2})(?:\.[0-7])?$")
# DKMS 3: "name/version, kernel, arch: state (note)"; DKMS 2: "name, version, kernel, arch: state". Both print
# "name[/,] version: added" for a module added but built for no kernel.
_DKMS = re.compile(
    r"^(?P<name>[^\s,/:]+)\s*[/,]\s*(?P<version>[^\s,:]+)"
    r"(?:,\s*(?P<kernel>[^\s,:]+))?(?:,\s*(?P<arch>[^\s,:]+))?"
    r":\s*(?P<state>[A-Za-z-]+)(?:\s*\((?P<note>.*)\))?\s*$"
)
_LEADING_INT = re.compile(r"^\s*(-?[0-9]+)")
# The process an XID names comes first in its message ("pid=..., name=..., "); the cause follows.
_XID_PROCESS = re.compile(r"^pid=[^,]*,\s*(?:name=[^,]*,\s*)?")


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


@dataclass
class XidEvent:
    xid: int
    pci: str
    """Normalised PCI address of the GPU, domain:bus:device in lower case, e.g. 0000:3b:00."""
    gpu_instance: int | None
    message: str


@dataclass
class DkmsEntry:
    module: str
    version: str
    kernel: str
    """Empty for a module added to DKMS but built for no kernel."""
    arch: str
    state: str
    note: str = ""


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


# --- kernel log -------------------------------------------------------------------------------------------------


def pci_key(address: str | None) -> str | None:
    """`00000000:3B:00.0`, `PCI:0000:3b:00` or `0000:3b:00` -> `0000:3b:00` (domain:bus:device, lower case)."""
    if not address:
        return None
    match = _BUS_ID.match(address.strip())
    if not match:
        return None
    domain, bus, device = match.groups()
    return f"{int(domain, 16):04x}:{bus.lower()}:{device.lower()}"


def parse_xid_log(text: str) -> list[XidEvent]:
    """NVRM XID events in kernel log text (journalctl -k, dmesg or syslog lines, with or without timestamps)."""
    events = []
    for line in text.splitlines():
        match = _XID.search(line)
        if not match:
            continue
        pci = pci_key(f"{match.group('domain')}:{match.group('bus')}:{match.group('device')}")
        gi = match.group("gi")
        events.append(
            XidEvent(
                xid=int(match.group("xid")),
                pci=pci or "",
                gpu_instance=int(gi) if gi is not None else None,
                message=(match.group("message") or "").strip()[:300],
            )
        )
    return events


# --- dkms status ------------------------------------------------------------------------------------------------


def parse_dkms_status(text: str) -> list[DkmsEntry]:
    """Status lines of `dkms status`, in the DKMS 2.x or 3.x format; other lines are ignored."""
    entries = []
    for line in text.splitlines():
        match = _DKMS.match(line.strip())
        if match:
            entries.append(
                DkmsEntry(
                    module=match.group("name"),
                    version=match.group("version"),
                    kernel=match.group("kernel") or "",
                    arch=match.group("arch") or "",
                    state=match.group("state").lower(),
                    note=(match.group("note") or "").strip(),
                )
            )
    return entries


def version_matches(actual: str | None, pin: str) -> bool:
    """An exact pin (535.261.03) must match exactly; a branch (535) matches any version of that branch."""
    if not pin:
        return True
    if not actual:
        return False
    actual = actual.strip()
    if "." not in pin:
        return actual.split(".")[0] == pin
    return actual == pin


def _order(char: str) -> int:
    if char == "~":
        return -1
    if char.isalpha():
        return ord(char)
    return ord(char) + 256 if char else 0


def compare_versions(a: str, b: str) -> int:
    """Negative, zero or positive as `a` sorts before, with or after `b`, the way dpkg orders upstream versions
    (kernel releases such as 6.1.0-31-amd64 and 6.12.95+deb12-amd64 included)."""
    i = j = 0
    while i < len(a) or j < len(b):
        first_diff = 0
        while (i < len(a) and not a[i].isdigit()) or (j < len(b) and not b[j].isdigit()):
            ac = _order(a[i]) if i < len(a) and not a[i].isdigit() else 0
            bc = _order(b[j]) if j < len(b) and not b[j].isdigit() else 0
            if ac != bc:
                return ac - bc
            i += 1
            j += 1
        while i < len(a) and a[i] == "0":
            i += 1
        while j < len(b) and b[j] == "0":
            j += 1
        while i < len(a) and a[i].isdigit() and j < len(b) and b[j].isdigit():
            if not first_diff:
                first_diff = ord(a[i]) - ord(b[j])
            i += 1
            j += 1
        if i < len(a) and a[i].isdigit():
            return 1
        if j < len(b) and b[j].isdigit():
            return -1
        if first_diff:
            return first_diff
    return 0


version_key = functools.cmp_to_key(compare_versions)


def installed_kernels(boot_dir: str = "/boot", modules_dir: str = "/lib/modules", running: str = "") -> list[str]:
    """Kernel releases installed on this root file system, oldest first: an image in /boot (vmlinuz-RELEASE, the
    way GRUB's generator finds them) or in the release's modules folder; and `running` where its modules folder
    exists (in a container the running kernel belongs to the host, so it counts only with its modules here)."""
    releases = set()
    for path in glob.glob(os.path.join(boot_dir, "vmlinuz-*")):
        release = os.path.basename(path)[len("vmlinuz-") :]
        if release and not release.endswith((".old", ".bak")) and "rescue" not in release:
            releases.add(release)
    for path in glob.glob(os.path.join(modules_dir, "*", "vmlinuz")):
        releases.add(os.path.basename(os.path.dirname(path)))
    if running and os.path.isdir(os.path.join(modules_dir, running)):
        releases.add(running)
    return sorted(releases, key=version_key)


def dkms_problems(
    entries: Sequence[DkmsEntry], pin: str, kernels: Sequence[str], module: str | None = None
) -> list[str]:
    """One problem per kernel that has no DKMS-built NVIDIA module at the pinned version in state `installed`."""
    problems = []
    for kernel in kernels:
        mine = [
            e
            for e in entries
            if e.kernel == kernel and (e.module == module if module else NVIDIA_DKMS_NAME.match(e.module))
        ]
        wanted = [e for e in mine if version_matches(e.version, pin)]
        if any(e.state == "installed" for e in wanted):
            continue
        if wanted:
            states = ", ".join(sorted({f"{e.module}/{e.version}: {e.state}" for e in wanted}))
            problems.append(f"DKMS: the nvidia module {pin} is not installed for kernel {kernel} ({states})")
        elif mine:
            others = ", ".join(sorted({f"{e.module}/{e.version}: {e.state}" for e in mine}))
            problems.append(f"DKMS: no nvidia module {pin} for kernel {kernel}, only {others}")
        else:
            problems.append(f"DKMS: no nvidia module {pin} for kernel {kernel}")
    return problems


def kernel_module_problems(pin: str, modinfo_version: str | None, loaded_version: str | None) -> list[str]:
    """The nvidia module the running kernel would load (modinfo) and the one it has loaded, against the pin."""
    problems: list[str] = []
    if not pin:
        return problems
    if modinfo_version is None:
        problems.append(f"modinfo finds no nvidia kernel module for the running kernel (the pin is {pin})")
    elif not version_matches(modinfo_version, pin):
        problems.append(f"modinfo: the nvidia kernel module is {modinfo_version}, the pin is {pin}")
    if loaded_version is not None and not version_matches(loaded_version, pin):
        problems.append(
            f"the loaded nvidia kernel module is {loaded_version}, the pin is {pin}: reboot to load the pinned driver"
        )
    return problems


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
