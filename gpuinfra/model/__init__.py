"""Pydantic models of the cluster file."""

from .cluster import Cluster
from .driver import ContainerToolkit, Driver, Kernel
from .kubernetes import Kubernetes, Tenant
from .mig import Mig
from .monitoring import COMPONENTS, Component, Monitoring
from .nodes import ROLES, SLURM_ROLES, Gpu, MigAssignment, NodeGroup, Role
from .policy import Health, Upgrade
from .slurm import Account, Partition, Qos, Slurm

__all__ = [
    "COMPONENTS",
    "ROLES",
    "SLURM_ROLES",
    "Account",
    "Cluster",
    "Component",
    "ContainerToolkit",
    "Driver",
    "Gpu",
    "Health",
    "Kernel",
    "Kubernetes",
    "Mig",
    "MigAssignment",
    "Monitoring",
    "NodeGroup",
    "Partition",
    "Qos",
    "Role",
    "Slurm",
    "Tenant",
    "Upgrade",
]
