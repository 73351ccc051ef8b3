"""`gpuinfra upgrade`: what it refuses, what it hands over to the GPU Operator, and its -e forms.

These paths end before any host is contacted; the runs themselves are covered by test_upgrade_pipeline.py (the
controller) and tests/sandbox/test_cluster_life.py (real Slurm, real DKMS).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from ruamel.yaml import YAML

from gpuinfra.cli import main
from gpuinfra.cli.common import parse_extra_vars

ROOT = Path(__file__).resolve().parents[2]


def cluster_file(tmp_path: Path, **changes: object) -> Path:
    yaml = YAML()
    data = yaml.load((ROOT / "inventories" / "k8s-mig" / "cluster.yml").read_text())
    for key, value in changes.items():
        if value is None:
            del data[key]
        else:
            data[key] = value
    path = tmp_path / "cluster.yml"
    with path.open("w") as out:
        yaml.dump(data, out)
    return path


def run_json(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, object]]:
    code = main(["upgrade", *args, "--json", "--yes"])
    doc: dict[str, object] = json.loads(capsys.readouterr().out)
    assert doc["exit_code"] == code
    return code, doc


def test_operator_owned_drivers_are_handed_over(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    kubernetes = YAML(typ="safe", pure=True).load((ROOT / "inventories" / "k8s-mig" / "cluster.yml").read_text())[
        "kubernetes"
    ]
    kubernetes.setdefault("gpu_operator", {})["driver"] = "operator"
    path = cluster_file(tmp_path, kubernetes=kubernetes)
    code, doc = run_json(capsys, str(path), "--journal", str(tmp_path / "journal.jsonl"))
    assert code == 0 and doc["nodes"] == {}
    assert doc["handed_over"] == ["h100-01", "h100-02", "h100-03", "h100-04", "l4-01", "l4-02"]
    assert not (tmp_path / "journal.jsonl").exists()  # nothing was drained, so nothing was recorded


def test_a_limit_without_gpu_nodes_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, doc = run_json(capsys, str(ROOT / "inventories" / "k8s-mig" / "cluster.yml"), "--limit", "k8s-cp1")
    assert code == 3 and "matches no GPU node" in str(doc["errors"])


def test_confirmation_is_required_without_a_terminal(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["upgrade", str(ROOT / "inventories" / "k8s-mig" / "cluster.yml"), "--journal", "/nonexistent/j"])
    assert code == 3 and "pass --yes" in capsys.readouterr().err


def test_extra_vars_forms(tmp_path: Path) -> None:
    varfile = tmp_path / "vars.yml"
    varfile.write_text("ansible_connection: containers.podman.podman\nnode_drain_poll: 3\n")
    assert parse_extra_vars(["a=1 b=two", '{"c": [1, 2]}', f"@{varfile}"]) == {
        "a": "1",
        "b": "two",
        "c": [1, 2],
        "ansible_connection": "containers.podman.podman",
        "node_drain_poll": 3,
    }
    with pytest.raises(ValueError):
        parse_extra_vars(["novalue"])
