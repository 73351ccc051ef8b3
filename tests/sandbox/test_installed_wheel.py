"""gpuinfra as a user installs it: the built wheel in a fresh virtual environment, run from a folder outside the
checkout against the converged sandbox (test_apply_e2e.py converges it first).

Only the wheel and its dependencies from the package index go into the environment; the checkout is not on its
path, so every role and playbook `apply` runs comes from inside the wheel.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SANDBOX = ROOT / "inventories" / "sandbox"

pytestmark = [
    pytest.mark.sandbox,
    pytest.mark.skipif(shutil.which("podman") is None, reason="podman is not installed (gpuinfra sandbox needs it)"),
]


def _run(command: list[str], cwd: Path, timeout: int = 900) -> subprocess.CompletedProcess[str]:
    # PYTHONPATH and the checkout's virtual environment must not leak into the installed tool's runs.
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False)


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The gpuinfra command of a fresh virtual environment holding only the built wheel and its dependencies."""
    work = tmp_path_factory.mktemp("wheel")
    built = _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(work), str(ROOT)], cwd=work)
    assert built.returncode == 0, built.stderr
    (wheel,) = work.glob("gpuinfra-*.whl")
    venv = work / "venv"
    made = _run([sys.executable, "-m", "venv", str(venv)], cwd=work)
    assert made.returncode == 0, made.stderr
    install = _run([str(venv / "bin" / "pip"), "install", "-q", str(wheel)], cwd=work)
    assert install.returncode == 0, install.stderr
    return venv / "bin" / "gpuinfra"


@pytest.fixture(scope="module")
def elsewhere(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the sandbox's cluster file in a folder that has nothing to do with the checkout."""
    folder = tmp_path_factory.mktemp("site")
    shutil.copy(SANDBOX / "cluster.yml", folder / "cluster.yml")
    return folder


def test_the_installed_wheel_validates_plans_and_checks_the_converged_sandbox(installed: Path, elsewhere: Path) -> None:
    up = _run([str(installed), "sandbox", "up", "cluster.yml"], cwd=elsewhere)
    assert up.returncode == 0, up.stderr

    version = _run([str(installed), "--version"], cwd=elsewhere)
    assert version.returncode == 0 and version.stdout.startswith("gpuinfra "), version.stderr

    valid = _run([str(installed), "validate", "cluster.yml"], cwd=elsewhere)
    assert (valid.returncode, valid.stderr.strip()) == (0, "cluster.yml: valid"), valid.stdout

    plan = _run([str(installed), "plan", "cluster.yml", "--json"], cwd=elsewhere)
    assert plan.returncode == 0, plan.stderr
    assert "slurm.conf" in plan.stdout

    check = _run([str(installed), "apply", "cluster.yml", "--check", "--json"], cwd=elsewhere)
    assert check.stdout, check.stderr
    doc = json.loads(check.stdout)
    assert doc["failures"] == [] and doc["targets"] == ["ctl01", "gpu01", "gpu02"], doc["failures"]
    assert (check.returncode, doc["changes"]) == (0, []), doc.get("errors")
