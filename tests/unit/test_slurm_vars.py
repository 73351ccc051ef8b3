"""The Slurm concern: role variables from the model, and the files `gpuinfra plan` renders from the roles' templates.

Regenerate the golden files with `GPUINFRA_UPDATE_GOLDEN=1 pytest tests/unit/test_slurm_vars.py` and review the diff.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import hostlist
import pytest
import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template

from gpuinfra.model import Cluster
from gpuinfra.model.slurm import OWNED_SLURM_KEYS
from gpuinfra.render.artifacts import Artifact
from gpuinfra.render.inventory import group_vars
from gpuinfra.render.plan import render
from gpuinfra.render.vars import admission, slurm
from gpuinfra.render.vars.registry import CONCERNS
from gpuinfra.resolve import resolve
from gpuinfra.validate.load import load_cluster

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "unit" / "golden" / "slurm"
SCENARIO = ROOT / "molecule" / "slurm" / "vars"
MODEL = ROOT / "molecule" / "slurm" / "model" / "cluster.yml"
SMALL = ROOT / "inventories" / "slurm-small" / "cluster.yml"
SANDBOX = ROOT / "inventories" / "sandbox" / "cluster.yml"
UPDATE = os.environ.get("GPUINFRA_UPDATE_GOLDEN") == "1"


def check_golden(path: Path, text: str) -> None:
    if UPDATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return
    assert path.exists(), f"{path.relative_to(ROOT)} is missing; create it with GPUINFRA_UPDATE_GOLDEN=1"
    assert text == path.read_text(), f"{path.relative_to(ROOT)} differs; regenerate with GPUINFRA_UPDATE_GOLDEN=1"


def conf(text: str) -> list[dict[str, str]]:
    """slurm.conf-style lines as dicts (comments and blank lines dropped); fails on a line that is not key=value."""
    out = []
    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        pairs = line.split(" ")
        assert all("=" in pair for pair in pairs), f"not key=value: {line!r}"
        out.append(dict(pair.split("=", 1) for pair in pairs))
    return out


def rendered(path: Path) -> dict[str, str]:
    rc = load_cluster(path).resolved
    return {r.artifact.path: r.content for r in render(rc, only=list(slurm.ARTIFACTS))}


def test_concern_is_registered() -> None:
    assert slurm.CONCERN in CONCERNS


@pytest.mark.parametrize("artifact", slurm.ARTIFACTS, ids=lambda a: a.path)
def test_artifacts_match_golden(artifact: Artifact) -> None:
    # enroot's files on the sandbox, whose Slurm runs jobs in containers; the rest on slurm-small.
    example = SANDBOX if artifact.host_role == slurm.CONTAINERS_GROUP else SMALL
    check_golden(GOLDEN / example.parent.name / Path(artifact.path).name, rendered(example)[artifact.path])


def test_plan_gives_a_host_its_node_groups_settings() -> None:
    """slurmd's options name the node as slurm.conf defines it, a setting of the node group (node_group_vars)."""
    options = rendered(SMALL)["slurm-compute/default/slurmd"]
    assert '"real_memory": 1000000, "gres": ["gpu:a100:8"]}' in options


def test_slurm_conf_holds_the_model() -> None:
    lines = conf(rendered(SMALL)["slurm/slurm.conf"])
    settings = {k: v for line in lines if len(line) == 1 for k, v in line.items()}
    assert settings["GresTypes"] == "gpu"
    assert settings["SelectType"] == "select/cons_tres"
    assert settings["ProctrackType"] == "proctrack/cgroup"
    assert settings["AccountingStorageTRES"] == "gres/gpu"
    assert settings["AccountingStorageEnforce"] == "associations,limits,qos,safe"
    assert settings["PriorityType"] == "priority/multifactor"
    assert settings["PriorityWeightFairshare"] == "100000"
    assert settings["PreemptType"] == "preempt/qos"
    assert settings["PreemptMode"] == "REQUEUE"
    nodes = {line["NodeName"]: line for line in lines if "NodeName" in line}
    assert nodes["a100-[01-08]"]["Gres"] == "gpu:a100:8"
    assert nodes["l40s-[01-02]"]["Gres"] == "gpu:l40s:4"
    parts = {line["PartitionName"]: line for line in lines if "PartitionName" in line}
    assert parts["vision"]["AllowAccounts"] == "vision"
    assert parts["interactive"]["Default"] == "YES"
    assert [p for p, line in parts.items() if line["Default"] == "YES"] == ["interactive"]
    assert parts["scavenger"]["Nodes"] == "a100-[01-08],l40s-[01-02]"
    assert parts["scavenger"]["QOS"] == "scavenger"
    assert parts["vision"]["MaxTime"] == "2-00:00:00"
    assert parts["vision"]["PriorityTier"] == "10"


