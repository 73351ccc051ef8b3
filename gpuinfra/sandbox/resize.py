"""A sandbox cluster file with another number of GPU nodes (`gpuinfra sandbox up --gpu-nodes N`).

The cluster file stays the single source of truth: the resized cluster is a new file, written into the sandbox's
state folder beside its keys, which `up` then brings up and `apply` converges. It is the given file with its one
emulated GPU node group holding N hosts, named and addressed on from the group's first host (gpu01 at .11 gives
gpu01..gpuNN at .11 onwards); comments and everything else are kept as written, but for a Slurm topology, where
the new hosts join the leaf (or block) of the group's last host and the hosts taken away leave theirs.
"""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path
from typing import Any

import hostlist
from ruamel.yaml import YAML

from ..hostlists import expand_hosts
from ..validate.load import load_cluster
from .spec import SandboxConfigError, check_state_folder, sandbox_spec

MAX_GPU_NODES = 200
# How resized files are named in the state folder, so that `down` removes them with the keys.
SUFFIX = "-gpu-nodes.yml"


def resized(path: str | Path, gpu_nodes: int, image: str | None = None) -> Path:
    """Write the cluster file of `path` with `gpu_nodes` emulated GPU nodes; return the new file's path."""
    source = Path(path)
    if not 1 <= gpu_nodes <= MAX_GPU_NODES:
        raise SandboxConfigError(f"--gpu-nodes must be 1 to {MAX_GPU_NODES}, not {gpu_nodes}")
    loaded = load_cluster(source)
    spec = sandbox_spec(loaded, image)  # the given file must itself describe a sandbox
    check_state_folder(spec, source)
    groups = [name for name, group in loaded.model.node_groups.items() if group.gpu and group.gpu.emulated]
    if len(groups) != 1:
        raise SandboxConfigError(
            f"{source}: --gpu-nodes needs exactly one node group with emulated GPUs, found {len(groups) or 'none'}"
        )
    (group,) = groups
    first = next(h for h in loaded.resolved.hosts.values() if h.group == group)
    match = re.fullmatch(r"(.*?)(\d+)", first.name)
    if match is None:
        raise SandboxConfigError(f"{source}: --gpu-nodes numbers hosts on from {first.name!r}, which has no number")
    prefix, digits = match.groups()
    start, width = int(digits), max(len(digits), len(str(int(digits) + gpu_nodes - 1)))
    names = [f"{prefix}{start + i:0{width}d}" for i in range(gpu_nodes)]
    base = ipaddress.IPv4Address(first.address)
    addresses = {name: str(base + i) for i, name in enumerate(names)}
    subnet = ipaddress.IPv4Network(spec.subnet)
    last = base + gpu_nodes - 1  # the addresses run on from the first, which is in the subnet
    taken = {c.address for c in spec.containers if loaded.resolved.hosts[c.host].group != group}
    if last not in subnet or last == subnet.broadcast_address or not taken.isdisjoint(addresses.values()):
        raise SandboxConfigError(f"{source}: {gpu_nodes} GPU nodes from {base} do not fit in {subnet} beside its hosts")

    yaml = YAML()
    data: Any = yaml.load(source.read_text())
    entry = data["node_groups"][group]
    entry["hosts"] = f"{prefix}[{names[0][len(prefix) :]}-{names[-1][len(prefix) :]}]"
    entry["addresses"] = addresses
    old = [h.name for h in loaded.resolved.hosts.values() if h.group == group]
    topology = (data.get("slurm") or {}).get("topology") or {}
    for kind in ("leaves", "blocks"):
        if topology.get(kind):
            _place(topology[kind], old, names)
    # As the source file resolves them (relative to its folder), since the new file lives elsewhere.
    data["connection"]["ssh_key"] = str(spec.ssh_key)
    data["connection"]["known_hosts_file"] = str(spec.known_hosts)
    containers = loaded.model.slurm.containers if loaded.model.slurm else None
    if containers is not None:
        data["slurm"]["containers"]["sources"] = containers.sources
    out = spec.state_dir / f"{source.stem}-{gpu_nodes}{SUFFIX}"
    out.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    with out.open("w") as fh:
        yaml.dump(data, fh)
    return out


def _place(members: dict[str, Any], old: list[str], new: list[str]) -> None:
    """Rewrite a topology's leaves or blocks for the group's new hosts: those gone leave, and those added join the
    member that holds the group's last old host; a member left with no host goes."""
    added, gone = [n for n in new if n not in old], set(old) - set(new)
    home = next((name for name, hosts in members.items() if old[-1] in expand_hosts(hosts)), None)
    for name, hosts in list(members.items()):
        kept = [h for h in expand_hosts(hosts) if h not in gone] + (added if name == home else [])
        if kept:
            members[name] = hostlist.collect_hostlist(kept)
        else:
            del members[name]
