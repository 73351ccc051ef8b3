"""What the sandbox tests share: the committed sandbox cluster file, the CLI, SSH to a host, the skip when a tool
is missing, and a converged sandbox for a test file run on its own."""

from __future__ import annotations

import base64
import json
import os
import shlex
import shutil
import ssl
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

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


# testinfra's Ansible backend and plain ansible-playbook runs: the ones installed beside this Python.
VENV_ENV = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}


def plain_playbook(cluster: Path, folder: Path, *args: str) -> dict[str, tuple[int, int, int]]:
    """`ansible-playbook -i CLUSTER gpuinfra.cluster.site ARGS` without gpuinfra's CLI, with docs/ansible.cfg and
    this checkout as the collection: each host's (changed, failures, unreachable), from the JSON callback's stats."""
    collections = folder / "collections"
    link = collections / "ansible_collections" / "gpuinfra" / "cluster"
    if not link.exists():
        link.parent.mkdir(parents=True)
        link.symlink_to(ROOT)
    env = {
        **VENV_ENV,
        "ANSIBLE_CONFIG": str(ROOT / "docs" / "ansible.cfg"),
        "ANSIBLE_COLLECTIONS_PATH": str(collections),
        "ANSIBLE_STDOUT_CALLBACK": "ansible.posix.json",
    }
    for name in ("ANSIBLE_INVENTORY_ENABLED", "ANSIBLE_PIPELINING", "ANSIBLE_GATHERING"):
        env.pop(name, None)
    done = subprocess.run(
        ["ansible-playbook", "-i", str(cluster), "gpuinfra.cluster.site", *args],
        cwd=folder, capture_output=True, text=True, timeout=1800, check=False, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    stats = json.loads(done.stdout)["stats"]
    return {host: (s["changed"], s["failures"], s["unreachable"]) for host, s in stats.items()}


def sbatch(user: str, *options: str, command: str) -> str:
    """A batch job of `user` (sbatch's `options`, then `command` as its script), submitted on ctl01: its id."""
    argv = ["runuser", "-u", user, "--", "sbatch", "--parsable", *options, "--wrap", shlex.quote(command)]
    submitted = on_host("ctl01", *argv)
    assert submitted.returncode == 0, submitted.stderr
    return submitted.stdout.strip()


def on_host(host: str, *command: str, cluster: Path = SANDBOX_CLUSTER) -> subprocess.CompletedProcess[str]:
    """Run a command on a sandbox host over SSH, as the runs connect."""
    from gpuinfra.sandbox import ssh

    return ssh(cluster, host, list(command))


def prometheus_api(cluster: Path, scheme: str, path: str) -> Any:
    """The `data` of a GET from ctl01's Prometheus API, asked with Prometheus's password (over HTTPS, verified
    against the cluster's CA)."""
    from gpuinfra.redact import default_secrets_dir
    from gpuinfra.validate.load import load_cluster

    loaded = load_cluster(cluster)
    secrets = Path(default_secrets_dir(loaded.model.name)).expanduser()
    context = ssl.create_default_context(cafile=str(secrets / "monitoring-ca.crt")) if scheme == "https" else None
    login = base64.b64encode(b"prometheus:" + (secrets / "monitoring-prometheus-password").read_bytes().strip())
    address = loaded.resolved.hosts["ctl01"].address
    request = urllib.request.Request(
        f"{scheme}://{address}:9090/api/v1/{path}", headers={"Authorization": f"Basic {login.decode()}"}
    )
    with urllib.request.urlopen(request, context=context, timeout=30) as answer:
        return json.load(answer)["data"]


def last_reload(cluster: Path, scheme: str) -> str:
    """When Prometheus last loaded its configuration (start or reload), as its runtime information says."""
    return str(prometheus_api(cluster, scheme, "status/runtimeinfo")["lastConfigTime"])


def scrape_health(cluster: Path, scheme: str) -> dict[str, str]:
    """Each of Prometheus's scrape URLs and its health, once every one is up or after 2 minutes."""
    deadline = time.monotonic() + 120
    while True:
        targets = prometheus_api(cluster, scheme, "targets")["activeTargets"]
        health = {t["scrapeUrl"]: t["health"] for t in targets}
        if set(health.values()) == {"up"} or time.monotonic() > deadline:
            return health
        time.sleep(5)


def converged() -> Path:
    """The sandbox up, and converged unless Slurm's controller already runs (test_apply_e2e.py converges it
    first when the whole folder runs)."""
    up = gpuinfra("sandbox", "up")
    assert up.returncode == 0, up.stderr
    if on_host("ctl01", "systemctl", "is-active", "slurmctld", "slurmdbd").returncode != 0:
        applied = gpuinfra("apply", str(SANDBOX_CLUSTER), "--yes")
        assert applied.returncode == 0, applied.stdout[-3000:] + applied.stderr[-3000:]
    return SANDBOX_CLUSTER
