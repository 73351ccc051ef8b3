"""The mig role's variables and files from the model: golden files, what they say, and a layout that cannot pack
stopping `gpuinfra plan` before anything is rendered.

Regenerate the golden files with `GPUINFRA_UPDATE_GOLDEN=1 pytest tests/unit/test_mig_vars.py` and review the diff.
The mig Molecule scenario converges the role with tests/unit/golden/mig/slurm-mig/vars.json and checks that the host
gets tests/unit/golden/mig/slurm-mig/config.yaml.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
from test_kubernetes_support import DATA, EXAMPLES, GOLDEN, ROOT, check_golden, loaded, rendered, yaml_load

from gpuinfra import catalog
from gpuinfra import mig_layouts as mig
from gpuinfra.render.inventory import group_vars
from gpuinfra.render.vars import mig as mig_vars

FILES = ["mig/config.yaml", "mig/gpuinfra-mig.service"]


@pytest.mark.parametrize("example", list(EXAMPLES))
def test_role_variables_match_golden(example: str) -> None:
    variables = mig_vars.group_vars(loaded(example).resolved)
    check_golden(GOLDEN / "mig" / example / "vars.json", json.dumps(variables, indent=2) + "\n")


@pytest.mark.parametrize("path", FILES)
@pytest.mark.parametrize("example", ["slurm-small", "slurm-mig"])
def test_artifact_matches_golden(example: str, path: str) -> None:
    check_golden(GOLDEN / "mig" / example / Path(path).name, rendered(example)[path].content)


def test_kubernetes_clusters_leave_mig_to_the_operator() -> None:
    """On k8s_gpu_worker hosts the operator's MIG manager applies the layouts; the mig role has nothing to do."""
    for example in ("k8s-mig", "mig-mixed", "time-slicing"):
        assert mig_vars.group_vars(loaded(example).resolved) == {}
        assert not [path for path in rendered(example) if path.startswith("mig/")]


def test_slurm_mig_configs() -> None:
    variables = mig_vars.group_vars(loaded("slurm-mig").resolved)
    a100 = catalog.lookup("A100-SXM4-80GB")
    h100 = catalog.lookup("H100-SXM5-80GB")
    assert a100 is not None and h100 is not None
    # a100: two layouts on GPUs 0-2 and GPU 3 whole, so a config composed for the group; h100: one layout everywhere.
    assert variables["mig_group_configs"] == {"a100": "a100", "h100": "halves-80"}
    configs = variables["mig_parted_config"]["mig-configs"]
    assert configs["all-disabled"] == [{"devices": "all", "mig-enabled": False}]
    assert configs["a100"] == [
        {"devices": [0, 1], "mig-enabled": True, "device-filter": list(a100.parted_ids), "mig-devices": {"1g.10gb": 7}},
        {
            "devices": [2],
            "mig-enabled": True,
            "device-filter": list(a100.parted_ids),
            "mig-devices": {"4g.40gb": 1, "2g.20gb": 1, "1g.10gb": 1},
        },
        {"devices": [3], "mig-enabled": False},
    ]
    assert configs["halves-80"] == [
        {"devices": "all", "mig-enabled": True, "device-filter": list(h100.parted_ids), "mig-devices": {"3g.40gb": 2}}
    ]


def test_written_config_is_valid_mig_parted_that_packs() -> None:
    config = yaml_load(rendered("slurm-mig")["mig/config.yaml"].content)
    configs, problems = mig.parse_parted(config)
    assert [p for p in problems if p.severity == "error"] == []
    for name, entries in configs.items():
        for entry in entries:
            for pci_id in entry.get("device-filter", []) if entry["mig-enabled"] else []:
                spec = catalog.by_pci_id(pci_id)
                assert spec is not None
                assert mig.check_layout(spec, entry["mig-devices"]) == [], f"{name} on {spec.name}"


def test_slurm_gres_per_group() -> None:
    gres = mig_vars.group_vars(loaded("slurm-mig").resolved)["mig_slurm_gres"]
    assert gres["a100"] == [
        {"type": "1g.10gb", "count": 15, "files": ["/dev/nvidia0", "/dev/nvidia1", "/dev/nvidia2"]},
        {"type": "2g.20gb", "count": 1, "files": ["/dev/nvidia2"]},
        {"type": "4g.40gb", "count": 1, "files": ["/dev/nvidia2"]},
    ]
    assert gres["h100"] == [{"type": "3g.40gb", "count": 4, "files": ["/dev/nvidia0", "/dev/nvidia1"]}]


@pytest.mark.parametrize("emulated", [False, True])
def test_emulated_gpus_turn_gpu_access_off(emulated: bool) -> None:
    """Emulated GPUs (sandbox hosts) get mig_gpu_access off as a host variable; real ones keep the role default."""
    host = next(h for h in loaded("slurm-mig").resolved.hosts.values() if h.mig_layouts)
    host = dataclasses.replace(host, gpu_emulated=emulated)
    assert mig_vars.host_vars(host) == ({"mig_gpu_access": False} if emulated else {})