def test_gres_conf_names_every_device_file() -> None:
    lines = conf(rendered(SMALL)["slurm/gres.conf"])
    assert lines == [
        {"NodeName": "a100-[01-08]", "Name": "gpu", "Type": "a100", "File": "/dev/nvidia[0-7]"},
        {"NodeName": "l40s-[01-02]", "Name": "gpu", "Type": "l40s", "File": "/dev/nvidia[0-3]"},
    ]


def test_cgroup_conf_constrains_devices() -> None:
    assert {"ConstrainDevices": "yes"} in conf(rendered(SMALL)["slurm/cgroup.conf"])


def _cluster(**changes: Any) -> Cluster:
    base: dict[str, Any] = {
        "name": "c",
        "driver": {"version": "535.261.03"},
        "monitoring": {"components": ["dcgm_exporter"]},
        "node_groups": {
            "head": {"hosts": "ctl", "roles": ["slurm_controller", "slurm_dbd"]},
            "gpu": {"hosts": "gpu[01-16]", "roles": ["slurm_compute"], "gpu": {"model": "H100-SXM5-80GB", "count": 1}},
        },
        "slurm": {"partitions": {"all": {"node_groups": ["gpu"], "default": True}}},
    }
    base.update(changes)
    return Cluster.model_validate(base)


def test_thousand_nodes_render_one_line_per_group() -> None:
    model = _cluster()
    groups = dict(model.node_groups)
    groups["gpu"] = groups["gpu"].model_copy(update={"hosts": "gpu[0001-1000]"})
    variables = slurm.group_vars(resolve(model.model_copy(update={"node_groups": groups})))
    assert variables["slurm_common_nodes"] == [{"names": "gpu[0001-1000]", "gres": ["gpu:h100:1"]}]
    assert variables["slurm_common_gres"] == [
        {"nodes": "gpu[0001-1000]", "type": "h100", "file": "/dev/nvidia0", "shards": 0}
    ]


def test_nodes_carry_their_addresses_so_slurmctld_never_resolves_their_names() -> None:
    """The sandbox's cluster file gives every address: its NodeName line names them in the hostlist's order."""
    lines = [line for line in conf(rendered(SANDBOX)["slurm/slurm.conf"]) if "NodeName" in line]
    addresses = load_cluster(SANDBOX).resolved.hosts
    assert [(line["NodeName"], line["NodeAddr"]) for line in lines] == [
        ("gpu[01-02]", f"{addresses['gpu01'].address},{addresses['gpu02'].address}")
    ]


def test_a_large_addressed_group_is_cut_into_short_lines() -> None:
    model = _cluster()
    groups = dict(model.node_groups)
    hosts = [f"gpu{i:03d}" for i in range(1, 131)]
    groups["gpu"] = groups["gpu"].model_copy(
        update={
            "hosts": "gpu[001-130]",
            "addresses": {h: f"10.0.{i // 200}.{i % 200 + 1}" for i, h in enumerate(hosts)},
        }
    )
    lines = slurm.group_vars(resolve(model.model_copy(update={"node_groups": groups})))["slurm_common_nodes"]
    assert [line["names"] for line in lines] == ["gpu[001-064]", "gpu[065-128]", "gpu[129-130]"]
    assert lines[2]["addresses"] == "10.0.0.129,10.0.0.130"
    assert all(len(line["addresses"].split(",")) == len(hostlist.expand_hostlist(line["names"])) for line in lines)


def test_extra_parameters_are_written_one_line_each_before_the_nodes() -> None:
    model = _cluster()
    model.slurm.extra_config.update(MessageTimeout="30", SchedulerTimeSlice="60")  # type: ignore[union-attr]
    text = render(resolve(model), only=list(slurm.ARTIFACTS))
    conf_text = next(r.content for r in text if r.artifact.path == "slurm/slurm.conf")
    lines = conf_text.splitlines()
    assert lines.index("MessageTimeout=30") + 1 == lines.index("SchedulerTimeSlice=60") < lines.index("# Nodes")


def test_every_parameter_the_template_writes_is_owned() -> None:
    """slurm.extra_config refuses exactly the parameters slurm.conf.j2 writes: a parameter added to the template
    must name the field that sets it in OWNED_SLURM_KEYS."""
    template = (ROOT / "roles" / "slurm_common" / "templates" / "slurm.conf.j2").read_text()
    assert set(re.findall(r"^([A-Z][A-Za-z]+)=", template, re.M)) == set(OWNED_SLURM_KEYS)


