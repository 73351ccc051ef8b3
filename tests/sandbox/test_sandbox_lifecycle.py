"""`gpuinfra sandbox up|status|down` for real, on a one-host sandbox of its own (so a running default sandbox is
left alone): up creates and is idempotent, SSH works with host key checking on, down removes exactly what up made.

The steps build on each other, so they run in file order in one module.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from harness import MARKS, gpuinfra

NAME = "sbxtest"
CLUSTER = f"""\
name: {NAME}
connection:
  ssh_key: state/id_ed25519
  known_hosts_file: state/known_hosts
node_groups:
  node:
    hosts: node1
    addresses: {{node1: 10.213.43.10}}
    roles: [monitoring]
"""


pytestmark = MARKS


def sandbox_json(action: str, cluster: Path) -> dict[str, Any]:
    done = gpuinfra("sandbox", action, str(cluster), "--json")
    doc: dict[str, Any] = json.loads(done.stdout)
    assert doc["exit_code"] == done.returncode, done.stderr
    return doc


def podman(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["podman", *args], capture_output=True, text=True, check=False)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    path = tmp_path_factory.mktemp("sandbox") / "cluster.yml"
    path.write_text(CLUSTER)
    yield path
    gpuinfra("sandbox", "down", str(path))  # whatever a failed step left behind


def ssh_true(cluster: Path) -> subprocess.CompletedProcess[str]:
    state = cluster.parent / "state"
    return subprocess.run(
        ["ssh", "-i", str(state / "id_ed25519"), "-o", f"UserKnownHostsFile={state / 'known_hosts'}",
         "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", "root@10.213.43.10", "hostname"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def test_up_creates_the_network_and_container_and_ssh_works(cluster: Path) -> None:
    doc = sandbox_json("up", cluster)
    assert doc["status"] == "ok" and doc["changed"] is True
    assert [(h["host"], h["container"], h["address"], h["state"]) for h in doc["hosts"]] == [
        ("node1", f"{NAME}-node1", "10.213.43.10", "running")
    ]
    assert doc["network"] == {"name": f"gpuinfra-{NAME}", "subnet": "10.213.43.0/24", "present": True}
    state = cluster.parent / "state"
    assert state.stat().st_mode & 0o777 == 0o700
    assert (state / "id_ed25519").stat().st_mode & 0o777 == 0o600
    assert (state / "known_hosts").read_text().startswith("10.213.43.10,node1 ssh-ed25519 ")
    done = ssh_true(cluster)
    assert (done.returncode, done.stdout.strip()) == (0, "node1"), done.stderr


def test_up_twice_changes_nothing(cluster: Path) -> None:
    state = cluster.parent / "state"
    before = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in state.iterdir()}
    container_id = podman("inspect", "--format", "{{.Id}}", f"{NAME}-node1").stdout
    doc = sandbox_json("up", cluster)
    assert (doc["changed"], doc["changes"]) == (False, [])
    assert {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in state.iterdir()} == before
    assert podman("inspect", "--format", "{{.Id}}", f"{NAME}-node1").stdout == container_id


def test_host_key_checking_is_on_and_up_repairs_known_hosts(cluster: Path) -> None:
    known_hosts = cluster.parent / "state" / "known_hosts"
    good = known_hosts.read_text()
    # Another host's key under node1's address: SSH must refuse, not learn the real one.
    known_hosts.write_text(
        "10.213.43.10 ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHkFxtD7U7l6cGNTL4E1jrplHSx0ZG4dBRRxnJ5ySRgT\n"
    )
    refused = ssh_true(cluster)
    assert refused.returncode != 0 and "host key" in refused.stderr.lower()
    doc = sandbox_json("up", cluster)
    assert doc["changes"] == [f"recorded host keys in {known_hosts}"]
    assert known_hosts.read_text() == good
    assert ssh_true(cluster).returncode == 0


def test_up_starts_a_stopped_container(cluster: Path) -> None:
    assert podman("stop", "--time", "0", f"{NAME}-node1").returncode == 0
    assert sandbox_json("status", cluster)["hosts"][0]["state"] == "exited"
    doc = sandbox_json("up", cluster)
    assert doc["changes"] == [f"node1: started container {NAME}-node1"]
    assert ssh_true(cluster).returncode == 0


def test_up_refuses_a_container_made_with_other_settings(cluster: Path) -> None:
    done = gpuinfra("sandbox", "up", str(cluster), "--image", "localhost/gpuinfra-debian12:latest")
    assert done.returncode == 1
    assert "was made with other settings" in done.stderr and "gpuinfra sandbox down" in done.stderr
    assert "Traceback" not in done.stderr


def test_down_removes_everything_up_made_and_nothing_else(cluster: Path) -> None:
    state = cluster.parent / "state"
    (state / "notes.txt").write_text("not made by up\n")
    bystander = f"{NAME}-bystander"  # same name prefix, no sandbox label
    assert podman("create", "--name", bystander, "localhost/gpuinfra-debian12").returncode == 0
    try:
        doc = sandbox_json("down", cluster)
        assert doc["changed"] is True
        assert f"removed container {NAME}-node1" in doc["changes"]
        assert f"removed network gpuinfra-{NAME}" in doc["changes"]
        assert [h["state"] for h in doc["hosts"]] == ["absent"]
        assert doc["network"]["present"] is False
        assert (
            podman("ps", "--all", "--filter", f"label=gpuinfra.sandbox={NAME}", "--format", "{{.Names}}").stdout == ""
        )
        assert podman("network", "exists", f"gpuinfra-{NAME}").returncode == 1
        assert sorted(p.name for p in state.iterdir()) == ["notes.txt"]
        assert podman("container", "exists", bystander).returncode == 0
    finally:
        podman("rm", "--force", bystander)
    again = sandbox_json("down", cluster)
    assert (again["changed"], again["changes"]) == (False, [])


def test_up_refuses_a_container_it_did_not_make(cluster: Path) -> None:
    (cluster.parent / "state" / "notes.txt").unlink(missing_ok=True)
    foreign = f"{NAME}-node1"
    assert podman("create", "--name", foreign, "localhost/gpuinfra-debian12").returncode == 0
    try:
        done = gpuinfra("sandbox", "up", str(cluster))
        assert done.returncode == 1
        assert f"a container named {foreign} exists but was not made by this sandbox" in done.stderr
    finally:
        podman("rm", "--force", foreign)
    gpuinfra("sandbox", "down", str(cluster))
    assert not (cluster.parent / "state").exists()
