from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


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