def test_only_gpu_nodes_without_layouts_are_left_out_of_the_mig_play() -> None:
    """The probe keeps them out of playbooks/mig.yml, where they would only check the settings."""
    kinds = set()
    for example in ("slurm-mig", "slurm-small"):
        for host in loaded(example).resolved.hosts.values():
            kind = "gpus without layouts" if host.gpu_count and not host.mig_layouts else "other"
            assert (mig_vars.host_vars(host).get("gpuinfra_host_roles_left_out") == ["mig"]) == (kind != "other")
            kinds.add(kind)
    assert kinds == {"gpus without layouts", "other"}


def _plan(cluster: Path, out: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpuinfra", "plan", str(cluster), "--out", str(out)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )


@pytest.mark.tools
def test_a_layout_that_cannot_pack_stops_plan_before_rendering(tmp_path: Path) -> None:
    # 3g + 3g + 1g fits the seven compute slices but not the eight memory slices (4 + 4 + 1).
    text = (DATA / "slurm-mig.yml").read_text()
    broken = text.replace("mixed-80: {4g.40gb: 1, 2g.20gb: 1, 1g.10gb: 1}", "mixed-80: {3g.40gb: 2, 1g.10gb: 1}")
    assert broken != text
    cluster = tmp_path / "cluster.yml"
    cluster.write_text(broken)
    result = _plan(cluster, tmp_path / "plan")
    assert result.returncode == 3, result.stderr
    assert "node_groups[a100].mig[1].layout" in result.stderr
    assert "'mixed-80'" in result.stderr and "A100-SXM4-80GB" in result.stderr
    assert not (tmp_path / "plan").exists()


@pytest.mark.tools
def test_plan_writes_the_mig_files(tmp_path: Path) -> None:
    result = _plan(DATA / "slurm-mig.yml", tmp_path / "plan")
    assert result.returncode == 0, result.stderr
    written = (tmp_path / "plan" / "mig" / "config.yaml").read_text()
    assert written == (GOLDEN / "mig" / "slurm-mig" / "config.yaml").read_text()


@pytest.mark.tools
@pytest.mark.parametrize("name", ["y", "1e3", "0o17", "null"])
def test_a_layout_name_stays_a_string_to_every_yaml_reader(tmp_path: Path, name: str) -> None:
    """Valid layout names that plain YAML reads as a boolean, a number or null (y and 1e3 to Go's YAML reader, which
    mig-parted uses; 0o17 to YAML 1.2) reach mig-parted as the same string."""
    import yaml  # PyYAML, the YAML 1.1 reader Ansible uses

    text = (DATA / "slurm-mig.yml").read_text().replace("mixed-80", f'"{name}"')  # quoted, as gpuinfra asks
    cluster = tmp_path / "cluster.yml"
    cluster.write_text(text)
    result = _plan(cluster, tmp_path / "plan")
    assert result.returncode == 0, result.stderr
    written = (tmp_path / "plan" / "mig" / "config.yaml").read_text()
    for config in (yaml_load(written), yaml.safe_load(written), json.loads(written.split("\n", 3)[3])):
        assert name in config["mig-configs"], config["mig-configs"].keys()


def test_slurm_offers_the_slices_and_the_whole_gpus() -> None:
    """slurm-mig: a100 nodes carve GPUs 0-2 (7x 1g.10gb on 0 and 1; 4g+2g+1g on 2) and keep GPU 3 whole; the h100
    node carves both GPUs into 2x 3g.40gb."""
    plan = rendered("slurm-mig")
    node_lines = [line for line in plan["slurm/slurm.conf"].content.splitlines() if line.startswith("NodeName=")]
    assert node_lines == [
        "NodeName=a100-[01-02] Gres=gpu:a100:1,gpu:1g.10gb:15,gpu:2g.20gb:1,gpu:4g.40gb:1 State=UNKNOWN",
        "NodeName=h100-01 Gres=gpu:3g.40gb:4 State=UNKNOWN",
    ]
    # gres.conf as a100-01 has it: its whole GPU by device file, its slices from the mig role's fragment.
    gres_lines = [line for line in plan["slurm/gres.conf"].content.splitlines() if not line.startswith("#")]
    assert plan["slurm/gres.conf"].host == "a100-01"
    assert gres_lines == [
        "NodeName=a100-[01-02] Name=gpu Type=a100 File=/dev/nvidia3",
        f"Include {mig_vars.SLURM_GRES_CONF}",
    ]
    includes = group_vars(loaded("slurm-mig").resolved)["slurm_common_gres_includes"]
    assert includes == {"a100": mig_vars.SLURM_GRES_CONF, "h100": mig_vars.SLURM_GRES_CONF}
    assert mig_vars.group_vars(loaded("slurm-mig").resolved)["mig_slurm_gres_conf"] == mig_vars.SLURM_GRES_CONF
