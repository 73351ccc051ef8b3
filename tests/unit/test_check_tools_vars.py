"""The active checks' tools as the inventory gives them to the gpu_check_tools and gpu_health roles: which packages,
from which source, and where each check's tool is."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ruamel.yaml import YAML

from gpuinfra.model import Cluster
from gpuinfra.model.policy import DEFAULT_TOOL_PATHS
from gpuinfra.render.vars import health
from gpuinfra.resolve import resolve

ROOT = Path(__file__).resolve().parents[2]


def _vars(driver: dict[str, Any], admission: dict[str, Any], emulated: bool = False) -> dict[str, Any]:
    data = {
        "name": "lab",
        "node_groups": {
            "gpu": {
                "hosts": "gpu01",
                "roles": ["slurm_compute"],
                "gpu": {"model": "L4", "count": 2, "emulated": emulated},
            },
            "ctl": {"hosts": "ctl01", "roles": ["slurm_controller"]},
        },
        "driver": driver,
        "health": {"admission": admission},
        "slurm": {"accounting": False, "partitions": {"gpu": {"node_groups": ["gpu"]}}},
    }
    rc = resolve(Cluster.model_validate(data))
    return {**health.group_vars(rc), **health.host_vars(rc.hosts["gpu01"])}


def test_dcgm_comes_from_the_drivers_cuda_repository_for_its_cuda_major() -> None:
    for version, cuda in (("535.261.03", 12), ("580.95.05", 13)):
        out = _vars({"version": version, "source": {"type": "nvidia"}}, {"checks": ["dcgm_diag"]})
        assert out["gpu_check_tools_install"] is True
        assert out["gpu_check_tools_source_type"] == "nvidia"
        assert out["gpu_check_tools_packages"] == [
            "datacenter-gpu-manager-4-core",
            f"datacenter-gpu-manager-4-cuda{cuda}",
        ]
        assert out["gpu_check_tools_paths"] == {"dcgmi": "/usr/bin/dcgmi"}


def test_the_sites_packages_come_from_its_mirror_with_their_paths() -> None:
    mirror = {"type": "mirror", "url": "https://mirror.example/tools/", "keyring": "k.asc", "fingerprint": "C" * 40}
    tools = {"source": mirror, "packages": ["site-dcgm", "site-nccl-tests"], "paths": {"all_reduce_perf": "/opt/b/arp"}}
    out = _vars({"version": "535.261.03"}, {"checks": ["dcgm_diag", "nccl_all_reduce"], "tools": tools})
    assert out["gpu_check_tools_packages"] == ["site-dcgm", "site-nccl-tests"]
    assert (out["gpu_check_tools_source_type"], out["gpu_check_tools_source_url"]) == ("mirror", mirror["url"])
    assert (out["gpu_check_tools_source_keyring"], out["gpu_check_tools_source_fingerprint"]) == ("k.asc", "C" * 40)
    assert out["gpu_check_tools_paths"] == {"dcgmi": "/usr/bin/dcgmi", "all_reduce_perf": "/opt/b/arp"}
    # The checks run the tools where they were installed.
    assert out["gpu_health_active_tools"]["all_reduce_perf"] == "/opt/b/arp"


def test_nothing_is_installed_without_checks_or_where_told_not_to() -> None:
    assert _vars({"version": "535.261.03"}, {})["gpu_check_tools_install"] is False
    off = _vars({"version": "535.261.03"}, {"checks": ["dcgm_diag"], "tools": {"install": False}})
    assert off["gpu_check_tools_install"] is False and off["gpu_check_tools_paths"] == {"dcgmi": "/usr/bin/dcgmi"}


def test_emulated_gpus_take_the_stand_ins_and_install_nothing() -> None:
    out = _vars({"version": "550.163.01"}, {"checks": ["dcgm_diag", "host_bandwidth"]}, emulated=True)
    assert out["gpu_check_tools_install"] is False and out["gpu_check_tools_paths"] == {}
    assert out["gpu_health_active_tools"]["dcgmi"] == f"{health.EMULATED_GPU_TOOLS}/dcgmi"


def test_the_default_paths_are_the_health_roles() -> None:
    spec = YAML(typ="safe").load((ROOT / "roles" / "gpu_health" / "meta" / "argument_specs.yml").read_text())
    options = {name: o for entry in spec["argument_specs"].values() for name, o in entry.get("options", {}).items()}
    assert options["gpu_health_active_tools"]["default"] == DEFAULT_TOOL_PATHS
