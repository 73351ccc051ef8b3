"""The programs the sandbox runs, and the Debian packages that provide them."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterable

from ..errors import GpuinfraError

# Program -> Debian package. podman needs runc here: crun refuses the hybrid cgroups of these machines.
PACKAGES: dict[str, str] = {
    "podman": "podman",
    "runc": "runc",
    "debootstrap": "debootstrap",
    "ssh": "openssh-client",
    "ssh-keygen": "openssh-client",
}
# What `up`, `down` and `status` need; building the image also needs debootstrap.
LIFECYCLE_TOOLS = ("podman", "runc", "ssh", "ssh-keygen")
IMAGE_TOOLS = ("podman", "runc", "debootstrap")


class MissingTools(GpuinfraError):
    """Programs the sandbox needs are not installed."""

    def __init__(self, missing: list[str]) -> None:
        self.missing = missing
        super().__init__(missing_message(missing))

    @property
    def packages(self) -> list[str]:
        return sorted({PACKAGES[tool] for tool in self.missing})


def missing_tools(tools: Iterable[str], which: Callable[[str], str | None] = shutil.which) -> list[str]:
    return [tool for tool in tools if which(tool) is None]


def missing_message(missing: list[str]) -> str:
    packages = sorted({PACKAGES[tool] for tool in missing})
    names = ", ".join(missing)
    return (
        f"the sandbox needs {names}, which {'is' if len(missing) == 1 else 'are'} not installed; "
        f"install {'it' if len(packages) == 1 else 'them'} with: apt-get install {' '.join(packages)}"
    )


def require(tools: Iterable[str], which: Callable[[str], str | None] = shutil.which) -> None:
    missing = missing_tools(tools, which)
    if missing:
        raise MissingTools(missing)
