# Copyright: gpuinfra maintainers
# Apache License 2.0 (see LICENSE)
"""NVRM XID events read from kernel log text (journalctl -k, dmesg or syslog lines).

Standard library only, Python 3.9 or newer, no I/O: it runs on managed hosts (the gpu_health and
nvidia_dkms_status modules, the gpuinfra-health program) and on the controller (testinfra, tests).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .smi_report import pci_key

_XID = re.compile(
    r"NVRM: Xid \((?:PCI:)?(?P<domain>[0-9A-Fa-f]{4,8}):(?P<bus>[0-9A-Fa-f]{2}):(?P<device>[0-9A-Fa-f]{2})"
    r"(?:\.[0-7])?(?:\s+GPU-I:(?P<gi>[0-9]+))?\):\s*(?P<xid>[0-9]+)(?:,\s*(?P<message>.*))?"
)


@dataclass
class XidEvent:
    xid: int
    pci: str
    """Normalised PCI address of the GPU, domain:bus:device in lower case, e.g. 0000:3b:00."""
    gpu_instance: int | None
    message: str


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
