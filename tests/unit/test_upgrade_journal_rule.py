"""The journal only resumes interrupted work, proved through `upgrade` itself (what `gpuinfra upgrade` calls): the
driver each node has installed decides the work, so a node found off the target goes through every phase again
whatever an earlier run recorded for it. Ansible is replaced at its two seams, the executor that runs a phase and
the query of the installed drivers, by a small model of the nodes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpuinfra.upgrade import cluster
from gpuinfra.upgrade.executor import Installed
from gpuinfra.upgrade.journal import State
from gpuinfra.upgrade.pipeline import PHASES, PhaseResult
from gpuinfra.validate.load import load_cluster

ROOT = Path(__file__).resolve().parents[2]
SMALL = ROOT / "inventories" / "slurm-small" / "cluster.yml"
OLD = "535.216.03"


class Nodes:
    """The driver each node has, and every phase run on it."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.version: dict[str, str] = {}
        self.calls: list[tuple[str, str]] = []

    def installed(self, inventory: Any, nodes: list[str], extra_vars: Any = None) -> dict[str, Installed]:
        return {n: Installed(self.version[n], self.version[n] == self.target) for n in nodes}

    def executor(self, **_: Any) -> Any:
        def run(node: str, phase: str) -> PhaseResult:
            self.calls.append((node, phase))
            if phase == "upgrade":
                self.version[node] = self.target
            return PhaseResult("ok")

        return run


@pytest.fixture
def nodes(monkeypatch: pytest.MonkeyPatch) -> Nodes:
    model = Nodes(target="535.261.03")
    monkeypatch.setattr(cluster, "installed_drivers", model.installed)
    monkeypatch.setattr(cluster, "AnsibleExecutor", model.executor)
    return model


def test_a_node_found_off_the_target_is_upgraded_again_whatever_the_journal_says(tmp_path: Path, nodes: Nodes) -> None:
    """A first upgrade finishes and the journal records every node RESUMED. The nodes are then made again at the
    old driver (a reinstall): the next `gpuinfra upgrade` takes each through every phase again. With the journal
    taken at its word (the rollout not told which nodes are off the target), nothing runs and this fails."""
    loaded = load_cluster(SMALL)
    journal = tmp_path / "upgrade.jsonl"
    plan = cluster.plan_upgrade(loaded, limit="l40s-*", journal=journal)
    nodes.version = dict.fromkeys(plan.nodes, OLD)
    first = cluster.upgrade(plan)
    assert first.status == "ok", first.message
    assert first.report is not None and set(first.report.states.values()) == {State.RESUMED}

    nodes.version = dict.fromkeys(plan.nodes, OLD)
    nodes.calls.clear()
    again = cluster.upgrade(cluster.plan_upgrade(loaded, limit="l40s-*", journal=journal))
    assert again.status == "ok", again.message
    assert sorted(nodes.calls) == sorted((n, p.name) for n in plan.nodes for p in PHASES)
    assert set(nodes.version.values()) == {"535.261.03"}


def test_a_node_at_the_target_is_left_alone(tmp_path: Path, nodes: Nodes) -> None:
    loaded = load_cluster(SMALL)
    plan = cluster.plan_upgrade(loaded, limit="l40s-*", journal=tmp_path / "upgrade.jsonl")
    nodes.version = dict.fromkeys(plan.nodes, "535.261.03")
    outcome = cluster.upgrade(plan)
    assert outcome.status == "ok" and nodes.calls == []
