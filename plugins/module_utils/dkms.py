# Copyright: gpuinfra maintainers
# Apache License 2.0 (see LICENSE)
"""`dkms status` read into entries, driver and kernel versions compared, and the kernels that lack the
nvidia module.

Standard library only, Python 3.9 or newer, no I/O: it runs on managed hosts (the gpu_health and
nvidia_dkms_status modules, the gpuinfra-health program) and on the controller (testinfra, tests).
"""

from __future__ import annotations

import functools
import glob
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass

# Names DKMS registers the NVIDIA kernel module under: Debian (nvidia-current, nvidia-tesla-NNN), NVIDIA's and
# Ubuntu's repositories (nvidia), and the open kernel modules of each.
NVIDIA_DKMS_NAME = re.compile(r"^nvidia(-current|-tesla-[0-9]+)?(-open)?$")

# DKMS 3: "name/version, kernel, arch: state (note)"; DKMS 2: "name, version, kernel, arch: state". Both print
# "name[/,] version: added" for a module added but built for no kernel.
_DKMS = re.compile(
    r"^(?P<name>[^\s,/:]+)\s*[/,]\s*(?P<version>[^\s,:]+)"
    r"(?:,\s*(?P<kernel>[^\s,:]+))?(?:,\s*(?P<arch>[^\s,:]+))?"
    r":\s*(?P<state>[A-Za-z-]+)(?:\s*\((?P<note>.*)\))?\s*$"
)


@dataclass
class DkmsEntry:
    module: str
    version: str
    kernel: str
    """Empty for a module added to DKMS but built for no kernel."""
    arch: str
    state: str
    note: str = ""


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


# Files beside the images that are not kernels: backups, and dpkg's own while it unpacks a kernel package
# (vmlinuz-RELEASE.dpkg-new until the package is configured).
NOT_A_KERNEL = (".old", ".bak", ".dpkg-new", ".dpkg-tmp", ".dpkg-old", ".dpkg-dist", ".dpkg-bak")


def installed_kernels(boot_dir: str = "/boot", modules_dir: str = "/lib/modules", running: str = "") -> list[str]:
    """Kernel releases installed on this root file system, oldest first: an image in /boot (vmlinuz-RELEASE, the
    way GRUB's generator finds them) or in the release's modules folder; and `running` where its modules folder
    exists (in a container the running kernel belongs to the host, so it counts only with its modules here)."""
    releases = set()
    for path in glob.glob(os.path.join(boot_dir, "vmlinuz-*")):
        release = os.path.basename(path)[len("vmlinuz-") :]
        if release and not release.endswith(NOT_A_KERNEL) and "rescue" not in release:
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
