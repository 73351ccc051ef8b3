"""The whole cluster file."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from .base import Model
from .driver import ContainerToolkit, Driver, Kernel
from .grammar import Name
from .kubernetes import Kubernetes
from .mig import Mig
from .monitoring import Monitoring
from .nodes import Connection, NodeGroup, OperatingSystem
from .policy import Health, Upgrade
from .slurm import Slurm


class Cluster(Model):
    name: Name
    os: OperatingSystem = "debian12"
    connection: Connection = Connection()
    node_groups: Annotated[dict[Name, NodeGroup], Field(min_length=1)]
    driver: Driver | None = None
    kernel: Kernel = Kernel()
    container_toolkit: ContainerToolkit = ContainerToolkit()
    slurm: Slurm | None = None
    kubernetes: Kubernetes | None = None
    mig: Mig = Mig()
    monitoring: Monitoring = Monitoring()
    health: Health = Health()
    upgrade: Upgrade = Upgrade()
