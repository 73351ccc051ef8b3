"""The container toolkit's runtime configurations read by the runtimes of Kubernetes GPU nodes that Debian 12 does
not package: containerd 2.x (configuration schema 3) and CRI-O. On such a node:

    pytest tests/k8s/test_node_runtimes.py

The rendering and the parser runs are those of tests/unit/test_toolkit_configs.py, which checks containerd 1.x and
dockerd on every machine.
"""

from __future__ import annotations

import re
import shutil
import tomllib
from pathlib import Path

import pytest
from file_module import load
from skip_policy import K8S_ABSENT

ROOT = Path(__file__).resolve().parents[2]


toolkit = load("tests/unit/test_toolkit_configs.py", "toolkit_configs")
tmp_path = toolkit.tmp_path  # a folder the parsers can read when they run as nobody


def test_containerd_schema_3(tmp_path: Path) -> None:
    containerd = toolkit._binary("containerd")
    version = toolkit._run([containerd, "--version"]).stdout
    match = re.search(r"\s v?(\d+)\.\d+", version)
    if match is None or int(match.group(1)) < 2:
        pytest.skip(f"{K8S_ABSENT} schema 3 needs containerd 2.x, a Kubernetes node's runtime; Debian 12 has 1.6")
    conf_d = tmp_path / "conf.d"
    conf_d.mkdir()
    options = {"nvidia_container_toolkit_containerd_config_version": 3,
               "nvidia_container_toolkit_containerd_dropin_dir": str(conf_d)}  # fmt: skip
    (tmp_path / "config.toml").write_text(toolkit.render("containerd-config.toml.j2", **options))
    (conf_d / "99-nvidia.toml").write_text(toolkit.render("containerd-nvidia.toml.j2", **options))
    result = toolkit._dump(containerd, tmp_path / "config.toml")
    assert result.returncode == 0, result.stderr
    runtimes = tomllib.loads(result.stdout)["plugins"]["io.containerd.cri.v1.runtime"]["containerd"]["runtimes"]
    assert runtimes["nvidia"]["options"]["BinaryName"] == "/usr/bin/nvidia-container-runtime"
    assert "runc" in runtimes, "containerd 2.x merges the drop-in key by key"


@pytest.mark.parametrize("default_runtime", [False, True])
def test_crio_reads_the_dropin(tmp_path: Path, default_runtime: bool) -> None:
    text = toolkit.render("crio-nvidia.toml.j2", nvidia_container_toolkit_default_runtime=default_runtime)
    crio = shutil.which("crio")
    if crio is None:
        pytest.skip(f"{K8S_ABSENT} crio is not installed: CRI-O runs on Kubernetes nodes, Debian 12 has none")
    conf_d = tmp_path / "crio.conf.d"
    conf_d.mkdir()
    (conf_d / "99-nvidia.toml").write_text(text)
    result = toolkit._run([crio, "--config", "", "--config-dir", str(conf_d), "config"])
    assert result.returncode == 0, result.stderr
    assert "nvidia-container-runtime" in result.stdout
