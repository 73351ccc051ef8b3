"""Each role's inputs digest on each host changes exactly when something the role could read changes: a variable it
names, the groups it reads, another host's variables (for roles that read hostvars)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML

from gpuinfra.model import Cluster
from gpuinfra.render.inventory import inventory_yaml
from gpuinfra.render.receipts import (
    HOST_INPUTS,
    HOST_MARK,
    INPUTS_PREFIX,
    group_reads,
    names_its_hosts,
    reads_other_hosts,
    receipt_roles,
    role_text,
)
from gpuinfra.resolve import resolve

ROOT = Path(__file__).resolve().parents[2]
SANDBOX = YAML(typ="safe").load((ROOT / "inventories" / "sandbox" / "cluster.yml").read_text())


def digests(data: dict[str, Any]) -> dict[str, dict[str, str]]:
    """host -> role -> digest, wherever the inventory puts them (a node group's vars, or the host's), completed with
    the host's own digest as the receipt's action plugin completes them."""
    inventory = inventory_yaml(resolve(Cluster.model_validate(data)))["all"]
    wanted = (INPUTS_PREFIX, HOST_INPUTS)
    found: dict[str, dict[str, dict[str, str]]] = {}  # host -> variable -> {"__ansible_unsafe": digest}
    for group in inventory["children"].values():
        shared = {k: v for k, v in group.get("vars", {}).items() if k.startswith(wanted)}
        for host in group["hosts"]:
            found.setdefault(host, {}).update(shared)
    for host, variables in inventory["hosts"].items():
        found.setdefault(host, {}).update({k: v for k, v in variables.items() if k.startswith(wanted)})
    out: dict[str, dict[str, str]] = {}
    for host, values in found.items():
        own = values.pop(HOST_INPUTS)["__ansible_unsafe"]
        out[host] = {}
        for key, value in values.items():
            digest = value["__ansible_unsafe"]
            if digest.endswith(HOST_MARK):
                digest = digest.removesuffix(HOST_MARK) + ":" + own
            out[host][key[len(INPUTS_PREFIX) :]] = digest
    return out


def changed(before: dict[str, dict[str, str]], after: dict[str, dict[str, str]]) -> set[tuple[str, str]]:
    return {(host, role) for host in before for role in before[host] if after[host][role] != before[host][role]}


def test_every_role_with_a_receipt_has_a_digest_on_every_host() -> None:
    assert {"nvidia_driver", "munge", "slurm_common", "prometheus", "node_exporter"} <= set(receipt_roles())
    found = digests(SANDBOX)
    assert set(found) == {"ctl01", "gpu01", "gpu02"}
    for roles in found.values():
        assert set(roles) == set(receipt_roles())
        assert all(len(digest.split(":")[0]) == 24 for digest in roles.values())


def test_the_same_cluster_gives_the_same_digests() -> None:
    assert digests(SANDBOX) == digests(copy.deepcopy(SANDBOX))


def test_a_new_driver_version_changes_only_the_roles_that_read_it() -> None:
    data = copy.deepcopy(SANDBOX)
    data["driver"]["version"] = "535.216.03"
    roles = {role for _, role in changed(digests(SANDBOX), digests(data))}
    assert "nvidia_driver" in roles
    assert not roles & {"munge", "slurm_dbd", "slurm_accounting", "alertmanager", "grafana"}


# The roles the site playbook runs on a configless GPU node (slurm_common runs on the controller only).
GPU_NODE_ROLES = {
    "nvidia_driver", "nvidia_container_toolkit", "gpu_health", "kernel_updates", "munge", "slurm_compute",
    "node_exporter", "dcgm_exporter", "monitoring_tls", "mig",
}  # fmt: skip


def test_a_new_gpu_node_changes_no_role_of_the_other_gpu_nodes_but_reaches_slurm_conf_and_the_targets() -> None:
    data = copy.deepcopy(SANDBOX)
    gpu = data["node_groups"]["gpu"]
    gpu["hosts"] = "gpu[01-03]"
    gpu["addresses"]["gpu03"] = "10.213.42.13"
    before, after = digests(SANDBOX), digests(data)
    differs = changed(before, after)
    assert set(after) == {"ctl01", "gpu01", "gpu02", "gpu03"}
    assert GPU_NODE_ROLES & set(receipt_roles()) >= {"nvidia_driver", "slurm_compute", "node_exporter"}
    assert {(host, role) for host, role in differs if host != "ctl01"} & {
        (host, role) for host in ("gpu01", "gpu02") for role in GPU_NODE_ROLES
    } == set()
    assert {("ctl01", "slurm_common"), ("ctl01", "prometheus_targets")} <= differs
    # Prometheus reads its exporters from prometheus_targets' files, and Alertmanager its peers' addresses, whose
    # peers are the monitoring hosts: a GPU node is neither.
    assert {("ctl01", "prometheus"), ("ctl01", "alertmanager")} & differs == set()


def test_a_new_address_of_a_monitoring_peer_reaches_the_roles_that_read_its_hostvars() -> None:
    two = copy.deepcopy(SANDBOX)
    two["node_groups"]["monitor"] = {"hosts": "mon02", "addresses": {"mon02": "10.213.42.30"}, "roles": ["monitoring"]}
    moved = copy.deepcopy(two)
    moved["node_groups"]["monitor"]["addresses"]["mon02"] = "10.213.42.31"
    differs = changed(digests(two), digests(moved))
    assert {("ctl01", "alertmanager"), ("ctl01", "grafana")} <= differs


def test_a_role_that_names_its_groups_reads_only_those() -> None:
    assert group_reads("x: \"{{ groups['slurm_controller'] | first }}\"") == frozenset({"slurm_controller"})
    assert group_reads("# the groups of a service\nx: 1") == frozenset()
    assert group_reads('loop: "{{ groups[item] }}"') is None
    assert group_reads('x: "{{ groups | length }}"') is None
    # A YAML key is no read: a Prometheus rules file's `groups:`, a module's argument.
    assert group_reads("groups:\n  - name: gpuinfra-gpu") == frozenset()
    assert not reads_other_hosts("a: \"{{ hostvars[inventory_hostname]['ansible_host'] }}\"")
    assert reads_other_hosts("a: \"{{ hostvars[item]['ansible_host'] }}\"")


def test_a_role_that_names_the_hosts_it_reads_is_told_apart_from_one_that_may_read_any() -> None:
    assert names_its_hosts("a: \"{{ hostvars[groups['monitoring'][0]]['ansible_host'] }}\"")
    assert names_its_hosts("{% for peer in peers %}{{ hostvars[peer].ansible_host }}{% endfor %}")
    assert not names_its_hosts("a: \"{{ hosts | map('extract', hostvars) | list }}\"")
    assert not names_its_hosts('a: "{{ hostvars[groups[item][0]].ansible_host }}"')
    assert not names_its_hosts("a: \"{{ ansible_play_hosts | map('extract', hostvars) }}\"")
    assert not names_its_hosts("loop: \"{{ query('inventory_hostnames', 'gpu*') }}\"\nx: \"{{ hostvars[item] }}\"")


def test_a_default_the_inventory_sets_for_every_host_is_not_scanned() -> None:
    # prometheus_dcgm_exporter_gpu_counts' default reads every GPU node's hostvars; gpuinfra sets the value, so
    # Ansible never evaluates that default. The role's argument specs repeat it as documentation only.
    assert not names_its_hosts(role_text("prometheus"))
    assert names_its_hosts(role_text("prometheus", frozenset({"prometheus_dcgm_exporter_gpu_counts"})))


def test_an_unrelated_setting_leaves_every_gpu_node_role_alone() -> None:
    data = copy.deepcopy(SANDBOX)
    data["health"]["check"]["interval"] = "20s"
    differs = changed(digests(SANDBOX), digests(data))
    assert ("gpu01", "nvidia_driver") not in differs and ("gpu01", "munge") not in differs
    assert ("gpu01", "gpu_health") in differs
