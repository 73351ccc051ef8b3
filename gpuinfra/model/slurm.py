"""Slurm: partitions, QoS, fair-share, preemption and the accounting tree."""

from __future__ import annotations

import posixpath
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, field_validator, model_validator

from .base import Model
from .grammar import (
    AbsolutePath,
    ControllerPath,
    DecayHalfLife,
    Duration,
    Hosts,
    Name,
    NonNegativeInt,
    PositiveInt,
    SlurmKey,
    SlurmTime,
    SlurmValue,
    Text,
    UnixName,
)

# Slurm keeps a suspended job's GRES: a job waiting for GPUs never suspends one that holds them (seen on slurmctld
# 22.05: the preemptor stays pending for Resources while a cancel or requeue frees the GPUs at once).
NO_SUSPEND = (
    "suspend cannot free GPUs: Slurm keeps a suspended job's GPUs (GRES), so a job waiting for them never preempts "
    "it; use requeue or cancel"
)


# slurm.conf's parameters gpuinfra writes (roles/slurm_common/templates/slurm.conf.j2; a test keeps the two equal),
# each with what sets it: slurm.extra_config may not name them.
OWNED_SLURM_KEYS = {
    **dict.fromkeys(
        ["AccountingStorageEnforce", "AccountingStorageHost", "AccountingStorageTRES", "AccountingStorageType"],
        "slurm.accounting and the node group with the slurm_dbd role",
    ),
    **dict.fromkeys(["AuthType", "CredType"], "gpuinfra (Munge)"),
    "ClusterName": "slurm.cluster_name",
    "DefMemPerCPU": "the node groups' memory_mb and cpus",
    "EnforcePartLimits": "slurm.partitions",
    **dict.fromkeys(["Epilog", "Prolog", "PrologFlags"], "gpuinfra's job scripts (health.check.on_job_start, ...)"),
    "GresTypes": "the node groups' gpu",
    **dict.fromkeys(["HealthCheckInterval", "HealthCheckNodeState", "HealthCheckProgram"], "health.check"),
    **dict.fromkeys(["JobAcctGatherType", "ProctrackType", "TaskPlugin"], "slurm.cgroups"),
    "JobCompType": "slurm.accounting",
    "NodeName": "node_groups",
    "PartitionName": "slurm.partitions",
    **dict.fromkeys(["PreemptMode", "PreemptParameters", "PreemptType"], "slurm.preempt_mode"),
    **dict.fromkeys(
        ["PriorityDecayHalfLife", "PriorityType", "PriorityWeightAge", "PriorityWeightFairshare"], "slurm.priority"
    ),
    **dict.fromkeys(["PriorityWeightJobSize", "PriorityWeightPartition", "PriorityWeightQOS"], "slurm.priority"),
    "ReturnToService": "gpuinfra (the health checks resume their own drains)",
    **dict.fromkeys(["SchedulerParameters", "SchedulerType"], "gpuinfra (nohold_on_prolog_fail, ...)"),
    **dict.fromkeys(["SelectType", "SelectTypeParameters"], "gpuinfra (cons_tres, with GPUs as GRES)"),
    "SlurmctldHost": "the node group with the slurm_controller role",
    **dict.fromkeys(["SlurmUser", "SlurmctldLogFile", "SlurmdLogFile"], "gpuinfra (the Slurm roles)"),
    **dict.fromkeys(["SlurmdSpoolDir", "StateSaveLocation"], "gpuinfra (the Slurm roles)"),
    "SlurmctldParameters": "slurm.configless",
    "TopologyPlugin": "slurm.topology",
}
# Lines that are not parameters, or that would make Slurm read other files.
STRUCTURAL_SLURM_KEYS = ("DownNodes", "FrontendName", "Include", "NodeSet")


def _not_owned(key: str) -> str:
    if key in OWNED_SLURM_KEYS:
        raise ValueError(f"{key} is set from {OWNED_SLURM_KEYS[key]}: set that instead")
    if key in STRUCTURAL_SLURM_KEYS:
        raise ValueError(f"{key} is not a parameter gpuinfra can pass through")
    return key


ExtraSlurmKey = Annotated[SlurmKey, AfterValidator(_not_owned)]


def _refuse_suspend(value: object) -> object:
    if value == "suspend":
        raise ValueError(NO_SUSPEND)
    return value


