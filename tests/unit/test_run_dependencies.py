"""A run refuses to start when its roles call a collection Ansible cannot find (an installed wheel carries
ansible-core only), instead of failing half way through the hosts."""

from __future__ import annotations

from pathlib import Path

import ansible.constants
import pytest

from gpuinfra.render.inventory import inventory_yaml
from gpuinfra.run import RunError
from gpuinfra.run import environment as run
from gpuinfra.validate.load import load_cluster

ROOT = Path(__file__).resolve().parents[2]


def inventory(example: str) -> dict[str, object]:
    return inventory_yaml(load_cluster(ROOT / "inventories" / example / "cluster.yml").resolved)


def test_kubernetes_needs_kubernetes_core_and_names_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(run, "_collection_folders", lambda: [])
    with pytest.raises(RunError, match=r"ansible-galaxy collection install 'kubernetes\.core:>=\d"):
        run.check_dependencies(inventory("k8s-mig"))


def test_kubernetes_runs_where_kubernetes_core_is_installed() -> None:
    # The test environment has the `ansible` package's collections.
    assert any((Path(folder) / "ansible_collections/kubernetes/core").is_dir() for folder in run._collection_folders())
    run.check_dependencies(inventory("k8s-mig"))


def test_slurm_needs_no_collection_beyond_ansible_core(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(run, "_collection_folders", lambda: [])
    run.check_dependencies(inventory("slurm-small"))


def test_collections_the_user_installed_are_found(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (tmp_path / "ansible_collections" / "kubernetes" / "core").mkdir(parents=True)
    monkeypatch.setattr(ansible.constants, "COLLECTIONS_PATHS", [str(tmp_path)])
    assert str(tmp_path) in run._collection_folders()