def test_gres_types_stay_distinct_when_families_collide() -> None:
    model = _cluster()
    groups = dict(model.node_groups)
    groups["small"] = groups["gpu"].model_copy(
        update={"hosts": "s[1-2]", "gpu": groups["gpu"].gpu.model_copy(update={"model": "H100-PCIE-80GB"})}  # type: ignore[union-attr]
    )
    types = slurm.gres_types(model.model_copy(update={"node_groups": groups}))
    assert types == {"H100-PCIE-80GB": "h100-pcie-80gb", "H100-SXM5-80GB": "h100-sxm5-80gb"}


def test_accounts_come_parents_first() -> None:
    model = _cluster(
        slurm={
            "partitions": {"all": {"node_groups": ["gpu"]}},
            "accounts": {"leaf": {"parent": "mid"}, "mid": {"parent": "top"}, "top": {}},
        }
    )
    assert [a["name"] for a in slurm.group_vars(resolve(model))["slurm_accounting_accounts"]] == ["top", "mid", "leaf"]


def test_memory_default_is_the_smallest_share() -> None:
    variables = group_vars(load_cluster(SMALL).resolved)
    # a100: 1,000,000 MiB / 128 CPUs = 7812; l40s: 512,000 / 64 = 8000.
    assert variables["slurm_common_def_mem_per_cpu"] == 7812


def test_job_mapping_follows_the_exporter() -> None:
    default = slurm.group_vars(resolve(_cluster()))
    assert default["slurm_compute_job_mapping_dir"] == "/var/lib/dcgm-exporter/job-mapping"
    without = _cluster(monitoring={"components": ["node_exporter"]})
    assert slurm.group_vars(resolve(without))["slurm_compute_job_mapping_dir"] == ""


def test_prolog_writes_where_the_exporter_reads() -> None:
    """One folder: the prolog and epilog write the configured job mapping folder, not a built-in one."""
    moved = _cluster(monitoring={"components": ["dcgm_exporter"], "dcgm_exporter": {"job_mapping_dir": "/srv/jobmap"}})
    variables = group_vars(resolve(moved))
    assert variables["slurm_compute_job_mapping_dir"] == "/srv/jobmap"
    assert variables["dcgm_exporter_hpc_job_mapping_dir"] == "/srv/jobmap"


def test_no_slurm_section_renders_nothing() -> None:
    assert slurm.group_vars(resolve(_cluster(slurm=None))) == {}


def _scenario_vars(name: str) -> dict[str, Any]:
    data = yaml.safe_load((SCENARIO / name).read_text())
    assert isinstance(data, dict)
    return data


def _home_relative_sources(rendered_vars: dict[str, Any]) -> dict[str, Any]:
    """The scenario names the release sources under `~/`, as the model does; gpuinfra renders the absolute path."""
    sources = Path(rendered_vars["slurm_containers_build_sources"])
    return rendered_vars | {"slurm_containers_build_sources": f"~/{sources.relative_to(Path.home())}"}


def test_scenario_two_node_vars_are_what_the_model_renders() -> None:
    rendered_vars = slurm.group_vars(load_cluster(MODEL).resolved)
    assert _scenario_vars("two_nodes.yml") == _home_relative_sources(rendered_vars)


def one_node_model() -> Cluster:
    """The scenario's model before side_effect.yml adds slurm-gpu02: without the A100 node group."""
    model = load_cluster(MODEL).model
    assert model.slurm is not None
    groups = {name: group for name, group in model.node_groups.items() if name != "a100"}
    partitions = {
        name: partition.model_copy(update={"node_groups": [g for g in partition.node_groups if g != "a100"]})
        for name, partition in model.slurm.partitions.items()
    }
    slurm_section = model.slurm.model_copy(update={"partitions": partitions})
    return model.model_copy(update={"node_groups": groups, "slurm": slurm_section})


def test_scenario_one_node_vars_are_the_model_without_the_second_node() -> None:
    rendered_vars = slurm.group_vars(resolve(one_node_model()))
    assert _scenario_vars("one_node.yml") == _home_relative_sources(rendered_vars)


@pytest.mark.parametrize(("mode", "line"), [("cancel", "CANCEL"), ("requeue", "REQUEUE")])
def test_preempt_mode_renders_what_slurm_accepts(tmp_path: Path, mode: str, line: str) -> None:
    text = SMALL.read_text()
    assert "preempt_mode: requeue" in text
    cluster = tmp_path / "cluster.yml"
    cluster.write_text(text.replace("preempt_mode: requeue", f"preempt_mode: {mode}"))
    settings = {
        k: v for entry in conf(rendered(cluster)["slurm/slurm.conf"]) if len(entry) == 1 for k, v in entry.items()
    }
    assert settings["PreemptMode"] == line


