"""Slurm and Munge: role variables from `slurm:` and the node groups in the cluster file.

Roles: slurm_common (slurm.conf, gres.conf, cgroup.conf, the job-mapping prolog), slurm_accounting. The munge,
slurm_dbd, slurm_controller, slurm_compute and slurm_login roles need nothing from the model.
Node and partition lines are compressed to hostlists here (`gpu[01-16]`), so a 1,000-node cluster renders a
slurm.conf of a few lines per node group, not one line per host.

GPUs carved into MIG slices are GRES of their MIG profile (`gpu:1g.10gb:14`); GPUs left whole keep the model's
type. Slices have no fixed device files (their capability minors come from the driver), so gres.conf lists only
the whole GPUs, and on a node with MIG layouts includes the fragment the mig role writes from the host's devices.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import hostlist

from ... import catalog
from ...hostlists import expand_hosts
from ...model import Cluster, NodeGroup
from ...model.grammar import duration_seconds
from ...model.slurm import CHECKS_PARTITION, CHECKS_QOS, IDLE_CHECKS_QOS, ROOT_SWITCH, Account, Qos, Slurm
from ...resolve import ResolvedCluster
from ..artifacts import Artifact
from . import mig as mig_vars
from .concern import Concern

# The hosts that get pyxis and enroot: every Slurm host that runs or submits jobs, compute hosts first (the play's
# first host builds the packages, and compute hosts have a compiler for the driver already).
CONTAINERS_GROUP = "slurm_containers"

# slurmdbd.conf is left out on purpose: it holds the database password.
ARTIFACTS: tuple[Artifact, ...] = (
    Artifact("slurm/slurm.conf", "slurm_common", "slurm.conf.j2", "slurm_controller"),
    # As a compute node has it: there it names the GPUs slurmd offers.
    Artifact("slurm/gres.conf", "slurm_common", "gres.conf.j2", "slurm_compute"),
    Artifact("slurm/cgroup.conf", "slurm_common", "cgroup.conf.j2", "slurm_controller"),
    Artifact("slurm/topology.conf", "slurm_common", "topology.conf.j2", "slurm_controller"),
    Artifact("slurm/plugstack.conf", "slurm_common", "plugstack.conf.j2", "slurm_controller"),
    # What slurm_compute writes on each compute node: the job-mapping prolog and epilog, slurmd's options.
    Artifact("slurm/gpuinfra-prolog.sh", "slurm_compute", "prolog.sh.j2", "slurm_compute"),
    Artifact("slurm/gpuinfra-epilog.sh", "slurm_compute", "epilog.sh.j2", "slurm_compute"),
    Artifact("slurm-compute/default/slurmd", "slurm_compute", "slurmd.default.j2", "slurm_compute"),
    Artifact(
        "slurm-compute/slurmd.service.d/gpuinfra.conf", "slurm_compute", "slurmd.service.conf.j2", "slurm_compute"
    ),
    Artifact("slurm-dbd/mariadb/60-slurmdbd.cnf", "slurm_dbd", "mariadb-slurmdbd.cnf.j2", "slurm_dbd"),
    # enroot's settings as a compute node has them (the group lists compute hosts first): the role writes them only
    # where jobs run.
    Artifact("slurm-containers/enroot.conf.d/gpuinfra.conf", "slurm_containers", "enroot.conf.j2", CONTAINERS_GROUP),
    Artifact(
        "slurm-containers/tmpfiles.d/gpuinfra-enroot.conf", "slurm_containers", "tmpfiles.conf.j2", CONTAINERS_GROUP
    ),
    Artifact(
        "slurm-containers/gpuinfra-prolog.d/enroot-folders.sh",
        "slurm_containers",
        "enroot-folders.sh.j2",
        CONTAINERS_GROUP,
    ),
)

COMPUTE_ROLE = "slurm_compute"
CONTROLLER_ROLE = "slurm_controller"
LOGIN_ROLE = "slurm_login"
# The hosts that keep the Slurm configuration files; configless hosts fetch them from slurmctld.
CONFIG_GROUP = "slurm_config"
# Where the controller keeps the enroot and pyxis packages it built, for every cluster it manages.
PACKAGE_CACHE = "~/.cache/gpuinfra/packages"
# The first release whose login nodes fetch the configuration with sackd.
SACKD_RELEASE = "23.11"
# Where the gpu_health role installs the node health check (its __gpu_health_program).
HEALTH_CHECK_PROGRAM = "/usr/local/sbin/gpuinfra-health"


def gres_types(model: Cluster) -> dict[str, str]:
    """GPU model -> Slurm GRES type: the family in lower case (`H100-SXM5-80GB` -> `h100`), or the whole model
    name in lower case where two models of the cluster share a family, so that `--gres=gpu:TYPE:N` is exact."""
    models = sorted({g.gpu.model for g in model.node_groups.values() if g.gpu})
    family = {m: m.split("-")[0].lower() for m in models}
    shared = {f for f in family.values() if list(family.values()).count(f) > 1}
    return {m: (m.lower() if family[m] in shared else family[m]) for m in models}


def _compute_groups(model: Cluster) -> dict[str, NodeGroup]:
    return {name: g for name, g in model.node_groups.items() if COMPUTE_ROLE in g.roles}


def _hostlist(names: list[str]) -> str:
    return _collected(tuple(names))


@lru_cache(maxsize=256)
def _collected(names: tuple[str, ...]) -> str:
    """The same node groups' names are collected for NodeName, gres.conf and partition lines, by the plan and by
    the inventory: each takes a tenth of a second at 10,000 hosts."""
    return str(hostlist.collect_hostlist(list(names)))


def _device_files(indices: list[int]) -> str:
    """[0, 1, 2, 3] -> /dev/nvidia[0-3]; [2] -> /dev/nvidia2."""
    return "/dev/" + _hostlist([f"nvidia{i}" for i in indices])


# Compute node group -> (its whole GPUs' indices, its MIG slices per profile), for the groups with GPUs.
GpuGres = dict[str, tuple[list[int], list[dict[str, Any]]]]


def gpu_gres(rc: ResolvedCluster) -> GpuGres:
    """Which GPUs of each compute node group Slurm offers whole, and which as MIG slices."""
    mig_hosts = [h for h in mig_vars.mig_hosts(rc) if COMPUTE_ROLE in h.roles]
    slices = mig_vars.slurm_gres(rc, mig_hosts)
    carved = {h.group: set(h.mig_layouts) for h in mig_hosts}
    return {
        name: (
            [i for i in range(group.gpu.count) if i not in carved.get(name, set())],
            slices.get(name, []),
        )
        for name, group in _compute_groups(rc.model).items()
        if group.gpu is not None
    }


def _node_line(group: NodeGroup, gres: list[str]) -> dict[str, Any]:
    node: dict[str, Any] = {"names": _hostlist(expand_hosts(group.hosts))}
    for key, value in (
        ("cpus", group.cpus),
        ("sockets", group.sockets),
        ("cores_per_socket", group.cores_per_socket),
        ("threads_per_core", group.threads_per_core),
        ("real_memory", group.memory_mb),
    ):
        if value is not None:
            node[key] = value
    node["gres"] = gres
    return node


# Nodes per NodeName line when the line carries their addresses: slurm.conf's lines stay short (Slurm reads a line
# into a fixed buffer), and a 10,000-node group's line is cut into chunks.
NODES_PER_ADDRESSED_LINE = 64


def nodes(rc: ResolvedCluster, gpus: GpuGres) -> list[dict[str, Any]]:
    """The NodeName lines: one per compute node group, with its whole GPUs and MIG slices as GRES, and each node's
    address from the cluster file (NodeAddr) where it is not the node's name, so that slurmctld never waits on name
    resolution (a node added before its machine is up)."""
    out = []
    for line in _node_lines(rc, gpus).values():
        names = hostlist.expand_hostlist(line["names"])
        addresses = [rc.hosts[name].address for name in names]
        if addresses == names:
            out.append(line)
            continue
        for start in range(0, len(names), NODES_PER_ADDRESSED_LINE):
            chunk = slice(start, start + NODES_PER_ADDRESSED_LINE)
            out.append({**line, "names": _hostlist(names[chunk]), "addresses": ",".join(addresses[chunk])})
    return out


def _node_lines(rc: ResolvedCluster, gpus: GpuGres) -> dict[str, dict[str, Any]]:
    """Compute node group -> its NodeName line."""
    types = gres_types(rc.model)
    out = {}
    for name, group in _compute_groups(rc.model).items():
        gres: list[str] = []
        if group.gpu is not None:
            whole, slices = gpus[name]
            gres = [f"gpu:{types[group.gpu.model]}:{len(whole)}"] if whole else []
            gres += [f"gpu:{s['type']}:{s['count']}" for s in slices]
            if whole and group.gpu.shards:
                gres.append(f"shard:{len(whole) * group.gpu.shards}")
        out[name] = _node_line(group, gres)
    return out


def node_group_vars(rc: ResolvedCluster) -> dict[str, dict[str, Any]]:
    """Compute node group -> its definition in slurm.conf without its names, which slurm_compute keeps beside
    slurmd's options: a change restarts that group's slurmd, and a new node in another group changes nothing.
    With the admission gate, a GPU group's joining machines are held out of service until their checks pass."""
    if rc.model.slurm is None:
        return {}
    lines = _node_lines(rc, gpu_gres(rc))
    gated = bool(checks_partition(rc))
    return {
        name: {
            "slurm_compute_node": {key: value for key, value in line.items() if key != "names"},
            "slurm_compute_admission": gated and rc.model.node_groups[name].gpu is not None,
        }
        for name, line in lines.items()
    }


