"""What the sandbox tests share: the committed sandbox cluster file, the CLI, SSH to a host, the skip when a tool
is missing, and a converged sandbox for a test file run on its own."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SANDBOX_CLUSTER = ROOT / "inventories" / "sandbox" / "cluster.yml"


def missing_tool() -> str | None:
    for tool in ("podman", "runc", "ssh", "ssh-keygen"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (gpuinfra sandbox needs it)"
    return None


# Every sandbox test file's pytestmark.
MARKS = [pytest.mark.sandbox, pytest.mark.skipif(missing_tool() is not None, reason=missing_tool() or "")]


def gpuinfra(*args: str, timeout: int = 3600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpuinfra", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )


def on_host(host: str, *command: str) -> subprocess.CompletedProcess[str]:
    """Run a command on a sandbox host over SSH, as the runs connect."""
    from gpuinfra.sandbox import ssh

    return ssh(SANDBOX_CLUSTER, host, list(command))


def converged() -> Path:
    """The sandbox up, and converged unless Slurm's controller already runs (test_apply_e2e.py converges it
    first when the whole folder runs)."""
    up = gpuinfra("sandbox", "up")
    assert up.returncode == 0, up.stderr
    if on_host("ctl01", "systemctl", "is-active", "slurmctld", "slurmdbd").returncode != 0:
        applied = gpuinfra("apply", str(SANDBOX_CLUSTER), "--yes")
        assert applied.returncode == 0, applied.stdout[-3000:] + applied.stderr[-3000:]
    return SANDBOX_CLUSTER
