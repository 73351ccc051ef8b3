"""plugins/module_utils/dkms.py: `dkms status` in both formats, the kernels without the module, and versions."""

from __future__ import annotations

import pytest
from smi_data import dkms

# --- DKMS and the kernel module -------------------------------------------------------------------------------

DKMS3 = """\
nvidia-current/535.261.03, 6.1.0-31-amd64, x86_64: installed
nvidia-current/535.261.03, 6.1.0-32-amd64, x86_64: built
nvidia-current/535.216.03, 6.12.12+bpo-amd64, x86_64: installed (WARNING! Diff between built and installed module!)
nvidia-fs/2.20.5, 6.1.0-31-amd64, x86_64: installed
nvidia-current/535.261.03: added
Error! Could not locate dkms.conf file.
"""

DKMS2 = """\
nvidia, 470.256.02, 5.15.0-91-generic, x86_64: installed
nvidia, 470.256.02, 5.15.0-94-generic, x86_64: installed (original_module exists)
"""


def test_parse_dkms_status_both_formats() -> None:
    entries = dkms.parse_dkms_status(DKMS3) + dkms.parse_dkms_status(DKMS2)
    assert [(e.module, e.version, e.kernel, e.arch, e.state, e.note) for e in entries] == [
        ("nvidia-current", "535.261.03", "6.1.0-31-amd64", "x86_64", "installed", ""),
        ("nvidia-current", "535.261.03", "6.1.0-32-amd64", "x86_64", "built", ""),
        (
            "nvidia-current",
            "535.216.03",
            "6.12.12+bpo-amd64",
            "x86_64",
            "installed",
            "WARNING! Diff between built and installed module!",
        ),
        ("nvidia-fs", "2.20.5", "6.1.0-31-amd64", "x86_64", "installed", ""),
        ("nvidia-current", "535.261.03", "", "", "added", ""),
        ("nvidia", "470.256.02", "5.15.0-91-generic", "x86_64", "installed", ""),
        ("nvidia", "470.256.02", "5.15.0-94-generic", "x86_64", "installed", "original_module exists"),
    ]


def test_dkms_problems_per_kernel() -> None:
    entries = dkms.parse_dkms_status(DKMS3)
    kernels = ["6.1.0-31-amd64", "6.1.0-32-amd64", "6.12.12+bpo-amd64", "6.1.0-99-amd64"]
    assert dkms.dkms_problems(entries, "535.261.03", kernels) == [
        "DKMS: the nvidia module 535.261.03 is not installed for kernel 6.1.0-32-amd64 "
        "(nvidia-current/535.261.03: built)",
        "DKMS: no nvidia module 535.261.03 for kernel 6.12.12+bpo-amd64, only nvidia-current/535.216.03: installed",
        "DKMS: no nvidia module 535.261.03 for kernel 6.1.0-99-amd64",
    ]
    assert dkms.dkms_problems(entries, "535", ["6.12.12+bpo-amd64"]) == []  # a branch pin accepts 535.216.03
    assert dkms.dkms_problems(entries, "535.261.03", ["6.1.0-31-amd64"], module="nvidia") == [
        "DKMS: no nvidia module 535.261.03 for kernel 6.1.0-31-amd64"
    ]
    # nvidia-fs (GPUDirect Storage) is not the driver
    assert dkms.dkms_problems(dkms.parse_dkms_status(DKMS3.splitlines()[3]), "2.20.5", ["6.1.0-31-amd64"]) == [
        "DKMS: no nvidia module 2.20.5 for kernel 6.1.0-31-amd64"
    ]


def test_kernel_module_problems() -> None:
    assert dkms.kernel_module_problems("535.261.03", "535.261.03", "535.261.03") == []
    assert dkms.kernel_module_problems("", None, None) == []
    assert dkms.kernel_module_problems("535.261.03", None, None) == [
        "modinfo finds no nvidia kernel module for the running kernel (the pin is 535.261.03)"
    ]
    assert dkms.kernel_module_problems("535.261.03", "535.216.03", "535.216.03") == [
        "modinfo: the nvidia kernel module is 535.216.03, the pin is 535.261.03",
        "the loaded nvidia kernel module is 535.216.03, the pin is 535.261.03: reboot to load the pinned driver",
    ]
    # installed for the running kernel but the old one still loaded: the state a driver upgrade leaves
    assert dkms.kernel_module_problems("535.261.03", "535.261.03", "535.216.03") == [
        "the loaded nvidia kernel module is 535.216.03, the pin is 535.261.03: reboot to load the pinned driver"
    ]


@pytest.mark.parametrize(
    ("actual", "pin", "ok"),
    [
        ("535.261.03", "535.261.03", True),
        ("535.261.03", "535.261.3", False),
        ("535.261.03", "535", True),
        ("550.127.05", "535", False),
        (None, "535", False),
        (None, "", True),
        ("5350.1", "535", False),
    ],
)
def test_version_matches(actual: str | None, pin: str, ok: bool) -> None:
    assert dkms.version_matches(actual, pin) is ok