def inventory_groups(rc: ResolvedCluster) -> dict[str, list[str]]:
    """slurm_config: the hosts that keep the configuration files. The controller serves them; configless compute
    nodes fetch them with slurmd, and login nodes with sackd from Slurm 23.11. MIG node groups keep theirs, since
    their gres.conf includes the slices the driver made on each node."""
    slurm = rc.model.slurm
    if slurm is None:
        return {CONFIG_GROUP: [], CONTAINERS_GROUP: []}
    first_sackd = catalog.SLURM_RELEASES.index(SACKD_RELEASE)
    releases = {name: catalog.os_release(name) for name in {host.os for host in rc.hosts.values()}}
    has_sackd = {
        name: release is not None and catalog.SLURM_RELEASES.index(release.slurm_release) >= first_sackd
        for name, release in releases.items()
    }
    hosts = []
    for host in rc.hosts.values():
        roles = set(host.roles)
        sackd = has_sackd[host.os]
        keeps = (
            CONTROLLER_ROLE in roles
            or (COMPUTE_ROLE in roles and (not slurm.configless or bool(host.mig_layouts)))
            or (LOGIN_ROLE in roles and COMPUTE_ROLE not in roles and not (slurm.configless and sackd))
        )
        if keeps:
            hosts.append(host.name)
    return {CONFIG_GROUP: hosts, CONTAINERS_GROUP: containers_hosts(rc)}


