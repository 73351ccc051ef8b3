"""`gpuinfra apply` against the sandbox cluster: podman containers with systemd, reached over real SSH.

The steps build on each other (fresh hosts -> check -> apply -> re-apply), so they run in file order in one module.
The sandbox is brought up once and left running for the next session; `gpuinfra sandbox` manages its life.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from ruamel.yaml import YAML

ROOT = Path(__file__).resolve().parents[2]
SANDBOX_CLUSTER = ROOT / "inventories" / "sandbox" / "cluster.yml"


def _missing() -> str | None:
    if importlib.util.find_spec("gpuinfra.sandbox") is None:
        return "`gpuinfra sandbox up` (gpuinfra/sandbox.py) does not exist yet"
    if shutil.which("podman") is None:
        return "podman is not installed"
    if not (ROOT / "playbooks" / "site.yml").is_file():
        return "playbooks/site.yml does not exist yet"
    return None


pytestmark = [pytest.mark.sandbox, pytest.mark.skipif(_missing() is not None, reason=_missing() or "")]


def gpuinfra(*args: str, timeout: int = 3600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpuinfra", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )


def apply_json(cluster: Path, *args: str) -> tuple[int, dict[str, Any]]:
    done = gpuinfra("apply", str(cluster), "--json", *args)
    assert done.stdout, done.stderr
    doc: dict[str, Any] = json.loads(done.stdout)
    assert doc["exit_code"] == done.returncode
    return done.returncode, doc


@pytest.fixture(scope="module")
def sandbox() -> Path:
    up = gpuinfra("sandbox", "up")
    assert up.returncode == 0, up.stderr
    assert SANDBOX_CLUSTER.is_file()
    return SANDBOX_CLUSTER


def test_check_on_fresh_hosts_reports_pending_changes(sandbox: Path) -> None:
    code, doc = apply_json(sandbox, "--check", "--detailed-exitcode")
    assert doc["failures"] == [], doc["failures"]
    if code == 0:
        pytest.skip("the sandbox was already converged by an earlier session; nothing is pending")
    assert code == 2 and doc["status"] == "changed" and doc["check"] is True
    assert doc["changes"], "a changed count without the tasks behind it"
    assert {c["host"] for c in doc["changes"]} <= set(doc["hosts"])


def test_apply_converges_then_reapply_changes_nothing(sandbox: Path) -> None:
    code, first = apply_json(sandbox, "--yes", "--detailed-exitcode")
    assert first["failures"] == [], first["failures"]
    assert code in (0, 2)
    code, second = apply_json(sandbox, "--yes", "--detailed-exitcode")
    assert second["failures"] == [], second["failures"]
    assert code == 0 and second["status"] == "ok"
    assert {name: stats["changed"] for name, stats in second["hosts"].items()} == dict.fromkeys(second["hosts"], 0)


def test_check_after_apply_reports_nothing_pending(sandbox: Path) -> None:
    code, doc = apply_json(sandbox, "--check", "--detailed-exitcode")
    assert (code, doc["status"], doc["changes"]) == (0, "ok", [])


def test_timeout_exits_4(sandbox: Path) -> None:
    code, doc = apply_json(sandbox, "--yes", "--timeout", "1")
    assert (code, doc["status"]) == (4, "timeout")


def test_limit_matching_nothing_exits_3(sandbox: Path) -> None:
    code, doc = apply_json(sandbox, "--yes", "--limit", "no-such-host")
    assert (code, doc["status"]) == (3, "invalid")


def test_unreachable_host_fails_with_its_name(sandbox: Path, tmp_path: Path) -> None:
    cluster = _with_ghost_host(sandbox, tmp_path, "ghost01")
    code, doc = apply_json(cluster, "--yes", "--limit", "ghost01")
    assert (code, doc["status"]) == (1, "failed")
    assert [(f["host"], f["unreachable"]) for f in doc["failures"]] == [("ghost01", True)]
    assert "ghost01" in doc["failures"][0]["message"]
    # Human output names it too.
    done = gpuinfra("apply", str(cluster), "--yes", "--limit", "ghost01")
    assert done.returncode == 1
    assert "UNREACHABLE ghost01:" in done.stdout


def _with_ghost_host(sandbox: Path, tmp_path: Path, name: str) -> Path:
    """The sandbox cluster plus one host whose name does not resolve, written beside a copy of its key paths."""
    yaml = YAML()
    data = yaml.load(sandbox.read_text())
    connection = data.setdefault("connection", {})
    for key in ("ssh_key", "known_hosts_file"):
        if connection.get(key) and not Path(connection[key]).expanduser().is_absolute():
            connection[key] = str(sandbox.parent / connection[key])
    groups = data["node_groups"]
    worker_roles = {"slurm_compute", "k8s_gpu_worker"}
    source = next((g for g in groups.values() if worker_roles & set(g["roles"])), next(iter(groups.values())))
    ghost = copy.deepcopy(dict(source))
    ghost["hosts"] = name
    ghost["addresses"] = {name: f"{name}.invalid"}
    groups["ghosts"] = ghost
    path = tmp_path / "cluster.yml"
    with path.open("w") as out:
        yaml.dump(data, out)
    return path
