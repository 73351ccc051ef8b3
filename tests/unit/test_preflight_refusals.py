"""Each refusal of the GPU node preflight (roles/gpu_preflight), from a real run of the role on this machine.

The role only reads, so it runs here through ansible-runner with the real tools (od, apt-cache, lslocks, dpkg and
the mount facts). Each fault is made for real on something the test owns, and pointed at where the role looks:
an EFI variable saying Secure Boot is on, a kernel whose headers no package list carries, a free-space need no disk
meets, a package manager lock held by another process, and a dpkg database with a half-configured package.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from test_upgrade_dpkg_lock import hold

from gpuinfra.run import Outcome, RunOptions, run_playbook

pytestmark = pytest.mark.tools  # runs Ansible or a system tool (tests/unit/tool_guard.py)

HALF_CONFIGURED = """\
Package: gpuinfra-test-half
Status: install ok half-configured
Priority: optional
Section: misc
Maintainer: gpuinfra tests <tests@gpuinfra.invalid>
Architecture: all
Version: 1.0
Description: a package left half-configured

"""
# Each refusal, by the words that start it and the fix it names: Secure Boot, headers, space, a lock, dpkg.
REFUSALS = (
    ("Secure Boot is on", "mokutil --import"),
    ("Kernel 6.1.0-9999-amd64: linux-headers-6.1.0-9999-amd64 is not in the package lists", "apt-get update"),
    ("/var has ", "apt-get clean"),
    ("The package manager is busy (", "wait for that process"),
    ("Packages are left half-installed (dpkg --audit): ", "dpkg --configure -a"),
)


def preflight(tmp_path: Path, **faults: object) -> tuple[Outcome, str]:
    playbook = tmp_path / "preflight.yml"
    playbook.write_text(
        "- name: Check the node before its driver\n"
        "  hosts: all\n"
        "  tasks:\n"
        "    - name: Run the preflight\n"
        "      ansible.builtin.include_role:\n"
        "        name: gpuinfra.cluster.gpu_preflight\n"
    )
    inventory = {"all": {"hosts": {"node": {"ansible_connection": "local", "ansible_python_interpreter": "python3"}}}}
    result = run_playbook(inventory, RunOptions(playbook=playbook, extra_vars=faults), hosts=["node"])
    return result.outcome, "\n".join(failure.message for failure in result.failures)


def test_every_refusal_is_reported_at_once_with_its_fix(tmp_path: Path, run_root: Path) -> None:
    efivar = tmp_path / "SecureBoot"
    efivar.write_bytes(bytes([6, 0, 0, 0, 1]))  # 4 attribute bytes, then 1: on
    lock = tmp_path / "lock-frontend"
    lock.touch()
    admin = tmp_path / "dpkg"
    for folder in ("updates", "info"):
        (admin / folder).mkdir(parents=True)
    (admin / "status").write_text(HALF_CONFIGURED)
    for control in ("list", "md5sums"):
        (admin / "info" / f"gpuinfra-test-half.{control}").touch()
    with hold(lock, 300):
        outcome, message = preflight(
            tmp_path,
            __gpu_preflight_secure_boot_var=str(efivar),
            gpu_preflight_kernels=["6.1.0-9999-amd64"],
            gpu_preflight_min_free_mb={"/var": 1 << 30},
            __gpu_preflight_locks=[str(lock)],
            __gpu_preflight_audit_command=["dpkg", f"--admindir={admin}", "--audit"],
        )
    assert outcome is Outcome.FAILED, message
    assert "Preflight found 5 problem(s) on node:" in message, message
    for start, fix in REFUSALS:
        assert start in message and fix in message, (start, message)
    assert "gpuinfra-test-half" in message and str(lock) in message
