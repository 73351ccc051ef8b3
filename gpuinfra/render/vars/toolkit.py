"""The NVIDIA container toolkit: role variables from `container_toolkit:` in the cluster file.

Role: nvidia_container_toolkit.
"""

from __future__ import annotations

from typing import Any

from ...resolve import ResolvedCluster
from ..artifacts import Artifact
from . import sources
from .concern import Concern

ARTIFACTS: list[Artifact] = [
    Artifact(
        path="container-toolkit/containerd/conf.d/99-nvidia.toml",
        role="nvidia_container_toolkit",
        template="containerd-nvidia.toml.j2",
        host_role="gpu_nodes",
    ),
    Artifact(
        path="container-toolkit/docker/daemon.json",
        role="nvidia_container_toolkit",
        template="docker-daemon.json.j2",
        host_role="gpu_nodes",
    ),
    Artifact(
        path="container-toolkit/crio/crio.conf.d/99-nvidia.toml",
        role="nvidia_container_toolkit",
        template="crio-nvidia.toml.j2",
        host_role="gpu_nodes",
    ),
]


def group_vars(rc: ResolvedCluster) -> dict[str, Any]:
    toolkit = rc.model.container_toolkit
    return {
        "nvidia_container_toolkit_install_packages": toolkit.install,
        "nvidia_container_toolkit_version": toolkit.version or "",
        "nvidia_container_toolkit_runtimes": list(toolkit.runtimes),
        "nvidia_container_toolkit_default_runtime": toolkit.default_runtime,
        "nvidia_container_toolkit_cdi": toolkit.cdi,
        **sources.source_vars("nvidia_container_toolkit_source", toolkit.source),
    }


CONCERN = Concern("toolkit", ARTIFACTS, group_vars)
