"""The local_packages role on this machine: a package whose sha256 differs from the one recorded where it was built
is refused before anything is copied to the host or installed."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from test_run import local_inventory, options

from gpuinfra.run import Outcome, run_playbook

pytestmark = pytest.mark.tools  # runs Ansible (tests/unit/tool_guard.py)


def test_a_package_changed_since_its_build_is_refused_with_both_hashes(run_root: Path, tmp_path: Path) -> None:
    cache, dest = tmp_path / "cache", tmp_path / "host"
    cache.mkdir()
    package = cache / "enroot_4.1.2-1_amd64.deb"
    package.write_bytes(b"the package as it was built")
    recorded = hashlib.sha256(package.read_bytes()).hexdigest()
    package.write_bytes(b"the package as someone changed it")
    now = hashlib.sha256(package.read_bytes()).hexdigest()
    settings = {
        "local_packages_src": str(cache),
        "local_packages_dest": str(dest),
        "local_packages_sha256": {package.name: recorded},
    }
    result = run_playbook(local_inventory("n1"), options("local_packages.yml", extra_vars=settings))
    assert result.outcome is Outcome.FAILED
    [failure] = result.failures
    assert failure.task.endswith("Check each package against the sha256 recorded where it was built")
    assert f"has sha256 {now}, but sha256 {recorded} was recorded" in " ".join(failure.message.split())
    assert list(dest.iterdir()) == []


def test_a_package_with_no_record_is_refused(run_root: Path, tmp_path: Path) -> None:
    cache, dest = tmp_path / "cache", tmp_path / "host"
    cache.mkdir()
    (cache / "enroot_4.1.2-1_amd64.deb").write_bytes(b"planted")
    (cache / "nvslurm-plugin-pyxis_0.24.0-1_amd64.deb").write_bytes(b"built")
    recorded = {"nvslurm-plugin-pyxis_0.24.0-1_amd64.deb": hashlib.sha256(b"built").hexdigest()}
    settings = {"local_packages_src": str(cache), "local_packages_dest": str(dest), "local_packages_sha256": recorded}
    result = run_playbook(local_inventory("n1"), options("local_packages.yml", extra_vars=settings))
    assert result.outcome is Outcome.FAILED
    assert "but no sha256 was recorded" in " ".join(result.failures[0].message.split())
    assert list(dest.iterdir()) == []
