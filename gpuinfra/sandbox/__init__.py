"""The sandbox: a cluster of systemd containers on this machine, reached over real SSH like a real fleet.

- `spec`: what the cluster file asks for (network, containers, fake GPUs), decided without running anything;
- `image`: the Debian systemd base images (Debian 12 for the sandbox, Debian 13 too), built with debootstrap when
  missing;
- `lifecycle`: `up`, `down` and `status`;
- `resize`: the same cluster with another number of GPU nodes (`up --gpu-nodes N`);
- `access`: the key pair, per-container host keys and the known_hosts file the runs use;
- `tools`: the programs needed and the Debian packages that provide them.
"""

from .access import SshError
from .image import DEFAULT_IMAGE, DEFAULT_PLATFORM, PLATFORMS, ImageBuildError, ImageResult, Platform, ensure_image
from .lifecycle import SandboxError, SandboxHost, SandboxResult, down, ssh, status, up
from .podman import PodmanError
from .resize import resized
from .spec import SandboxConfigError, SandboxSpec, sandbox_spec
from .tools import MissingTools

__all__ = [
    "DEFAULT_IMAGE",
    "DEFAULT_PLATFORM",
    "PLATFORMS",
    "ImageBuildError",
    "ImageResult",
    "MissingTools",
    "Platform",
    "PodmanError",
    "SandboxConfigError",
    "SandboxError",
    "SandboxHost",
    "SandboxResult",
    "SandboxSpec",
    "SshError",
    "down",
    "ensure_image",
    "resized",
    "sandbox_spec",
    "ssh",
    "status",
    "up",
]