def containers_hosts(rc: ResolvedCluster) -> list[str]:
    if rc.model.slurm is None or rc.model.slurm.containers is None:
        return []
    compute = [host.name for host in rc.hosts.values() if COMPUTE_ROLE in host.roles]
    others = [host.name for host in rc.hosts.values() if {CONTROLLER_ROLE, LOGIN_ROLE} & set(host.roles)]
    return compute + [name for name in others if name not in compute]


def gres(rc: ResolvedCluster, gpus: GpuGres) -> list[dict[str, Any]]:
    """One explicit gres.conf line per GPU node group with whole GPUs: their device files, and the shards Slurm
    spreads evenly over them (0 for none)."""
    types = gres_types(rc.model)
    out = []
    for name, (whole, _slices) in gpus.items():
        group = rc.model.node_groups[name]
        if whole and group.gpu is not None:
            out.append(
                {
                    "nodes": _hostlist(expand_hosts(group.hosts)),
                    "type": types[group.gpu.model],
                    "file": _device_files(whole),
                    "shards": len(whole) * (group.gpu.shards or 0),
                }
            )
    return out


def mig_gres_includes(gpus: GpuGres) -> dict[str, str]:
    """Node group -> the MIG fragment its nodes' gres.conf includes, for compute groups with MIG layouts."""
    return {name: mig_vars.SLURM_GRES_CONF for name, (_whole, slices) in gpus.items() if slices}


def partitions(model: Cluster, slurm: Slurm) -> list[dict[str, Any]]:
    out = []
    for name, part in slurm.partitions.items():
        hosts = [h for group in part.node_groups for h in expand_hosts(model.node_groups[group].hosts)]
        out.append(
            {
                "name": name,
                "nodes": _hostlist(list(dict.fromkeys(hosts))),
                "allow_accounts": list(part.allow_accounts),
                "allow_groups": list(part.allow_groups),
                "max_time": part.max_time,
                "default": part.default,
                "priority_tier": part.priority_tier,
                "qos": part.qos or "",
            }
        )
    return out


