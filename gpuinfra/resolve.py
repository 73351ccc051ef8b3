"""Expand the cluster file into per-host facts: hostlists, addresses, roles, GPUs and MIG layouts per GPU.

Everything here is derived from the file alone; nothing touches a host.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from . import catalog
from .hostlists import expand_hosts
from .model import SLURM_ROLES, Cluster, NodeGroup


def expand_gpu_indices(selector: str, count: int) -> list[int]:
    """`all`, `0-3` or `0,2,4-5` -> sorted GPU indices (may name indices >= count; checks report those). The
    selector's grammar bounds every index, so this never builds a large range."""
    if selector == "all":
        return list(range(count))
    indices: set[int] = set()
    for part in selector.split(","):
        lo, _, hi = part.partition("-")
        indices.update(range(int(lo), int(hi or lo) + 1))
    return sorted(indices)


@dataclass(frozen=True)
class Host:
    name: str
    group: str
    address: str
    roles: tuple[str, ...]
    os: str
    gpu_model: str | None
    gpu_count: int
    nvswitch: bool
    # GPU index -> MIG layout name; GPUs without an entry keep MIG disabled.
    mig_layouts: dict[int, str] = field(default_factory=dict)
    # Device nodes without hardware (the sandbox): see Gpu.emulated.
    gpu_emulated: bool = False


@dataclass(frozen=True)
class ResolvedCluster:
    model: Cluster
    hosts: dict[str, Host]
    layouts: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    """MIG layout name -> {profile: count}: those of the cluster's mig-parted file, then the inline ones."""

    def with_role(self, role: str) -> list[Host]:
        return [h for h in self.hosts.values() if role in h.roles]

    @property
    def gpu_hosts(self) -> list[Host]:
        return [h for h in self.hosts.values() if h.gpu_count]

    def slurm_release(self) -> str:
        """The oldest Slurm release among the Slurm hosts, by the OS archives gpuinfra knows; "" where one runs an
        OS without those facts."""
        releases = []
        for host in self.hosts.values():
            if SLURM_ROLES & set(host.roles):
                release = catalog.os_release(host.os)
                if release is None:
                    return ""
                releases.append(release.slurm_release)
        return min(releases, key=catalog.SLURM_RELEASES.index, default="")


def _group_hosts(name: str, group: NodeGroup, cluster: Cluster) -> list[Host]:
    gpu_count = group.gpu.count if group.gpu else 0
    mig: dict[int, str] = {}
    for assignment in group.mig:
        for index in expand_gpu_indices(assignment.gpus, gpu_count):
            mig[index] = assignment.layout
    return [
        Host(
            name=host,
            group=name,
            address=group.addresses.get(host, host),
            roles=tuple(group.roles),
            os=group.os or cluster.os,
            gpu_model=group.gpu.model if group.gpu else None,
            gpu_count=gpu_count,
            nvswitch=bool(group.gpu and group.gpu.nvswitch),
            mig_layouts=mig,
            gpu_emulated=bool(group.gpu and group.gpu.emulated),
        )
        for host in expand_hosts(group.hosts)
    ]


def resolve(cluster: Cluster, parted_layouts: Mapping[str, Mapping[str, int]] | None = None) -> ResolvedCluster:
    """Per-host facts, in file order. A host listed in two groups keeps its first group (checks report it).
    `parted_layouts` are those read from the cluster's mig-parted file when it was validated."""
    hosts: dict[str, Host] = {}
    for name, group in cluster.node_groups.items():
        for host in _group_hosts(name, group, cluster):
            hosts.setdefault(host.name, host)
    layouts = {**(parted_layouts or {}), **{name: dict(p) for name, p in cluster.mig.layouts.items()}}
    return ResolvedCluster(model=cluster, hosts=hosts, layouts=layouts)
