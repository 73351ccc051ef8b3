"""`up`, `down` and `status` of a sandbox: the podman network and containers a cluster file describes.

`up` is idempotent: what exists and matches is left alone, and the result says what changed. `down` removes what
carries the sandbox's label and the files `up` wrote, and nothing else.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import GpuinfraError
from ..render.vars.health import EMULATED_KERNEL_LOG
from ..validate.load import load_cluster
from . import access, host_limits, tools
from .image import PLATFORMS, ensure_image
from .podman import (
    PodmanError,
    containers_labelled,
    exec_in,
    image_exists,
    inspect_container,
    inspect_network,
    networks_labelled,
    podman,
)
from .resize import SUFFIX as RESIZED_SUFFIX
from .spec import (
    COMPILER_CACHE,
    LABEL,
    SPEC_LABEL,
    ContainerSpec,
    SandboxSpec,
    check_state_folder,
    network_create_args,
    run_args,
    sandbox_spec,
    spec_digest,
    user_id,
)

# The kernel a GPU host gets when its image has none (the driver image built by molecule/shared/build-driver-image
# already has it).
KERNEL_PACKAGE = "linux-image-amd64"


class SandboxError(GpuinfraError):
    """Something on this machine is in the sandbox's way (a foreign container or network, a stale container)."""


@dataclass(frozen=True)
class SandboxHost:
    host: str
    container: str
    address: str
    gpus: int
    state: str
    """podman's container state (`running`, `exited`, ...) or `absent`."""
    image: str | None

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class SandboxResult:
    cluster: str
    file: str
    network: str
    subnet: str
    state_dir: str
    hosts: list[SandboxHost]
    network_present: bool = True
    changes: list[str] = field(default_factory=list)
    """What this call did, one line each; empty when everything was already in place."""

    @property
    def changed(self) -> bool:
        return bool(self.changes)

    def as_dict(self) -> dict[str, Any]:
        return {
            "cluster": self.cluster,
            "file": self.file,
            "network": {"name": self.network, "subnet": self.subnet, "present": self.network_present},
            "state_dir": self.state_dir,
            "changed": self.changed,
            "changes": self.changes,
            "hosts": [h.as_dict() for h in self.hosts],
        }


def load_spec(path: str | Path, image: str | None = None) -> SandboxSpec:
    return sandbox_spec(load_cluster(path), image)


def up(path: str | Path, image: str | None = None) -> SandboxResult:
    """Make the sandbox of a cluster file exist and accept SSH; returns what changed. Without `image`, each host
    runs the base image of its `os`, built when podman lacks it."""
    tools.require(tools.LIFECYCLE_TOOLS)
    spec = load_spec(path, image)
    check_state_folder(spec, path)
    existing = set(containers_labelled(LABEL, spec.cluster))
    problem = host_limits.check_room(sum(c.name not in existing for c in spec.containers))
    if problem:
        raise SandboxError(problem)
    changes: list[str] = []
    if image is None:
        used = {c.image for c in spec.containers}
        for platform in PLATFORMS.values():
            if platform.image in used and ensure_image(platform.image, suite=platform.suite).built:
                changes.append(f"built image {platform.image}")
    elif not image_exists(image):
        raise SandboxError(f"image {image} does not exist; build it first, or leave out --image for the base image")
    access.ensure_state_dir(spec.state_dir)
    COMPILER_CACHE.mkdir(parents=True, exist_ok=True)
    if access.ensure_keypair(spec.ssh_key):
        changes.append(f"generated key pair {spec.ssh_key}")
    if _ensure_network(spec):
        changes.append(f"created network {spec.network} ({spec.subnet})")
    created = [c for c in spec.containers if _ensure_container(spec, c, changes)]
    pubkey = access.public_key(spec.ssh_key)
    entries: dict[str, tuple[str, str]] = {}
    for container in spec.containers:
        if container in created:
            _wait_for_systemd(container.name)
        if access.own_host_keys(container.name):
            changes.append(f"{container.host}: generated its own SSH host keys")
        if access.authorize(container.name, pubkey):
            changes.append(f"{container.host}: authorized the sandbox key for root")
        entries[container.host] = (container.address, access.host_key(container.name))
        created_users = _ensure_users(container, spec.users)
        if created_users:
            changes.append(f"{container.host}: created the users {', '.join(created_users)}")
    gpu_hosts = [c for c in spec.containers if c.gpus]
    for container in gpu_hosts:
        _ensure_kernel_log(container)
    with ThreadPoolExecutor(max_workers=max(1, len(gpu_hosts))) as pool:
        for container, installed in zip(gpu_hosts, pool.map(_ensure_kernel, gpu_hosts), strict=True):
            if installed:
                changes.append(f"{container.host}: installed {KERNEL_PACKAGE}")
    if access.write_if_changed(spec.known_hosts, access.known_hosts_text(entries)):
        changes.append(f"recorded host keys in {spec.known_hosts}")
    for container in spec.containers:
        access.wait_for_ssh(container.host, spec.ssh_key, spec.known_hosts, container.address)
    _check_names(spec)
    return _result(spec, path, changes)


