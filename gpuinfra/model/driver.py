"""The NVIDIA driver, the kernels it is built for, and the container toolkit: versions, module flavour, and where
packages come from."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from .base import Model
from .grammar import ControllerPath, DriverVersion, KeyFingerprint, PackageVersion, RepoUrl


class DistributionSource(Model):
    type: Literal["distribution"]
    """The OS archive (Debian non-free, Ubuntu restricted); not available on RHEL."""
    backports: bool = False
    """Debian: take the driver from the release's backports (bookworm-backports, trixie-backports)."""


class NvidiaRepoSource(Model):
    type: Literal["nvidia"]
    """NVIDIA's CUDA repository for the OS."""


class MirrorSource(Model):
    type: Literal["mirror"]
    url: RepoUrl
    """Base URL of a mirror of the NVIDIA repository (apt or yum layout); https:// unless `insecure`."""
    keyring: ControllerPath | None = None
    """Path on the controller to the mirror's signing key (armored or binary); required unless `insecure`."""
    fingerprint: KeyFingerprint | None = None
    """Full fingerprint of the signing key (40 upper-case hex digits); the key is refused if it differs."""
    insecure: bool = False
    """Allow an http:// URL or a mirror without a signing key. Packages are then taken on trust."""


class LocalSource(Model):
    type: Literal["local"]
    path: ControllerPath
    """Folder on the controller holding the .deb or .rpm files, for air-gapped sites."""


PackageSource = Annotated[
    DistributionSource | NvidiaRepoSource | MirrorSource | LocalSource, Field(discriminator="type")
]


class Driver(Model):
    version: DriverVersion | None = None
    """Exact driver version to pin, e.g. `535.261.03`. Quote it in YAML."""
    branch: Annotated[int, Field(ge=390, le=999)] | None = None
    """Driver branch, e.g. 535, when no exact version is pinned."""
    kernel_modules: Literal["proprietary", "open"] = "proprietary"
    source: PackageSource = DistributionSource(type="distribution")
    hold: bool = True
    """Hold the packages and keep them out of unattended-upgrades."""
    fabric_manager_version: DriverVersion | None = None
    """Only to state it explicitly: it must equal `version`."""
    reboot: Literal["when_needed", "never"] = "when_needed"
    """`never`: load the new modules without rebooting, or fail if that is impossible."""

    @model_validator(mode="after")
    def _one_of_version_or_branch(self) -> Driver:
        if (self.version is None) == (self.branch is None):
            raise ValueError("set exactly one of `version` (exact pin, e.g. '535.261.03') or `branch` (e.g. 535)")
        return self

    @property
    def major(self) -> int:
        return self.branch if self.branch is not None else int(str(self.version).split(".")[0])


class Kernel(Model):
    unattended_updates: bool = False
    """Let unattended-upgrades (dnf-automatic on RHEL) install kernels on the GPU nodes; their headers come with
    them and DKMS builds the module in the same run. The reboot stays `gpuinfra upgrade --kernel`'s, node by node
    behind the kernel gate. false: kernels arrive only through `gpuinfra upgrade --kernel`."""


ContainerRuntimeName = Literal["containerd", "docker", "cri-o"]


class ContainerToolkit(Model):
    runtimes: list[ContainerRuntimeName] = []
    """Runtimes to configure with the NVIDIA runtime."""
    version: PackageVersion | None = None
    """Exact nvidia-container-toolkit version; latest from the source when omitted."""
    default_runtime: bool = False
    """Make `nvidia` the default runtime."""
    cdi: bool = True
    """Generate a CDI spec (/etc/cdi/nvidia.yaml)."""
    source: PackageSource = NvidiaRepoSource(type="nvidia")
    install: bool = True
    """Install the toolkit's packages from `source`. false only configures the runtimes, for hosts whose image
    already carries the toolkit, or that run no containers."""