def test_shards_share_a_groups_whole_gpus(tmp_path: Path) -> None:
    """gpu.shards: the group's node line offers shards beside its GPUs, gres.conf spreads them over the same device
    files, and GresTypes and the accounted TRES name gres/shard; a group without shards is unchanged."""
    text = SMALL.read_text()
    assert "gpu: {model: L40S, count: 4}" in text
    cluster = tmp_path / "cluster.yml"
    cluster.write_text(text.replace("gpu: {model: L40S, count: 4}", "gpu: {model: L40S, count: 4, shards: 4}"))
    files = rendered(cluster)
    lines = conf(files["slurm/slurm.conf"])
    settings = {k: v for line in lines if len(line) == 1 for k, v in line.items()}
    assert (settings["GresTypes"], settings["AccountingStorageTRES"]) == ("gpu,shard", "gres/gpu,gres/shard")
    nodes = {line["NodeName"]: line["Gres"] for line in lines if "NodeName" in line}
    assert nodes == {"a100-[01-08]": "gpu:a100:8", "l40s-[01-02]": "gpu:l40s:4,shard:16"}
    assert conf(files["slurm/gres.conf"])[1:] == [
        {"NodeName": "l40s-[01-02]", "Name": "gpu", "Type": "l40s", "File": "/dev/nvidia[0-3]"},
        {"NodeName": "l40s-[01-02]", "Name": "shard", "Count": "16", "File": "/dev/nvidia[0-3]"},
    ]


@pytest.mark.parametrize(
    ("os", "release", "setting"),
    [
        ("debian12", "22.05", ("SchedulerParameters", "preempt_send_user_signal")),
        ("debian13", "24.11", ("PreemptParameters", "send_user_signal")),
    ],
)
def test_the_preemption_signal_is_spelled_for_the_clusters_slurm(
    tmp_path: Path, os: str, release: str, setting: tuple[str, str]
) -> None:
    """Slurm 22.05 refuses PreemptParameters (`Parsing error at unrecognized key`, seen on the sandbox's slurmctld)
    and takes the same setting in SchedulerParameters; 23.02 moved it."""
    cluster = tmp_path / "cluster.yml"
    text = SMALL.read_text()
    assert "\nos: debian12\n" in text
    cluster.write_text(text.replace("\nos: debian12\n", f"\nos: {os}\n"))
    assert group_vars(load_cluster(cluster).resolved)["slurm_common_release"] == release
    settings = {k: v for line in conf(rendered(cluster)["slurm/slurm.conf"]) if len(line) == 1 for k, v in line.items()}
    key, value = setting
    assert settings[key] == value
    other = "PreemptParameters" if key == "SchedulerParameters" else "SchedulerParameters"
    assert other not in settings


def test_blocks_render_topology_block_on_a_current_slurm(tmp_path: Path) -> None:
    """NVLink blocks (Slurm 23.11+, here Debian 13's 24.11): TopologyPlugin=topology/block, one BlockName per block
    and no switches."""
    text = SMALL.read_text().replace("\nos: debian12\n", "\nos: debian13\n")
    leaves = '    leaves:\n      ib-leaf1: a100-[01-04]\n      ib-leaf2: ["a100-[05-08]", "l40s-[01-02]"]\n'
    assert leaves in text
    cluster = tmp_path / "cluster.yml"
    cluster.write_text(text.replace(leaves, '    blocks:\n      nvl1: a100-[01-08]\n      nvl2: "l40s-[01-02]"\n'))
    files = rendered(cluster)
    assert {"TopologyPlugin": "topology/block"} in conf(files["slurm/slurm.conf"])
    assert conf(files["slurm/topology.conf"]) == [
        {"BlockName": "nvl1", "Nodes": "a100-[01-08]"},
        {"BlockName": "nvl2", "Nodes": "l40s-[01-02]"},
    ]


def test_no_topology_leaves_the_plugin_unset() -> None:
    text = rendered(MODEL)
    assert "TopologyPlugin" not in text["slurm/slurm.conf"]
    assert conf(text["slurm/topology.conf"]) == []


