"""A GPU node's end state, checked on the node itself (testinfra).

Each check compares the node with what its inventory variables say (the driver pin, the GPU count, MIG layouts,
the health policy); see conftest.py for how to point the suite at a fleet. Checks that need a GPU skip, naming the
reason, on hosts without one (containers, build machines).
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from file_module import module_util

dkms = module_util("dkms")
smi_report = module_util("smi_report")
verdicts = module_util("verdict")
xid_log = module_util("xid_log")

DEBIAN_FAMILY = ("debian", "ubuntu")


def _installed_kernels(host: Any) -> list[str]:
    """Kernel images in /boot, and the running kernel where its modules folder exists (not in a container)."""
    images = host.run("sh -c 'ls /boot/vmlinuz-* 2>/dev/null'").stdout.split()
    releases = {path.rsplit("/vmlinuz-", 1)[1] for path in images if not path.endswith((".old", ".bak"))}
    running = host.run("uname -r").stdout.strip()
    if host.file(f"/lib/modules/{running}").is_directory:
        releases.add(running)
    return sorted(releases)


def _upstream(version: str) -> str:
    """Debian version -> upstream version: 1:535.261.03-1~deb12u1 -> 535.261.03."""
    return version.split(":", 1)[-1].rsplit("-", 1)[0]


def _pinned_packages(host: Any, pin: str) -> list[str]:
    """Installed packages at the pinned driver version (the driver's own packages; Debian's companions differ)."""
    out = host.check_output("dpkg-query -W -f='${Package}\\t${Version}\\t${db:Status-Status}\\n'")
    packages = []
    for line in out.splitlines():
        name, version, status = [*line.split("\t"), "", "", ""][:3]
        if status == "installed" and dkms.version_matches(_upstream(version), pin):
            packages.append(name)
    return sorted(packages)


def _need_debian(host: Any) -> None:
    if host.system_info.distribution not in DEBIAN_FAMILY:
        pytest.skip(
            f"apt holds and unattended-upgrades are checked on Debian and Ubuntu, not {host.system_info.distribution}"
        )


def _need_gpu(nvidia_gpus: list[str], what: str) -> None:
    if not nvidia_gpus:
        pytest.skip(f"no NVIDIA GPU on this host (none in /sys/bus/pci/devices): {what}")


def test_dkms_installed_for_every_kernel(host: Any, expected: Any) -> None:
    pin = expected.need_pin()
    kernels = _installed_kernels(host)
    assert kernels, "no installed kernel found: no /boot/vmlinuz-*, and the running kernel has no /lib/modules"
    status = host.run("dkms status")
    assert status.rc == 0, f"dkms status failed: {status.stderr.strip()}"
    problems = dkms.dkms_problems(dkms.parse_dkms_status(status.stdout), pin, kernels, expected.dkms_module)
    assert problems == [], "\n".join(problems)


def test_kernel_module_is_the_pin(host: Any, expected: Any, nvidia_gpus: list[str]) -> None:
    pin = expected.need_pin()
    modinfo = host.run("modinfo -F version nvidia")
    if modinfo.rc != 0 and not nvidia_gpus:
        running = host.run("uname -r").stdout.strip()
        pytest.skip(
            f"modinfo finds no nvidia module for the running kernel {running} and the host has no NVIDIA GPU "
            "(a container, or a machine without a GPU): the module cannot load here"
        )
    assert modinfo.rc == 0, f"modinfo finds no nvidia module for the running kernel: {modinfo.stderr.strip()}"
    version = modinfo.stdout.strip()
    assert dkms.version_matches(version, pin), f"modinfo -F version nvidia is {version}, the pin is {pin}"
    loaded = host.file("/sys/module/nvidia/version")
    if loaded.exists:
        assert dkms.version_matches(loaded.content_string.strip(), pin), "the loaded nvidia module is not the pin"


def _unless_disabled(inventory_vars: dict[str, Any], variable: str, what: str) -> None:
    if inventory_vars.get(variable) is False:
        pytest.skip(f"the inventory sets {variable}: false, so {what} is not expected")


def test_nouveau_blacklisted(host: Any, inventory_vars: dict[str, Any], nvidia_gpus: list[str]) -> None:
    _unless_disabled(inventory_vars, "nvidia_driver_blacklist_nouveau", "a nouveau blacklist")
    if host.exists("modprobe"):
        config = host.check_output("modprobe -c")
    else:
        config = host.run(
            "sh -c 'cat /etc/modprobe.d/*.conf /usr/lib/modprobe.d/*.conf /lib/modprobe.d/*.conf 2>/dev/null'"
        ).stdout
    blacklisted = re.search(r"^blacklist\s+nouveau\s*$", config, re.MULTILINE) is not None
    assert blacklisted, "nouveau is not blacklisted (no 'blacklist nouveau' in the modprobe configuration)"
    if nvidia_gpus:  # in a container /proc/modules lists the host's modules
        loaded = re.search(r"^nouveau\s", host.file("/proc/modules").content_string, re.MULTILINE) is not None
        assert not loaded, "nouveau is loaded"


def test_driver_packages_held(host: Any, expected: Any) -> None:
    _need_debian(host)
    pin = expected.need_pin()
    packages = _pinned_packages(host, pin)
    assert packages, f"no installed package is at the pinned driver version {pin}"
    assert any("dkms" in name for name in packages), f"no DKMS package of the driver at {pin}: {packages}"
    held = set(host.check_output("apt-mark showhold").split())
    assert sorted(set(packages) - held) == [], "driver packages at the pin that are not held"


def test_unattended_upgrades_leave_the_driver_alone(host: Any, expected: Any) -> None:
    _need_debian(host)
    pin = expected.need_pin()
    dump = host.check_output("apt-config dump Unattended-Upgrade::Package-Blacklist")
    patterns = re.findall(r'^Unattended-Upgrade::Package-Blacklist::\s+"([^"]*)";', dump, re.MULTILINE)
    assert patterns, "Unattended-Upgrade::Package-Blacklist is empty"
    packages = _pinned_packages(host, pin)
    # unattended-upgrades matches each entry as a Python regular expression from the start of the package name.
    exposed = [name for name in packages if not any(re.match(p, name) for p in patterns)]
    assert exposed == [], f"unattended-upgrades may upgrade these driver packages (blacklist: {patterns})"


def test_persistence_daemon(host: Any, inventory_vars: dict[str, Any], nvidia_gpus: list[str]) -> None:
    _unless_disabled(inventory_vars, "nvidia_driver_persistenced", "nvidia-persistenced")
    _unless_disabled(inventory_vars, "gpu_health_require_persistence", "persistence mode")
    service = host.service("nvidia-persistenced")
    assert service.is_enabled, "nvidia-persistenced is not enabled"
    _need_gpu(nvidia_gpus, "nvidia-persistenced only runs where it finds a GPU")
    assert service.is_running, "nvidia-persistenced is not running"


def test_nvidia_smi_lists_the_modelled_gpus(host: Any, expected: Any, nvidia_gpus: list[str]) -> None:
    _need_gpu(nvidia_gpus, "nothing for nvidia-smi -L to list")
    count = expected.need_gpu_count()
    listing = host.run("nvidia-smi -L")
    assert listing.rc == 0, f"nvidia-smi -L failed: {(listing.stdout + listing.stderr).strip()}"
    gpus = [line for line in listing.stdout.splitlines() if line.startswith("GPU ")]
    assert len(gpus) == count, f"nvidia-smi -L lists {len(gpus)} GPU(s), the model expects {count}"


def test_health_verdict(host: Any, expected: Any, nvidia_gpus: list[str]) -> None:
    """The gpu_health module's own verdict, computed here from the node's nvidia-smi output and kernel log."""
    _need_gpu(nvidia_gpus, "nvidia-smi has nothing to report")
    smi = host.run("nvidia-smi -q -x")
    node_problems = []
    try:
        report = smi_report.parse_smi_xml(smi.stdout)
    except smi_report.SmiError:
        report = None
        node_problems.append(smi_report.smi_failure(smi.rc, smi.stdout, smi.stderr))
    log = host.run("journalctl -k -b --no-pager -q -o short-iso")
    if log.rc != 0:
        log = host.run("dmesg")
    assert log.rc == 0, "cannot read the kernel log (run with --sudo?)"
    policy = verdicts.Policy(
        expected_count=expected.gpu_count or None,
        driver_version=expected.pin,
        mig_layouts=expected.mig_layouts,
        **expected.policy,
    )
    verdict = verdicts.assess(report, policy, xid_log.parse_xid_log(log.stdout), node_problems)
    assert verdict["healthy"], verdicts.failure_message(verdict)
