"""Variables of the mig role: the mig-parted configuration, each node group's config, and Slurm's MIG GRES.

One mig-parted v1 configuration serves the whole cluster; each host applies one config of it:
- a node group whose GPUs all carry the same layout applies the config named after that layout;
- a node group with different layouts on different GPUs applies a config named after the group, which lists each
  GPU range with its layout and disables MIG on the GPUs no layout covers;
- `all-disabled` turns MIG off everywhere.

The entries of every layout come from `gpuinfra.mig_layouts.render_parted`, so each carries the device filter (PCI IDs)
of the GPU model it was checked against. The GPU Operator's MIG manager reads the same configuration
(`kubernetes.py` beside this module).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

from ... import catalog
from ... import mig_layouts as mig
from ...k8s_resources import WORKER_ROLE
from ...resolve import Host, ResolvedCluster
from ..artifacts import Artifact
from . import HOST_LEFT_OUT
from .concern import Concern

# The mig role runs on GPU hosts outside Kubernetes, in practice Slurm compute nodes; on k8s_gpu_worker hosts the
# GPU Operator's MIG manager applies the layouts (kubernetes.py). config.yaml and the service are the same for every
# host; mig.env names the host's own configuration, here the first compute node's.
ARTIFACTS: tuple[Artifact, ...] = (
    Artifact("mig/config.yaml", "mig", "config.yaml.j2", "slurm_compute"),
    Artifact("mig/gpuinfra-mig.service", "mig", "gpuinfra-mig.service.j2", "slurm_compute"),
    Artifact("mig/mig.env", "mig", "mig.env.j2", "slurm_compute"),
)

ALL_DISABLED = "all-disabled"
# The gres.conf fragment of a Slurm node's MIG slices: the mig role writes it, slurm_common's gres.conf includes it.
SLURM_GRES_CONF = "/etc/slurm/gres-mig.conf"


def layouts(rc: ResolvedCluster) -> dict[str, dict[str, int]]:
    """Layout name -> {profile: count}: those of the cluster's mig-parted file (read once, when it was validated)
    and the inline ones."""
    return {name: dict(profiles) for name, profiles in rc.layouts.items()}


def _group_hosts(hosts: Iterable[Host]) -> dict[str, Host]:
    """One host per node group (every host of a group has the same GPUs and layouts), in file order."""
    out: dict[str, Host] = {}
    for host in hosts:
        if host.mig_layouts and host.gpu_model:
            out.setdefault(host.group, host)
    return out


def _uniform(host: Host) -> str | None:
    """The layout every GPU of the host carries, if there is one."""
    names = {host.mig_layouts.get(index) for index in range(host.gpu_count)}
    return names.pop() if len(names) == 1 and None not in names else None


def _config_name(host: Host, known: dict[str, dict[str, int]]) -> str:
    uniform = _uniform(host)
    if uniform is not None:
        return uniform
    return host.group if host.group not in known and host.group != ALL_DISABLED else f"{host.group}-layouts"


def host_configs(rc: ResolvedCluster, hosts: Iterable[Host]) -> dict[str, str]:
    """Host name -> the config it applies, for hosts with MIG layouts; MIG-capable hosts without any get
    `all-disabled`, so that removing a layout from the file turns MIG off again."""
    known = layouts(rc)
    out: dict[str, str] = {}
    for host in hosts:
        if host.mig_layouts and host.gpu_model:
            out[host.name] = _config_name(host, known)
        elif host.gpu_model:
            spec = catalog.lookup(host.gpu_model)
            if spec is not None and spec.mig_capable:
                out[host.name] = ALL_DISABLED
    return out


def group_configs(rc: ResolvedCluster, hosts: Iterable[Host]) -> dict[str, str]:
    """Node group -> the config its hosts apply."""
    known = layouts(rc)
    return {group: _config_name(host, known) for group, host in _group_hosts(hosts).items()}


def parted_config(rc: ResolvedCluster, hosts: Iterable[Host]) -> dict[str, Any]:
    """The mig-parted v1 configuration for these hosts: `all-disabled`, every layout they use (for each GPU model
    that uses it) and one composed config per node group with different layouts on different GPUs."""
    known = layouts(rc)
    groups = _group_hosts(hosts)
    models_of: dict[str, list[str]] = {}
    for host in groups.values():
        for name in sorted(set(host.mig_layouts.values())):
            models = models_of.setdefault(name, [])
            if host.gpu_model and host.gpu_model not in models:
                models.append(host.gpu_model)
    configs: dict[str, list[dict[str, Any]]] = {ALL_DISABLED: [{"devices": "all", "mig-enabled": False}]}
    for name, models in models_of.items():
        if name in known:
            rendered = mig.render_parted({name: known[name]}, models)
            configs[name] = rendered["mig-configs"][name]
    for host in groups.values():
        if _uniform(host) is not None or host.gpu_model is None:
            continue
        entries: list[dict[str, Any]] = []
        by_layout: dict[str, list[int]] = {}
        for index in range(host.gpu_count):
            layout = host.mig_layouts.get(index)
            if layout is not None:
                by_layout.setdefault(layout, []).append(index)
        for layout, indices in by_layout.items():
            if layout not in known:
                continue
            rendered = mig.render_parted({layout: known[layout]}, [host.gpu_model])
            for entry in rendered["mig-configs"][layout]:
                entries.append({**entry, "devices": indices})
        bare = [i for i in range(host.gpu_count) if i not in host.mig_layouts]
        if bare:
            entries.append({"devices": bare, "mig-enabled": False})
        configs[_config_name(host, known)] = entries
    return {"version": "v1", "mig-configs": configs}


def slurm_gres(rc: ResolvedCluster, hosts: Iterable[Host]) -> dict[str, list[dict[str, Any]]]:
    """Node group -> [{type, count, files}]: the MIG GRES each host of the group has, per profile.

    `type` is the MIG profile (Slurm's GRES type), `count` the slices of that profile on one host, and `files` the
    device files of the GPUs those slices live on. The per-slice capability device files are only known once the
    driver has created the instances; the mig role's fragment generator writes them on the host.
    """
    known = layouts(rc)
    out: dict[str, list[dict[str, Any]]] = {}
    for group, host in _group_hosts(hosts).items():
        counts: Counter[str] = Counter()
        gpus: dict[str, set[int]] = {}
        for index, layout in sorted(host.mig_layouts.items()):
            for profile, count in known.get(layout, {}).items():
                counts[profile] += count
                gpus.setdefault(profile, set()).add(index)
        out[group] = [
            {"type": profile, "count": counts[profile], "files": [f"/dev/nvidia{i}" for i in sorted(gpus[profile])]}
            for profile in sorted(counts)
        ]
    return out


def mig_hosts(rc: ResolvedCluster) -> list[Host]:
    """Hosts the mig role configures: GPU hosts outside Kubernetes (there the GPU Operator's MIG manager does)."""
    return [h for h in rc.gpu_hosts if WORKER_ROLE not in h.roles]


def group_vars(rc: ResolvedCluster) -> dict[str, Any]:
    hosts = mig_hosts(rc)
    if not any(h.mig_layouts for h in hosts):
        return {}
    return {
        "mig_parted_config": parted_config(rc, hosts),
        "mig_group_configs": group_configs(rc, hosts),
        "mig_slurm_gres": slurm_gres(rc, hosts),
        "mig_slurm_gres_conf": SLURM_GRES_CONF if rc.model.slurm is not None else "",
    }


def host_vars(host: Host) -> dict[str, Any]:
    """A GPU node without layouts, which the mig role leaves alone, is left out of its play: a no-op apply costs
    such a node nothing there. GPUs that are device nodes without hardware (sandbox hosts): the mig role installs
    the configuration and the boot service there but calls neither nvidia-smi nor nvidia-mig-parted."""
    if not host.mig_layouts:
        return {HOST_LEFT_OUT: ["mig"]} if host.gpu_count else {}
    return {"mig_gpu_access": False} if host.gpu_emulated else {}


CONCERN = Concern("mig", ARTIFACTS, group_vars, host_vars=host_vars)
