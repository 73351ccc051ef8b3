"""Slurm rules: one controller, partitions name real groups, accounts and QoS; the account tree and the QoS
preemption graph have no cycles; limits fit the cluster's GPUs; the OS releases of the Slurm hosts carry Slurm
releases that talk to each other."""

from __future__ import annotations

import hashlib
from pathlib import Path

from .. import catalog
from ..hostlists import HostlistError, expand_hosts
from ..limits import MAX_SOURCE_BYTES
from ..model import SLURM_ROLES, Cluster
from ..model.slurm import ROOT_SWITCH
from ..resolve import Host, ResolvedCluster
from .diagnostics import Diagnostics, suggest


def check(rc: ResolvedCluster, report: Diagnostics) -> None:
    model = rc.model
    slurm = model.slurm
    _scheduled_checks(model, report)
    if slurm is None:
        used = {role for host in rc.hosts.values() for role in host.roles} & SLURM_ROLES
        if used:
            report.error(
                ("node_groups",),
                f"hosts have Slurm roles ({', '.join(sorted(used))}) but there is no "
                "`slurm:` section; add one with at least one partition",
            )
        return
    controllers = rc.with_role("slurm_controller")
    if len(controllers) != 1:
        names = ", ".join(h.name for h in controllers) or "none"
        report.error(("slurm",), f"needs exactly one host with the slurm_controller role (found {names})")
    if slurm.accounting and not rc.with_role("slurm_dbd"):
        report.error(("slurm", "accounting"), "needs a host with the slurm_dbd role; add one or set accounting: false")
    _partitions(model, report)
    _shards(model, report)
    _topology(rc, report)
    _qos(model, report)
    _accounts(model, report)
    _capacity(rc, report)
    _releases(rc, report)
    _containers(model, report)


def _scheduled_checks(model: Cluster, report: Diagnostics) -> None:
    """Scheduled checks are jobs in a QoS every user QoS may preempt: they need the checks, Slurm, its accounting
    (QoS live there) and preemption."""
    admission = model.health.admission
    if admission.every is None:
        return
    where = ("health", "admission", "every")
    slurm = model.slurm
    if not admission.checks:
        report.error(where, "names no check to run: list them in health.admission.checks")
    if slurm is None:
        report.error(where, "scheduled checks run as Slurm jobs, and this cluster has no `slurm:` section")
    elif not slurm.accounting:
        report.error(where, "needs slurm.accounting: the check jobs' QoS, which user jobs preempt, lives there")
    elif slurm.preempt_mode == "off":
        report.error(where, "needs preemption, so that a user job never waits for a check job: set slurm.preempt_mode")


def _shards(model: Cluster, report: Diagnostics) -> None:
    """gres/shard shares whole GPUs among Slurm jobs: a group that shards its GPUs must be a Slurm compute group
    whose GPUs are whole."""
    for name, group in model.node_groups.items():
        if group.gpu is None or group.gpu.shards is None:
            continue
        where = ("node_groups", name, "gpu", "shards")
        if "slurm_compute" not in group.roles:
            report.error(where, "shards are Slurm's GPU sharing, and this group has no slurm_compute role")
        if group.mig:
            report.error(where, "shards share whole GPUs, and this group's GPUs are MIG slices (mig:): choose one")


# topology/block arrived in Slurm 23.11.
BLOCKS_SINCE = "23.11"


def _topology(rc: ResolvedCluster, report: Diagnostics) -> None:
    """Each Slurm compute host sits under exactly one leaf (or in one block), and a leaf names only those hosts:
    slurmctld cannot place a node that no switch reaches, and a node under two switches is ambiguous."""
    assert rc.model.slurm is not None
    topology = rc.model.slurm.topology
    if topology is None:
        return
    where = ("slurm", "topology")
    if topology.leaves and topology.blocks:
        report.error(where, "one kind of topology per cluster: leaves (topology/tree) or blocks (topology/block)")
        return
    kind, members = ("leaves", topology.leaves) if topology.leaves else ("blocks", topology.blocks)
    if not members:
        report.error(where, "give the leaf switches (leaves:) or the NVLink blocks (blocks:) and their hosts")
        return
    release = rc.slurm_release()
    if (
        kind == "blocks"
        and release
        and catalog.SLURM_RELEASES.index(release) < catalog.SLURM_RELEASES.index(BLOCKS_SINCE)
    ):
        report.error((*where, kind), f"blocks need Slurm {BLOCKS_SINCE} or later; this cluster's Slurm is {release}")
    if kind == "leaves" and ROOT_SWITCH in members:
        report.error((*where, kind, ROOT_SWITCH), f"{ROOT_SWITCH!r} is the switch gpuinfra puts above the leaves")
    compute = {host.name for host in rc.with_role("slurm_compute")}
    placed: dict[str, str] = {}
    for name, hosts in members.items():
        try:
            names = expand_hosts(hosts)
        except HostlistError as exc:
            report.error((*where, kind, name), str(exc))
            continue
        for host in names:
            if host not in compute:
                what = "is not a Slurm compute host" if host in rc.hosts else "is not a host of this cluster"
                report.error((*where, kind, name), f"{host} {what}; {suggest(host, sorted(compute))}")
            elif host in placed:
                report.error((*where, kind, name), f"{host} is already under {placed[host]!r}: a host sits in one")
            else:
                placed[host] = name
    missing = sorted(compute - set(placed))
    if missing:
        report.error(
            (*where, kind),
            f"every Slurm compute host must be placed, and {len(missing)} are not: {', '.join(missing[:5])}"
            + (" ..." if len(missing) > 5 else ""),
        )


