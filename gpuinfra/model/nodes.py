"""Connection settings and node groups: which hosts exist, what hardware they have, what they do."""

from __future__ import annotations

from typing import Annotated, Literal, get_args

from pydantic import Field

from .base import Model
from .grammar import (
    AbsolutePath,
    Address,
    ControllerPath,
    GpuModelName,
    GpuSelector,
    Hostname,
    Hosts,
    LabelKey,
    LabelValue,
    LayoutName,
    Port,
    PositiveInt,
    UnixName,
)

# What a host does. Roles become Ansible inventory groups; hosts never carry role booleans.
Role = Literal[
    "slurm_controller", "slurm_dbd", "slurm_login", "slurm_compute", "k8s_control", "k8s_gpu_worker", "monitoring"
]
ROLES: tuple[str, ...] = get_args(Role)
SLURM_ROLES = frozenset(role for role in ROLES if role.startswith("slurm_"))


OperatingSystem = Literal["debian12", "debian13", "ubuntu22.04", "ubuntu24.04", "rhel9"]


class Bastion(Model):
    host: Address
    """Address of the jump host every SSH connection goes through."""
    user: UnixName | None = None
    port: Port = 22


class Connection(Model):
    user: UnixName = "root"
    """Remote user Ansible logs in as; privilege escalation uses sudo when it is not root."""
    port: Port = 22
    ssh_key: ControllerPath | None = None
    """Private key file; relative paths are taken from the cluster file's folder."""
    bastion: Bastion | None = None
    host_key_checking: bool = True
    """Keep SSH host key checking on unless the fleet's keys are managed elsewhere."""
    known_hosts_file: ControllerPath | None = None
    python_interpreter: AbsolutePath = "/usr/bin/python3"


class Gpu(Model):
    model: GpuModelName
    """GPU model name from the catalog, e.g. H100-SXM5-80GB (see `gpuinfra schema`)."""
    count: Annotated[int, Field(ge=1, le=16)]
    """GPUs per host."""
    nvswitch: bool = False
    """HGX/DGX boards with NVSwitch need the fabric manager at exactly the driver version."""
    emulated: bool = False
    """Device nodes without hardware, as in the sandbox: the driver is installed and its DKMS module built, but not
    loaded; checks that need nvidia-smi are skipped with that reason."""
    shards: Annotated[int, Field(ge=2, le=128)] | None = None
    """Slurm GPU sharing: each whole GPU is also offered as this many gres/shard, so that that many jobs asking for
    `--gres=shard:1` can share it. A GPU given whole to a job has none of its shards free, and the reverse."""


class Taint(Model):
    key: LabelKey
    value: LabelValue = ""
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] = "NoSchedule"


class MigAssignment(Model):
    gpus: GpuSelector = "all"
    """GPU indices the layout applies to: `all`, `0-3`, or `0,2,4-5`."""
    layout: LayoutName
    """Name of a layout under `mig.layouts`, or of a config in `mig.parted_file`."""


class NodeGroup(Model):
    hosts: Hosts
    """Hostlist expression(s), e.g. `gpu[01-16]` or `[ctl01, login01]`."""
    addresses: dict[Hostname, Address] = {}
    """Address to reach each host at, when its name does not resolve."""
    roles: Annotated[list[Role], Field(min_length=1)]
    os: OperatingSystem | None = None
    """Overrides the cluster's `os` for this group."""
    gpu: Gpu | None = None
    cpus: PositiveInt | None = None
    """Logical CPUs per host (Slurm CPUs=)."""
    sockets: PositiveInt | None = None
    cores_per_socket: PositiveInt | None = None
    threads_per_core: PositiveInt | None = None
    memory_mb: PositiveInt | None = None
    """Memory per host Slurm may hand out (RealMemory=), in MiB."""
    mig: list[MigAssignment] = []
    """MIG layouts per GPU index range."""
    labels: dict[LabelKey, LabelValue] = {}
    """Kubernetes node labels for this group."""
    taints: list[Taint] = []
    """Kubernetes node taints for this group (in addition to `kubernetes.gpu_node_taints`)."""
