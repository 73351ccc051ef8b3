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

# The process the driver names at the start of the message: "pid=4242, name=train.py, ..." (current drivers), with
# "pid='<unknown>', name=<unknown>" when none was running on the GPU.
_PROCESS = re.compile(r"^pid=(?P<pid>[^,]*)(?:,\s*name=(?P<name>[^,]*))?")

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
    pid: int | None = None
    """The process the driver names in the message, None when it names none."""
    process: str = ""
    """That process's name as the driver prints it (the kernel's 15-character `comm`); data, never a template."""
    job: str = ""
    """The Slurm job the process ran in, where the health program could tell (`scontrol pidinfo`); empty else."""
    user: str = ""
    """The user the process ran as, where the health program could tell; empty else."""


def parse_xid_log(text: str) -> list[XidEvent]:
    """NVRM XID events in kernel log text (journalctl -k, dmesg or syslog lines, with or without timestamps)."""
    events = []
    for line in text.splitlines():
        match = _XID.search(line)
        if not match:
            continue
        pci = pci_key(f"{match.group('domain')}:{match.group('bus')}:{match.group('device')}")
        gi = match.group("gi")
        message = (match.group("message") or "").strip()[:300]
        pid, process = process_of(message)
        events.append(
            XidEvent(
                xid=int(match.group("xid")),
                pci=pci or "",
                gpu_instance=int(gi) if gi is not None else None,
                message=message,
                pid=pid,
                process=process,
            )
        )
    return events


def process_of(message: str) -> tuple[int | None, str]:
    """The pid and the process name an XID message starts with; (None, "") where it names none."""
    match = _PROCESS.match(message)
    if not match:
        return None, ""
    pid = match.group("pid").strip()
    name = (match.group("name") or "").strip()
    if name == "<unknown>":
        name = ""
    return (int(pid) if pid.isascii() and pid.isdigit() and len(pid) <= 10 and int(pid) > 0 else None), name[:64]
