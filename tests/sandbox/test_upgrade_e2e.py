"""`gpuinfra upgrade` on the sandbox with its health loop on: the upgrade leaves a usable cluster.

The sandbox runs Debian's driver 535.261.03; the upgrade goes to 535.309.01 (bookworm-security) on gpu01, with the
real DKMS build, while slurmctld runs the node health program every 10 s on both GPU nodes. (One node keeps CI's
time: the rolling window over several nodes is the `upgrade` Molecule scenario's.) The journal given to the upgrade
already records that very target as done, as an earlier cluster of the same name would have left it: the upgrade
must read what the node runs, and upgrade it all the same.

Runs last of the sandbox tests (files run in name order) and leaves gpu01 at 535.309.01:
`gpuinfra apply inventories/sandbox/cluster.yml` takes it back to 535.261.03.
"""

from __future__ import annotations

import json
import shlex
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from harness import MARKS, SANDBOX_CLUSTER, converged, gpuinfra, on_host
from ruamel.yaml import YAML

from gpuinfra.upgrade.journal import RUN, Journal, State
from gpuinfra.validate.grammar import duration_seconds
from gpuinfra.validate.load import load_cluster

OLD, NEW = "535.261.03", "535.309.01"
NODES = ("gpu01", "gpu02")
UPGRADED = "gpu01"

pytestmark = MARKS


def _cluster_pinning(version: str) -> Path:
    """The sandbox's cluster file with another driver pin, beside it (its key paths are relative to its folder)."""
    yaml = YAML()
    data = yaml.load(SANDBOX_CLUSTER.read_text())
    data["driver"]["version"] = version
    path = SANDBOX_CLUSTER.parent / f".upgrade-{version}.yml"
    with path.open("w") as out:
        yaml.dump(data, out)
    return path


def _states() -> dict[str, tuple[str, str]]:
    done = on_host("ctl01", "sinfo", "--noheader", "--Node", "--partition=vision", shlex.quote("--format=%N|%T|%E"))
    assert done.returncode == 0, done.stderr
    rows = [line.split("|", 2) for line in done.stdout.splitlines()]
    return {name: (state.rstrip("*~#!%$@^-"), reason) for name, state, reason in rows}


@pytest.fixture(scope="module")
def upgraded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    converged()
    folder = tmp_path_factory.mktemp("upgrade")
    journal = Journal(folder / "upgrade.jsonl")
    for node in NODES:  # what an earlier cluster of this name, upgraded to the same target, left behind
        for state in (State.DRAINING, State.DRAINED, State.UPGRADING, State.GATED, State.HEALTHY, State.RESUMED):
            journal.record(node, state, NEW)
    journal.record(RUN, State.DONE, NEW)
    cluster = _cluster_pinning(NEW)
    try:
        done = gpuinfra("upgrade", str(cluster), "--yes", "--json", "--journal", str(journal.path), "--limit", UPGRADED)
        doc: dict[str, Any] = json.loads(done.stdout)
        doc["cluster"], doc["folder"] = cluster, folder
        doc["returncode"] = done.returncode
        doc["stderr"] = done.stderr
        yield doc
    finally:
        cluster.unlink(missing_ok=True)


def test_the_node_is_upgraded_whatever_an_earlier_journal_says(upgraded: dict[str, Any]) -> None:
    assert upgraded["returncode"] == 0, (upgraded["message"], upgraded["stderr"][-3000:])
    assert {node: (n["state"], n["found"], n["left"]) for node, n in upgraded["nodes"].items()} == {
        UPGRADED: ("resumed", OLD, NEW)
    }
    for node in (UPGRADED,):
        version = on_host(node, "dpkg-query", "-W", "-f", shlex.quote("${Version}"), "nvidia-kernel-dkms")
        assert version.stdout.startswith(NEW), version.stdout
        # The stand-in nvidia-smi answers for the installed library, as the real one does.
        smi = on_host(node, "/usr/local/lib/gpuinfra-sandbox/nvidia-smi", "-q", "-x")
        assert f"<driver_version>{NEW}</driver_version>" in smi.stdout


def test_no_node_leaves_service_for_three_health_intervals_after_it(upgraded: dict[str, Any]) -> None:
    """The health program's settings follow the new pin: sampled every second for three intervals, no node is
    drained or down, and then a GPU job runs on each."""
    assert upgraded["returncode"] == 0, upgraded["message"]
    settings = json.loads(on_host(UPGRADED, "cat", "/etc/gpuinfra/health.json").stdout)
    assert settings["policy"]["driver_version"] == NEW
    interval = duration_seconds(load_cluster(SANDBOX_CLUSTER).model.health.check.interval)
    end = time.monotonic() + 3 * interval
    while time.monotonic() < end:
        states = _states()
        assert all(state in ("idle", "mixed", "allocated") for state, _ in states.values()), states
        time.sleep(1)
    for node in NODES:
        job = on_host("ctl01", "runuser", "-u", "alice", "--", "srun", "--partition=vision", "--chdir=/tmp",
                      "--immediate=120", f"--nodelist={node}", "--gres=gpu:1", "hostname")  # fmt: skip
        assert (job.returncode, job.stdout.strip()) == (0, node), job.stderr


def test_the_next_plain_apply_changes_nothing_and_a_rerun_has_nothing_to_do(upgraded: dict[str, Any]) -> None:
    assert upgraded["returncode"] == 0, upgraded["message"]
    cluster = upgraded["cluster"]
    done = gpuinfra("apply", str(cluster), "--yes", "--json", "--detailed-exitcode", "--limit", UPGRADED)
    doc = json.loads(done.stdout)
    assert (done.returncode, doc["changes"], doc["failures"]) == (0, [], []), doc["changes"]
    journal = str(upgraded["folder"] / "other.jsonl")
    again = gpuinfra("upgrade", str(cluster), "--yes", "--json", "--journal", journal, "--limit", UPGRADED)
    rerun = json.loads(again.stdout)
    assert again.returncode == 0 and rerun["message"] == f"nothing to do: every GPU node has driver {NEW} installed"
    assert {node: n["state"] for node, n in rerun["nodes"].items()} == {UPGRADED: "current"}