def _config_hosts(**changes: Any) -> list[str]:
    groups: dict[str, Any] = {
        "head": {"hosts": "ctl", "roles": ["slurm_controller", "slurm_dbd"]},
        "gpu": {"hosts": "gpu[01-02]", "roles": ["slurm_compute"], "gpu": {"model": "H100-SXM5-80GB", "count": 1}},
        "sliced": {
            "hosts": "mig01",
            "roles": ["slurm_compute"],
            "gpu": {"model": "H100-SXM5-80GB", "count": 1},
            "mig": [{"gpus": "all", "layout": "halves"}],
        },
        "login12": {"hosts": "login01", "roles": ["slurm_login"], "os": "debian12"},
        "login13": {"hosts": "login02", "roles": ["slurm_login"], "os": "debian13"},
    }
    model = _cluster(node_groups=groups, mig={"layouts": {"halves": {"3g.40gb": 2}}}, **changes)
    return slurm.inventory_groups(resolve(model))[slurm.CONFIG_GROUP]


def test_configless_keeps_the_files_only_where_they_cannot_be_fetched() -> None:
    """The controller serves them; slurmd fetches them, and sackd from Slurm 23.11 (Debian 13). A MIG node keeps
    its own, for the gres.conf that includes its slices."""
    assert _config_hosts() == ["ctl", "mig01", "login01"]
    configless_off = {"partitions": {"all": {"node_groups": ["gpu"]}}, "configless": False}
    assert _config_hosts(slurm=configless_off) == ["ctl", "gpu01", "gpu02", "mig01", "login01", "login02"]


def test_each_compute_group_gets_its_own_node_definition_without_names() -> None:
    model = _cluster()
    assert slurm.node_group_vars(resolve(model)) == {
        "gpu": {"slurm_compute_node": {"gres": ["gpu:h100:1"]}, "slurm_compute_admission": False}
    }
    assert "SlurmctldParameters=enable_configless" in rendered(SMALL)["slurm/slurm.conf"]


@pytest.mark.parametrize(
    ("release", "takes_nodes"), [("22.05", False), ("23.02", False), ("23.11", True), ("24.11", True), ("", False)]
)
def test_only_slurm_23_11_and_later_take_a_new_node_without_a_restart(release: str, takes_nodes: bool) -> None:
    """slurm_common restarts slurmctld for a new node unless reconfigure starts it anew in place (23.11 on); a
    release gpuinfra does not know ("") restarts."""
    expression = yaml.safe_load((ROOT / "roles" / "slurm_common" / "vars" / "main.yml").read_text())[
        "__slurm_common_reconfigure_takes_nodes"
    ]
    templar = Templar(loader=DataLoader(), variables={"slurm_common_release": release})
    assert templar.template(trust_as_template(expression)) is takes_nodes


def test_the_gates_and_the_scheduled_checks_jobs_run_in_gpuinfras_own_qos() -> None:
    """The gate's QoS has no limit a user's has; the scheduled checks' is cancelled by any other QoS's job; root's
    association gets both, and a joining GPU machine is held for its admission."""
    slurm_section = {"partitions": {"all": {"node_groups": ["gpu"]}}, "preempt_mode": "requeue"}
    gated = _cluster(health={"admission": {"checks": ["dcgm_diag"]}}, slurm=slurm_section)
    scheduled = _cluster(health={"admission": {"checks": ["dcgm_diag"], "every": "7d"}}, slurm=slurm_section)
    without = slurm.group_vars(resolve(_cluster(slurm=slurm_section)))
    assert (without["slurm_accounting_root_qos"], without["slurm_accounting_preemptible"]) == ([], [])
    gate = slurm.group_vars(resolve(gated))
    assert [q["name"] for q in gate["slurm_accounting_qos"]] == ["gpuinfra"]
    assert (gate["slurm_accounting_root_qos"], gate["slurm_accounting_preemptible"]) == (["gpuinfra"], [])
    both = slurm.group_vars(resolve(scheduled))
    idle = next(q for q in both["slurm_accounting_qos"] if q["name"] == "gpuinfra-idle")
    assert (idle["preempt_mode"], idle["preempt"], idle["max_gpus_per_job"]) == ("cancel", [], None)
    assert both["slurm_accounting_root_qos"] == ["gpuinfra", "gpuinfra-idle"]
    assert both["slurm_accounting_preemptible"] == ["gpuinfra-idle"]
    assert slurm.node_group_vars(resolve(scheduled))["gpu"]["slurm_compute_admission"] is True
    checks = admission.group_vars(resolve(scheduled))
    assert (checks["gpu_scheduled_checks_enabled"], checks["gpu_scheduled_checks_every"]) == (True, 7 * 86400)
    assert (checks["gpu_admission_qos"], checks["gpu_scheduled_checks_qos"]) == ("gpuinfra", "gpuinfra-idle")
    assert admission.group_vars(resolve(gated))["gpu_scheduled_checks_enabled"] is False