class Partition(Model):
    node_groups: Annotated[list[Name], Field(min_length=1)]
    """Node groups (with the slurm_compute role) whose hosts form this partition."""
    allow_accounts: list[Name] = []
    """Only these Slurm accounts may submit (AllowAccounts=); empty means all."""
    allow_groups: list[UnixName] = []
    """Only these Unix groups may submit (AllowGroups=); empty means all."""
    max_time: SlurmTime = "UNLIMITED"
    default: bool = False
    priority_tier: Annotated[int, Field(ge=0, le=65533)] = 1
    qos: Name | None = None
    """Partition QoS, whose limits apply to every job in the partition."""


class Qos(Model):
    priority: NonNegativeInt = 0
    max_gpus_per_user: PositiveInt | None = None
    """MaxTRESPerUser=gres/gpu=N."""
    max_gpus_per_job: PositiveInt | None = None
    max_jobs_per_user: PositiveInt | None = None
    max_wall: SlurmTime | None = None
    preempt: list[Name] = []
    """QoS whose jobs this QoS may preempt."""
    preempt_mode: Literal["cancel", "requeue"] | None = None
    preempt_grace: Duration | None = None
    """GraceTime: how long a job of this QoS runs on once chosen for preemption. It gets SIGTERM (or the signal it
    asked for with `--signal`) at once, to write a checkpoint, and is requeued or cancelled at the end."""

    _no_suspend = field_validator("preempt_mode", mode="before")(_refuse_suspend)


class Account(Model):
    parent: Name | None = None
    """Parent account; top-level accounts hang under root."""
    description: Text | None = None
    fairshare: PositiveInt = 1
    qos: list[Name] = []
    default_qos: Name | None = None
    max_gpus: PositiveInt | None = None
    """GrpTRES=gres/gpu=N for the whole account."""
    users: list[UnixName] = []


class Priority(Model):
    weight_fairshare: NonNegativeInt = 10000
    weight_age: NonNegativeInt = 1000
    weight_qos: NonNegativeInt = 1000
    weight_partition: NonNegativeInt = 1000
    weight_job_size: NonNegativeInt = 0
    decay_half_life: DecayHalfLife = "7-0"
    """PriorityDecayHalfLife in Slurm's days-hours form."""


# The switch gpuinfra puts above the leaves, so that a job that allows it (no --switches) may span them.
ROOT_SWITCH = "root"


class Topology(Model):
    """Where the nodes sit on the network, for Slurm to place a multi-node job's nodes close together. One kind per
    cluster: leaf switches (topology/tree) or NVLink blocks (topology/block)."""

    leaves: Annotated[dict[Name, Hosts], Field(max_length=1000)] = {}
    """InfiniBand leaf switches: each one's name and the hosts under it (`gpu[01-16]`). Every Slurm compute host
    is under exactly one; a root switch above them all lets a job span leaves unless it asks for `--switches=1`."""
    blocks: Annotated[dict[Name, Hosts], Field(max_length=1000)] = {}
    """NVLink domains (Slurm 23.11 and later): each block's name and its hosts; Slurm places a job inside one
    block where it fits. Every Slurm compute host is in exactly one."""


# Trees the system and its package manager own: enroot's folders are never placed in one (the role makes their
# parents root's and 0755, and removes whatever sits where a user's folder goes).
SYSTEM_TREES = (
    "/etc", "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/boot", "/proc", "/sys", "/dev",
    "/root", "/var/lib/dpkg", "/var/lib/apt", "/var/lib/systemd", "/var/lib/mysql", "/var/lib/slurm", "/var/log",
    "/var/spool", "/var/cache/apt", "/run/munge", "/etc/munge",
)  # fmt: skip
# Folders that hold others' files: a subfolder of one is fine, the folder itself is not.
SHARED_FOLDERS = ("/", "/var", "/var/lib", "/var/cache", "/var/tmp", "/tmp", "/run", "/home", "/opt", "/srv", "/mnt")


def _not_a_system_folder(value: str) -> str:
    path = posixpath.normpath(value)
    tree = next((t for t in SYSTEM_TREES if path == t or path.startswith(t + "/")), None)
    if tree is not None:
        raise ValueError(
            f"{value} is in {tree}, which the system owns: "
            "give a folder of enroot's own (the defaults are under /var/lib/enroot)"
        )
    if path in SHARED_FOLDERS:
        raise ValueError(
            f"{value} holds others' files: give a folder of enroot's own inside it, such as {path.rstrip('/')}/enroot"
        )
    return value


