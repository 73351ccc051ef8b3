"""The Debian systemd base images the sandbox hosts and Molecule scenarios run on, built with debootstrap.

No image registry is reachable from the machines this runs on, so an image is built from Debian's archive:
debootstrap into a temporary folder, then `podman import` with /sbin/init as its command. About 70 s here.
One image per platform, named after the cluster file's `os`: `localhost/gpuinfra-debian13` (trixie, the sandbox's
and most scenarios') and `localhost/gpuinfra-debian12` (bookworm), built the same way from their own suite.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from . import tools
from .podman import PodmanError, image_exists


@dataclass(frozen=True)
class Platform:
    """A Debian release an image can be built of: the cluster file's `os` name and the archive's suite."""

    os: str
    suite: str

    @property
    def image(self) -> str:
        return f"localhost/gpuinfra-{self.os}"


PLATFORMS: dict[str, Platform] = {
    "debian12": Platform("debian12", "bookworm"),
    "debian13": Platform("debian13", "trixie"),
}
DEFAULT_PLATFORM = PLATFORMS["debian13"]  # the sandbox cluster file's os
DEFAULT_IMAGE = DEFAULT_PLATFORM.image
SUITE = DEFAULT_PLATFORM.suite
MIRROR = "http://deb.debian.org/debian"
# systemd as PID 1, Python and apt bindings for Ansible, sshd for real SSH, sudo for non-root roles, and the
# basics roles expect on a server (ip, ps, gpg for repository keys, modprobe/modinfo for the driver).
INCLUDE = (
    "systemd", "systemd-sysv", "dbus", "ca-certificates", "python3", "python3-apt",
    "openssh-server", "sudo", "iproute2", "procps", "gnupg", "kmod",
)  # fmt: skip


class ImageBuildError(PodmanError):
    """debootstrap or the import failed; the message holds the tail of its output."""


@dataclass(frozen=True)
class ImageResult:
    name: str
    built: bool
    seconds: float

    def as_dict(self) -> dict[str, object]:
        return {"image": self.name, "built": self.built, "seconds": round(self.seconds, 1)}


def debootstrap_args(target: Path, mirror: str = MIRROR, suite: str = SUITE) -> list[str]:
    return ["debootstrap", "--variant=minbase", f"--include={','.join(INCLUDE)}", suite, str(target), mirror]


def ensure_image(name: str = DEFAULT_IMAGE, mirror: str = MIRROR, suite: str = SUITE) -> ImageResult:
    """Reuse the image when podman has it; otherwise build it of `suite` (needs root and debootstrap)."""
    tools.require(("podman", "runc"))
    if image_exists(name):
        return ImageResult(name, built=False, seconds=0.0)
    tools.require(tools.IMAGE_TOOLS)
    if os.geteuid() != 0:
        raise ImageBuildError(f"building {name} needs root (debootstrap creates device nodes and owns files as root)")
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="gpuinfra-image-") as tmp:
        rootfs = Path(tmp) / "rootfs"
        _run(debootstrap_args(rootfs, mirror, suite), "debootstrap")
        # Downloaded .debs are only a cache; leaving them out keeps the image a third smaller.
        for deb in (rootfs / "var" / "cache" / "apt" / "archives").glob("*.deb"):
            deb.unlink()
        _import(rootfs, name)
    return ImageResult(name, built=True, seconds=time.monotonic() - started)


def _run(args: list[str], what: str) -> None:
    done = subprocess.run(args, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-15:])
        raise ImageBuildError(f"{what} failed (exit {done.returncode}):\n{tail}")


def _import(rootfs: Path, name: str) -> None:
    tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
    try:
        done = subprocess.run(
            ["podman", "import", "--change", 'CMD ["/sbin/init"]', "-", name],
            stdin=tar.stdout,
            capture_output=True,
            text=True,
            check=False,
        )
    finally:
        if tar.stdout is not None:
            tar.stdout.close()
        tar_rc = tar.wait()
    if tar_rc != 0 or done.returncode != 0:
        raise ImageBuildError(f"importing {name} failed: tar exit {tar_rc}, podman: {done.stderr.strip()}")