def _partitions(model: Cluster, report: Diagnostics) -> None:
    assert model.slurm is not None
    slurm = model.slurm
    compute_groups = [n for n, g in model.node_groups.items() if "slurm_compute" in g.roles]
    defaults = [name for name, p in slurm.partitions.items() if p.default]
    if len(defaults) > 1:
        report.error(
            ("slurm", "partitions", defaults[1], "default"),
            f"only one partition can be the default (also: {defaults[0]!r})",
        )
    for name, part in slurm.partitions.items():
        for i, group in enumerate(part.node_groups):
            if group not in compute_groups:
                what = "has no slurm_compute role" if group in model.node_groups else "is not a node group"
                report.error(
                    ("slurm", "partitions", name, "node_groups", i),
                    f"{group!r} {what}; {suggest(group, compute_groups)}",
                )
        for i, account_name in enumerate(part.allow_accounts):
            if account_name not in slurm.accounts:
                report.error(
                    ("slurm", "partitions", name, "allow_accounts", i),
                    f"account {account_name!r} is not defined under slurm.accounts; "
                    f"{suggest(account_name, list(slurm.accounts))}",
                )
        if part.qos and part.qos not in slurm.qos:
            report.error(
                ("slurm", "partitions", name, "qos"),
                f"QoS {part.qos!r} is not defined under slurm.qos; {suggest(part.qos, list(slurm.qos))}",
            )


def _qos(model: Cluster, report: Diagnostics) -> None:
    assert model.slurm is not None
    slurm = model.slurm
    for name, qos in slurm.qos.items():
        for i, other in enumerate(qos.preempt):
            if other == name:
                report.error(("slurm", "qos", name, "preempt", i), "a QoS cannot preempt its own jobs")
            elif other not in slurm.qos:
                report.error(
                    ("slurm", "qos", name, "preempt", i),
                    f"QoS {other!r} is not defined; {suggest(other, list(slurm.qos))}",
                )
        if qos.preempt and slurm.preempt_mode == "off":
            report.warning(
                ("slurm", "qos", name, "preempt"),
                "preemption is off cluster-wide (slurm.preempt_mode: off), so this has no effect",
            )
    graph = {name: [o for o in qos.preempt if o in slurm.qos and o != name] for name, qos in slurm.qos.items()}
    for cycle in _cycles(graph):
        report.error(
            ("slurm", "qos", cycle[0], "preempt"),
            f"QoS preempt each other in a cycle: {' -> '.join([*cycle, cycle[0]])}; "
            "jobs would preempt each other back and forth",
        )


def _cycles(graph: dict[str, list[str]]) -> list[list[str]]:
    """One cycle per strongly connected group of nodes that reach themselves, each listed from its first node in
    file order (a depth-first search that reports a back edge once per group)."""
    order = {name: i for i, name in enumerate(graph)}
    state: dict[str, str] = {}
    found: list[list[str]] = []
    reported: set[str] = set()

    def visit(node: str, path: list[str]) -> None:
        state[node] = "open"
        path.append(node)
        for nxt in graph[node]:
            if state.get(nxt) == "open":
                cycle = path[path.index(nxt) :]
                if not reported & set(cycle):
                    start = min(cycle, key=order.__getitem__)
                    i = cycle.index(start)
                    found.append(cycle[i:] + cycle[:i])
                    reported.update(cycle)
            elif nxt not in state:
                visit(nxt, path)
        path.pop()
        state[node] = "done"

    for node in graph:
        if node not in state:
            visit(node, [])
    return found


def _accounts(model: Cluster, report: Diagnostics) -> None:
    assert model.slurm is not None
    slurm = model.slurm
    for name, account in slurm.accounts.items():
        if account.parent and account.parent not in slurm.accounts:
            report.error(
                ("slurm", "accounts", name, "parent"),
                f"account {account.parent!r} is not defined; {suggest(account.parent, list(slurm.accounts))}",
            )
        for i, qos_name in enumerate(account.qos):
            if qos_name not in slurm.qos:
                report.error(
                    ("slurm", "accounts", name, "qos", i),
                    f"QoS {qos_name!r} is not defined under slurm.qos; {suggest(qos_name, list(slurm.qos))}",
                )
        if account.default_qos and account.default_qos not in account.qos:
            report.error(
                ("slurm", "accounts", name, "default_qos"),
                f"{account.default_qos!r} must also be listed in this account's qos",
            )
    parents = {name: [a.parent] if a.parent in slurm.accounts else [] for name, a in slurm.accounts.items()}
    for cycle in _cycles(parents):
        report.error(
            ("slurm", "accounts", cycle[0], "parent"), f"accounts form a cycle: {' -> '.join([*cycle, cycle[0]])}"
        )


