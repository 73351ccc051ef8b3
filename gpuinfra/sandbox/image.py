"""The Debian 12 systemd base image every sandbox host and Molecule scenario runs on, built with debootstrap.

No image registry is reachable from the machines this runs on, so the image is built from Debian's archive:
debootstrap into a temporary folder, then `podman import` with /sbin/init as its command. About 70 s here.
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

DEFAULT_IMAGE = "localhost/gpuinfra-debian12"
SUITE = "bookworm"
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


def debootstrap_args(target: Path, mirror: str = MIRROR) -> list[str]:
    return ["debootstrap", "--variant=minbase", f"--include={','.join(INCLUDE)}", SUITE, str(target), mirror]


def ensure_image(name: str = DEFAULT_IMAGE, mirror: str = MIRROR) -> ImageResult:
    """Reuse the image when podman has it; otherwise build it (needs root and debootstrap)."""
    tools.require(("podman", "runc"))
    if image_exists(name):
        return ImageResult(name, built=False, seconds=0.0)
    tools.require(tools.IMAGE_TOOLS)
    if os.geteuid() != 0:
        raise ImageBuildError(f"building {name} needs root (debootstrap creates device nodes and owns files as root)")
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="gpuinfra-image-") as tmp:
        rootfs = Path(tmp) / "rootfs"
        _run(debootstrap_args(rootfs, mirror), "debootstrap")
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