# Debian 12's podman puts containers on CNI networks, whose DNS comes from a plugin in a package of its own.
DNS_PACKAGE = "golang-github-containernetworking-plugin-dnsname"


def _check_names(spec: SandboxSpec) -> None:
    """Slurm, Munge and Prometheus reach hosts by name, as on a real fleet: every host must resolve the others."""
    hosts = [c.host for c in spec.containers]
    for container in spec.containers:
        try:
            exec_in(container.name, "getent hosts " + " ".join(hosts))
        except PodmanError as exc:
            raise SandboxError(
                f"{container.host} cannot resolve the other hosts by name on network {spec.network}; install "
                f"podman's DNS plugin (apt-get install {DNS_PACKAGE}), then run `gpuinfra sandbox down` and `up` "
                f"to create the network again ({exc})"
            ) from exc


def status(path: str | Path, image: str | None = None) -> SandboxResult:
    tools.require(("podman",))
    spec = load_spec(path, image)
    return _result(spec, path, [])


def down(path: str | Path) -> SandboxResult:
    """Remove the sandbox's containers, its network and the files `up` wrote."""
    tools.require(("podman",))
    spec = load_spec(path)
    changes: list[str] = []
    names = containers_labelled(LABEL, spec.cluster)
    if names:
        podman("rm", "--force", "--time", "0", *names)
        changes += [f"removed container {name}" for name in names]
    for network in networks_labelled(LABEL, spec.cluster):
        podman("network", "rm", network)
        changes.append(f"removed network {network}")
    resized = sorted(spec.state_dir.glob(f"*{RESIZED_SUFFIX}")) if spec.state_dir.is_dir() else []
    for made in (spec.ssh_key, spec.ssh_key.with_name(spec.ssh_key.name + ".pub"), spec.known_hosts, *resized):
        if made.is_file():
            made.unlink()
            changes.append(f"removed {made}")
    if spec.state_dir.is_dir() and not any(spec.state_dir.iterdir()):
        spec.state_dir.rmdir()
        changes.append(f"removed {spec.state_dir}")
    return _result(spec, path, changes)


def _ensure_network(spec: SandboxSpec) -> bool:
    found = inspect_network(spec.network)
    if found is None:
        try:
            podman(*network_create_args(spec))
        except PodmanError as exc:
            raise SandboxError(
                f"cannot create network {spec.network} ({spec.subnet}): {exc}; if the subnet is "
                "taken, move the hosts' addresses in the cluster file to a free /24"
            ) from None
        return True
    if (found.get("labels") or {}).get(LABEL) != spec.cluster:
        raise SandboxError(
            f"a network named {spec.network} exists but was not made by this sandbox; remove or "
            "rename it, or rename the cluster"
        )
    subnets = [s.get("subnet") for s in found.get("subnets") or []]
    if spec.subnet not in subnets:
        raise SandboxError(
            f"network {spec.network} has subnet {', '.join(map(str, subnets))}, the cluster file "
            f"says {spec.subnet}: run `gpuinfra sandbox down` first"
        )
    return False


def _ensure_container(spec: SandboxSpec, container: ContainerSpec, changes: list[str]) -> bool:
    """Create or start the host's container; True when it was created."""
    found = inspect_container(container.name)
    if found is not None:
        labels = (found.get("Config") or {}).get("Labels") or {}
        if labels.get(LABEL) != spec.cluster:
            raise SandboxError(
                f"a container named {container.name} exists but was not made by this sandbox; remove or "
                "rename it, or rename the cluster"
            )
        if labels.get(SPEC_LABEL) != spec_digest(spec, container):
            raise SandboxError(
                f"container {container.name} was made with other settings (image, address or GPUs); run "
                "`gpuinfra sandbox down` first to recreate it"
            )
        if _stale(found, container.name):
            # podman's record says running, but the runtime has no such process (a machine restored from a
            # snapshot, or the runtime's state wiped): nothing can be started or run in it, so it is made anew.
            podman("rm", "--force", "--time", "0", container.name)
            changes.append(f"{container.host}: removed container {container.name}, which had no running process")
            found = None
    if found is None:
        podman(*run_args(spec, container))
        changes.append(
            f"{container.host}: created container {container.name} ({container.address}, "
            f"{container.gpus} fake GPUs, image {container.image})"
        )
        return True
    if (found.get("State") or {}).get("Status") != "running":
        podman("start", container.name)
        _wait_for_systemd(container.name)
        changes.append(f"{container.host}: started container {container.name}")
    return False


