from __future__ import annotations

import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import tool_guard

ROOT = Path(__file__).resolve().parents[2]
tool_guard.install()
_TOOL_LOGS = Path(tempfile.mkdtemp(prefix="gpuinfra-tools-"))
atexit.register(shutil.rmtree, _TOOL_LOGS, ignore_errors=True)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Record the tools each test starts, from its setup (which sets up a module's fixtures for its first test)."""
    tool_guard.watch(_TOOL_LOGS / f"{abs(hash(item.nodeid))}.log")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """Fail a test that started Ansible, a daemon or a system tool without the `tools` mark (tool_guard.py)."""
    outcome = yield
    report = outcome.get_result()
    if call.when != "teardown" or not report.passed or item.get_closest_marker("tools") is not None:
        return
    started = tool_guard.started()
    if started:
        report.outcome = "failed"
        report.longrepr = f"started {sorted(started)}: mark the test or its module `tools` (scripts/check omits it)"


@pytest.fixture
def root() -> Path:
    return ROOT


@pytest.fixture(scope="session")
def collections(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A collections path where gpuinfra.cluster is this checkout."""
    path = tmp_path_factory.mktemp("collections")
    (path / "ansible_collections" / "gpuinfra").mkdir(parents=True)
    (path / "ansible_collections" / "gpuinfra" / "cluster").symlink_to(ROOT)
    return path


@pytest.fixture
def run_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Run directories are created here, so tests can look at them and see them go."""
    root = tmp_path / "runs"
    root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(root))
    return root


AnsibleJson = Callable[[list[str], Path], tuple[int, dict[str, Any], str]]


@pytest.fixture
def ansible_json(tmp_path: Path, collections: Path) -> AnsibleJson:
    """Runs an `ansible` or `ansible-playbook` command on this machine with the JSON callback and this checkout's
    collection, the fake tools of a folder first on PATH; returns its exit code, the JSON document and stdout."""
    venv_bin = Path(sys.executable).parent

    def run(command: list[str], tools: Path) -> tuple[int, dict[str, Any], str]:
        env = {
            **os.environ,
            "PATH": f"{tools}:{venv_bin}:/usr/local/bin:/usr/bin:/bin",
            "ANSIBLE_COLLECTIONS_PATH": str(collections),
            "ANSIBLE_LOAD_CALLBACK_PLUGINS": "1",
            "ANSIBLE_STDOUT_CALLBACK": "json",
            "ANSIBLE_LOCAL_TEMP": str(tmp_path / "ansible-local"),
            "ANSIBLE_HOME": str(tmp_path / "ansible-home"),
            "ANSIBLE_NOCOLOR": "1",
        }
        proc = subprocess.run(command, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False)
        try:
            return proc.returncode, json.loads(proc.stdout), proc.stdout
        except json.JSONDecodeError:
            pytest.fail(f"ansible printed no JSON (rc {proc.returncode}): {proc.stdout}\n{proc.stderr}")

    return run