class Containers(Model):
    """Containers in jobs: NVIDIA's pyxis SPANK plugin with enroot (`srun --container-image=...`). gpuinfra builds
    their Debian packages from the release sources once per OS release (and so per Slurm release), and installs
    them on the Slurm hosts from the controller."""

    sources: ControllerPath
    """Folder on the controller with the release sources: enroot-4.1.2.tar.gz, makeself-5742be6.tar.gz and
    pyxis-0.24.0.tar.gz, each checked against its pinned checksum."""
    data_path: AbsolutePath = "/var/lib/enroot/data"
    """Node-local folder for the containers' unpacked file systems, one subfolder per user; never in a system tree
    (/etc, /usr, /var/lib/dpkg, ...)."""
    cache_path: AbsolutePath = "/var/lib/enroot/cache"
    """Node-local folder for imported images and layers, one subfolder per user."""
    _system_folders = field_validator("data_path", "cache_path")(_not_a_system_folder)

    @model_validator(mode="after")
    def _apart(self) -> Containers:
        data, cache = posixpath.normpath(self.data_path), posixpath.normpath(self.cache_path)
        if data == cache or data.startswith(cache + "/") or cache.startswith(data + "/"):
            raise ValueError(
                f"data_path {self.data_path} and cache_path {self.cache_path} must be apart, neither inside the other"
            )
        return self


# gpuinfra's own partition and QoS: the admission gate's and the active checks' jobs, root only, hidden from users,
# under no user's limits; the scheduled checks' QoS, which every other QoS may preempt.
CHECKS_PARTITION = CHECKS_QOS = "gpuinfra"
IDLE_CHECKS_QOS = "gpuinfra-idle"


def _not_reserved(value: dict[str, Any]) -> dict[str, Any]:
    taken = sorted({CHECKS_PARTITION, IDLE_CHECKS_QOS} & set(value))
    if taken:
        raise ValueError(f"{taken[0]!r} is gpuinfra's own, for its health checks: name it otherwise")
    return value


class Slurm(Model):
    cluster_name: Name | None = None
    """Defaults to the cluster's name."""
    partitions: Annotated[dict[Name, Partition], Field(min_length=1), AfterValidator(_not_reserved)]
    qos: Annotated[dict[Name, Qos], AfterValidator(_not_reserved)] = {}
    accounts: dict[Name, Account] = {}
    priority: Priority = Priority()
    preempt_mode: Literal["off", "cancel", "requeue"] = "off"
    """Cluster-wide PreemptMode with PreemptType=preempt/qos; `off` disables preemption."""
    _no_suspend = field_validator("preempt_mode", mode="before")(_refuse_suspend)
    accounting: bool = True
    """Job accounting through slurmdbd and MariaDB (needs a host with the slurm_dbd role)."""
    gres_autodetect: Literal["off", "nvml"] = "off"
    """`nvml` only where the installed Slurm is built with NVML; Debian 12's and 13's slurmd are not."""
    topology: Topology | None = None
    """Leaf switches or NVLink blocks, written to topology.conf (TopologyPlugin=topology/tree or topology/block)."""
    cgroups: bool = True
    """Track and confine jobs with cgroups (ConstrainDevices: a job sees only its GPUs). false tracks jobs without
    them, with no device confinement, for hosts where Slurm cannot write the cgroup tree (unprivileged containers)."""
    containers: Containers | None = None
    """Run jobs in containers with pyxis and enroot; off when absent."""
    configless: bool = True
    """slurmd (and sackd on login nodes, from Slurm 23.11) fetch slurm.conf and the rest from slurmctld, so only
    the controller keeps them: adding a node rewrites no other host. MIG node groups, and login nodes whose Slurm
    has no sackd, still keep a copy. false writes the files on every Slurm host."""
    extra_config: dict[ExtraSlurmKey, SlurmValue] = {}
    """slurm.conf parameters gpuinfra does not model, one `Key=Value` line each (`MessageTimeout: "30"`). A parameter
    gpuinfra writes is refused, naming the field that sets it. Slurm checks the names and values when it reads the
    file: a wrong one stops the apply at the controller's restart, before any node takes it."""