def checks_partition(rc: ResolvedCluster) -> list[dict[str, Any]]:
    """gpuinfra's own partition of every GPU compute node, for the admission gate's check jobs: root alone may use
    it (root's association needs no account a user partition allows), users never see it, and it ranks below every
    user partition. None without the gate."""
    hosts = [h.name for h in rc.with_role("slurm_compute") if h.gpu_count]
    if not rc.model.health.admission.checks or not hosts:
        return []
    admission = duration_seconds(rc.model.health.admission.timeout)
    return [
        {
            "name": CHECKS_PARTITION,
            "nodes": _hostlist(hosts),
            "root_only": True,
            "hidden": True,
            "max_time": str(-(-admission // 60)),
            "default": False,
            "priority_tier": 0,
        }
    ]


def checks_qos(rc: ResolvedCluster) -> list[str]:
    """gpuinfra's own QoS, which root's check jobs run under so that no limit meant for users holds them (a QoS of
    one GPU per job would keep the gate's job for a node of eight pending); with scheduled checks, theirs too, which
    every other QoS preempts. None without the gate or accounting."""
    slurm = rc.model.slurm
    if not checks_partition(rc) or slurm is None or not slurm.accounting:
        return []
    return [CHECKS_QOS, *([IDLE_CHECKS_QOS] if rc.model.health.admission.every else [])]


def own_qos(name: str) -> Qos:
    """One of gpuinfra's QoS, without limits; a scheduled check job is cancelled when a user job preempts it
    (requeued, it would only wait for the node to be idle again, when the next round starts one anyway)."""
    return Qos(preempt_mode="cancel") if name == IDLE_CHECKS_QOS else Qos()


def qos_list(slurm: Slurm, own: list[str]) -> list[dict[str, Any]]:
    def one(name: str, qos: Qos) -> dict[str, Any]:
        return {
            "name": name,
            "priority": qos.priority,
            "max_gpus_per_user": qos.max_gpus_per_user,
            "max_gpus_per_job": qos.max_gpus_per_job,
            "max_jobs_per_user": qos.max_jobs_per_user,
            "max_wall": qos.max_wall,
            "preempt": list(qos.preempt),
            "preempt_mode": qos.preempt_mode,
            "preempt_grace_s": duration_seconds(qos.preempt_grace) if qos.preempt_grace else 0,
        }

    return [one(name, qos) for name, qos in slurm.qos.items()] + [one(name, own_qos(name)) for name in own]


def accounts(slurm: Slurm) -> list[dict[str, Any]]:
    """Accounts parents first, so each can be created under one that already exists."""

    def one(name: str, account: Account) -> dict[str, Any]:
        return {
            "name": name,
            "parent": account.parent or "root",
            "description": account.description or name,
            "fairshare": account.fairshare,
            "qos": list(account.qos),
            "default_qos": account.default_qos or "",
            "max_gpus": account.max_gpus,
            "users": list(account.users),
        }

    ordered: list[str] = []

    def visit(name: str, path: tuple[str, ...] = ()) -> None:
        parent = slurm.accounts[name].parent
        if parent in slurm.accounts and parent not in ordered and parent not in path:
            visit(parent, (*path, name))
        if name not in ordered:
            ordered.append(name)

    for name in slurm.accounts:
        visit(name)
    return [one(name, slurm.accounts[name]) for name in ordered]


def topology(slurm: Slurm) -> dict[str, Any]:
    """topology.conf: the plugin (tree, block or "" for none) and its lines, with hostlists compressed. Leaves get
    a root switch above them all, so that a job may span leaves unless it asks for fewer switches."""
    if slurm.topology is None:
        return {"plugin": "", "switches": [], "blocks": []}
    leaves, blocks = slurm.topology.leaves, slurm.topology.blocks
    switches: list[dict[str, str]] = [{"name": n, "nodes": _hostlist(expand_hosts(h))} for n, h in leaves.items()]
    if switches:
        switches.append({"name": ROOT_SWITCH, "switches": ",".join(leaves)})
    return {
        "plugin": "tree" if leaves else "block",
        "switches": switches,
        "blocks": [{"name": n, "nodes": _hostlist(expand_hosts(h))} for n, h in blocks.items()],
    }


def def_mem_per_cpu(model: Cluster) -> int:
    """Memory a job gets per CPU unless it asks (DefMemPerCPU): the smallest share of any compute node, so that a
    job without --mem never takes a whole node. 0 (not set) where a node group gives no memory or CPUs."""
    shares = [g.memory_mb // g.cpus if g.memory_mb and g.cpus else 0 for g in _compute_groups(model).values()]
    return min(shares) if shares and all(shares) else 0


def job_mapping_dir(model: Cluster) -> str:
    """The folder the prolog writes GPU-to-job files to: the one dcgm-exporter reads
    (`monitoring.dcgm_exporter.job_mapping_dir`) where it runs on the Slurm cluster's GPU nodes, else ""."""
    monitoring = model.monitoring
    return monitoring.dcgm_exporter.job_mapping_dir if "dcgm_exporter" in monitoring.components else ""


def containers_vars(rc: ResolvedCluster) -> dict[str, Any]:
    """The slurm_containers_build and slurm_containers roles' settings: the catalog's pinned sources, the host that
    builds (the Slurm controller, where no job runs: validation sees to it), and the cluster's own package folder on
    the controller for its OS release (validation keeps a cluster's Slurm hosts on one)."""
    slurm = rc.model.slurm
    if slurm is None or slurm.containers is None:
        return {}
    containers = slurm.containers
    sources = {source.file: source for source in catalog.CONTAINER_SOURCES}
    versions = dict(name.removesuffix(".tar.gz").rsplit("-", 1) for name in sources)
    enroot, makeself, pyxis = versions["enroot"], versions["makeself"], versions["pyxis"]
    hosts = containers_hosts(rc)
    release = catalog.os_release(rc.hosts[hosts[0]].os) if hosts else None
    codename = release.codename if release else "{{ ansible_facts['distribution_release'] }}"  # Ubuntu: from facts
    packages = f"{PACKAGE_CACHE}/{rc.model.name}/{codename}/enroot-{enroot}_pyxis-{pyxis}"
    controllers = [host.name for host in rc.hosts.values() if CONTROLLER_ROLE in host.roles]
    return {
        "slurm_containers_build_sources": containers.sources,
        "slurm_containers_build_checksums": {name: source.sha256 for name, source in sources.items()},
        "slurm_containers_build_enroot_version": enroot,
        "slurm_containers_build_pyxis_version": pyxis,
        "slurm_containers_build_makeself_commit": makeself,
        "slurm_containers_build_dest": packages,
        "slurm_containers_build_host": controllers[0] if controllers else "",
        "slurm_containers_packages_dir": packages,
        "slurm_containers_cgroups_hook": slurm.cgroups,
        "slurm_containers_data_path": containers.data_path,
        "slurm_containers_cache_path": containers.cache_path,
    }


def group_vars(rc: ResolvedCluster) -> dict[str, Any]:
    model = rc.model
    slurm = model.slurm
    if slurm is None:
        return {}
    cluster = slurm.cluster_name or model.name
    priority = slurm.priority
    mapping = job_mapping_dir(model)
    health_check = HEALTH_CHECK_PROGRAM if model.health.check.enabled else ""
    gpus = gpu_gres(rc)
    own_qos_names = checks_qos(rc)
    return {
        "slurm_common_cluster_name": cluster,
        "slurm_common_nodes": nodes(rc, gpus),
        "slurm_common_extra_config": dict(slurm.extra_config),
        "slurm_common_partitions": partitions(model, slurm) + checks_partition(rc),
        "slurm_common_gres": gres(rc, gpus),
        "slurm_common_gres_includes": mig_gres_includes(gpus),
        "slurm_common_gres_autodetect": slurm.gres_autodetect,
        "slurm_common_cgroup": slurm.cgroups,
        "slurm_common_accounting": slurm.accounting,
        "slurm_common_priority": {
            "weight_fairshare": priority.weight_fairshare,
            "weight_age": priority.weight_age,
            "weight_qos": priority.weight_qos,
            "weight_partition": priority.weight_partition,
            "weight_job_size": priority.weight_job_size,
            "decay_half_life": priority.decay_half_life,
        },
        "slurm_common_preempt_mode": slurm.preempt_mode,
        "slurm_common_topology": topology(slurm),
        "slurm_common_release": rc.slurm_release(),
        "slurm_common_def_mem_per_cpu": def_mem_per_cpu(model),
        "slurm_common_health_check_program": health_check,
        "slurm_common_health_check_interval": duration_seconds(model.health.check.interval),
        "slurm_common_health_check_on_job_start": model.health.check.on_job_start,
        "slurm_common_configless": slurm.configless,
        "slurm_common_containers": slurm.containers is not None,
        **containers_vars(rc),
        "slurm_compute_gres_autodetect": slurm.gres_autodetect,
        "slurm_compute_job_mapping_dir": mapping,
        "slurm_compute_health_check_program": health_check,
        "slurm_compute_health_check_on_job_start": model.health.check.on_job_start,
        "slurm_accounting_cluster_name": cluster,
        "slurm_accounting_qos": qos_list(slurm, own_qos_names),
        "slurm_accounting_accounts": accounts(slurm),
        "slurm_accounting_root_qos": own_qos_names,
        "slurm_accounting_preemptible": [q for q in own_qos_names if q == IDLE_CHECKS_QOS],
    }


CONCERN = Concern("slurm", ARTIFACTS, group_vars, node_group_vars=node_group_vars, inventory_groups=inventory_groups)