def _capacity(rc: ResolvedCluster, report: Diagnostics) -> None:
    assert rc.model.slurm is not None
    slurm = rc.model.slurm
    capacity = sum(h.gpu_count for h in rc.with_role("slurm_compute"))
    for name, qos in slurm.qos.items():
        for key, limit in (("max_gpus_per_user", qos.max_gpus_per_user), ("max_gpus_per_job", qos.max_gpus_per_job)):
            if limit and limit > capacity:
                report.warning(
                    ("slurm", "qos", name, key), f"{limit} GPUs is more than the cluster's {capacity} Slurm GPUs"
                )
    for name, account in slurm.accounts.items():
        if account.max_gpus and account.max_gpus > capacity:
            report.warning(
                ("slurm", "accounts", name, "max_gpus"),
                f"{account.max_gpus} GPUs is more than the cluster's {capacity} Slurm GPUs",
            )


def _releases(rc: ResolvedCluster, report: Diagnostics) -> None:
    """Each Slurm host runs the Slurm of its OS archive: slurmdbd must accept slurmctld, and slurmctld every other
    Slurm host (slurmd, the commands of a login node). Hosts on an OS without archive facts are not checked."""
    model = rc.model

    def release(host: Host) -> catalog.OsRelease | None:
        return catalog.os_release(host.os)

    def loc(host: Host) -> tuple[str, ...]:
        return ("node_groups", host.group, "os") if model.node_groups[host.group].os else ("os",)

    def check_pair(newer: Host, what: str, older: Host, other: str) -> None:
        new, old = release(newer), release(older)
        if new is None or old is None or catalog.slurm_compatible(new.slurm_release, old.slurm_release):
            return
        seen = (older.group, newer.group)
        if seen in reported:
            return
        reported.add(seen)
        report.error(
            loc(older),
            f"node group {older.group!r} ({other}) runs {old.title}'s Slurm {old.slurm_release}, and its {what} "
            f"(node group {newer.group!r}) {new.title}'s Slurm {new.slurm_release}: {what} must be as new as "
            f"{other} and at most two releases newer (three from 24.11); put the Slurm hosts on one OS release",
        )

    reported: set[tuple[str, str]] = set()
    controllers = rc.with_role("slurm_controller")
    if len(controllers) != 1:
        return  # reported by check()
    controller = controllers[0]
    for dbd in rc.with_role("slurm_dbd"):
        check_pair(dbd, "slurmdbd", controller, "slurmctld")
    for host in rc.hosts.values():
        if host is not controller and {"slurm_compute", "slurm_login"} & set(host.roles):
            check_pair(
                controller, "slurmctld", host, "slurmd" if "slurm_compute" in host.roles else "the Slurm commands"
            )


def _containers(model: Cluster, report: Diagnostics) -> None:
    """The folder of release sources holds each pinned tarball, with its pinned checksum: a wrong file fails here,
    before any host is touched, not in the middle of a build."""
    slurm = model.slurm
    if slurm is None or slurm.containers is None:
        return
    real_gpus = any(
        group.gpu and not group.gpu.emulated and "slurm_compute" in group.roles for group in model.node_groups.values()
    )
    if real_gpus and not model.container_toolkit.install:
        report.warning(
            ("slurm", "containers"),
            "the container toolkit is not installed (container_toolkit.install: false), so enroot's GPU hook has "
            "no nvidia-container-cli: images that ask for GPUs (NGC's) fail to start",
        )
    builders = [g for g in model.node_groups.values() if "slurm_controller" in g.roles]
    if builders and "slurm_compute" in builders[0].roles:
        report.error(
            ("slurm", "containers"),
            "enroot and pyxis are built on the Slurm controller, where no job may run: its node group also has "
            "slurm_compute, whose job users could poison the packages every Slurm host installs as root; move "
            "slurm_compute to other hosts",
        )
    where = ("slurm", "containers", "sources")
    folder = Path(slurm.containers.sources)  # absolute: see load.absolute_paths
    if not folder.is_dir():
        report.error(where, f"{folder} is not a folder; give the folder that holds {_source_names()}")
        return
    for source in catalog.CONTAINER_SOURCES:
        path = folder / source.file
        if not path.is_file():
            report.error(where, f"{path} is missing; download it from {source.url}")
            continue
        if path.stat().st_size > MAX_SOURCE_BYTES:
            report.error(where, f"{path} is over {MAX_SOURCE_BYTES // 1024} KiB; it is not the pinned release")
            continue
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        if digest != source.sha256:
            report.error(where, f"{path} has sha256 {digest}, not the pinned {source.sha256} ({source.url})")


def _source_names() -> str:
    return ", ".join(source.file for source in catalog.CONTAINER_SOURCES)