def _stale(found: dict[str, Any], name: str) -> bool:
    """True when podman calls the container running but nothing can run in it."""
    if (found.get("State") or {}).get("Status") != "running":
        return False
    try:
        exec_in(name, "true", timeout=60)
    except PodmanError:
        return True
    return False


def _ensure_users(container: ContainerSpec, users: list[str]) -> list[str]:
    """Create the users a Slurm job runs as, with the same uid on every host; returns those created."""
    script = "".join(
        f"id -u {name} >/dev/null 2>&1 || {{ useradd --uid {user_id(name)} --user-group --create-home "
        f"--shell /bin/bash {name} && echo {name}; }}; "
        for name in users
    )
    return exec_in(container.name, script).split() if users else []


def _ensure_kernel(container: ContainerSpec) -> bool:
    """Give a GPU host a kernel package, as a real GPU machine has: the driver's DKMS module is built for the
    installed kernels, and the preflight checks one is there. True when it was installed (a driver image has it)."""
    script = (
        "ls /boot/vmlinuz-* >/dev/null 2>&1 && exit 0; "
        "export DEBIAN_FRONTEND=noninteractive; apt-get update -qq; "
        f"apt-get install -y -qq --no-install-recommends {KERNEL_PACKAGE} >/dev/null; echo installed"
    )
    return exec_in(container.name, script, timeout=900).strip().endswith("installed")


def _ensure_kernel_log(container: ContainerSpec) -> None:
    """The emulated GPUs' kernel log, which the health program reads instead of the machine's own: it exists,
    empty until `gpuinfra-sandbox-gpu` records a fault in it."""
    folder = shlex.quote(os.path.dirname(EMULATED_KERNEL_LOG))
    exec_in(container.name, f"mkdir -p {folder} && touch {shlex.quote(EMULATED_KERNEL_LOG)}")


def _wait_for_systemd(container: str, timeout: float = 120) -> None:
    """Wait until systemd in the container has finished booting (`running`, or `degraded` with a failed unit)."""
    deadline = time.monotonic() + timeout
    state = "unknown"
    while time.monotonic() < deadline:
        try:
            state = exec_in(container, "systemctl is-system-running --wait || true", timeout=timeout).strip()
        except PodmanError as exc:
            state = str(exc)
        if state in ("running", "degraded"):
            return
        time.sleep(0.5)
    raise SandboxError(f"systemd in {container} did not finish booting in {timeout:.0f} s (state: {state})")


def _result(spec: SandboxSpec, path: str | Path, changes: list[str]) -> SandboxResult:
    hosts = []
    for container in spec.containers:
        found = inspect_container(container.name)
        hosts.append(
            SandboxHost(
                host=container.host,
                container=container.name,
                address=container.address,
                gpus=container.gpus,
                state=((found.get("State") or {}).get("Status") or "unknown") if found else "absent",
                image=(found.get("ImageName") or None) if found else None,
            )
        )
    return SandboxResult(
        cluster=spec.cluster,
        file=str(path),
        network=spec.network,
        subnet=spec.subnet,
        state_dir=str(spec.state_dir),
        hosts=hosts,
        network_present=inspect_network(spec.network) is not None,
        changes=changes,
    )


def ssh(path: str | Path, host: str, command: list[str]) -> subprocess.CompletedProcess[str]:
    """Run a command on a sandbox host over SSH, exactly as the runs connect (for tests and debugging)."""
    spec = load_spec(path)
    for container in spec.containers:
        if container.host == host:
            argv = [*access.ssh_command(spec.ssh_key, spec.known_hosts, container.address), "--", *command]
            return subprocess.run(argv, capture_output=True, text=True, check=False)
    raise SandboxError(f"no host {host!r} in {path}")
