"""What a sandbox is made of, decided from the cluster file alone: one podman network, one container per host.

The cluster file is the single source of truth. Each host's `addresses` entry is the fixed address its container
gets, so the committed file reaches the containers with no generated inventory; all addresses share one /24, which
becomes the network's subnet. `connection.ssh_key` and `connection.known_hosts_file` name where `up` writes the
generated key pair and the recorded host keys: the state folder, which must lie outside any git work tree (the
committed sandbox uses ~/.local/share/gpuinfra/sandbox/ssh/), so that no private key is ever written into a
repository, where a commit or a collection build would pick it up.
"""

from __future__ import annotations

import hashlib
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from ..errors import GpuinfraError
from ..render.vars.health import EMULATED_GPU_TOOLS
from ..validate.load import LoadedCluster
from .image import PLATFORMS

# Labels mark what the sandbox made, so `down` removes exactly that and `up` never adopts someone else's container.
LABEL = "gpuinfra.sandbox"
SPEC_LABEL = "gpuinfra.sandbox.spec"
# What the systemd containers need on these machines: runc (crun refuses hybrid cgroups) and explicit ulimits
# (setrlimit to the engine's defaults is refused). See DESIGN.md section 6.
RUNTIME = "runc"
ULIMITS = ("nofile=1024:1024", "nproc=4096:4096")
# Fake GPUs are /dev/null mapped to the NVIDIA device names: enough for slurmd's gres.conf and for checks of
# device files; no driver can talk to them (see Gpu.emulated).
CONTROL_DEVICES = ("/dev/nvidiactl", "/dev/nvidia-uvm")
# nvidia-smi answers for the emulated GPUs, made from a real recording (answers.py), and the tools that pick one.
EMULATED_GPUS = Path(__file__).resolve().parent / "gpus"
# One compiler cache on the machine for every sandbox's GPU nodes, which build the same driver for the same kernel.
# An image whose compilers go through ccache uses it (molecule/shared/build-driver-image's), so the nodes after the
# first reuse the first one's objects; for any other image the folder stays empty.
COMPILER_CACHE = Path.home() / ".cache" / "gpuinfra" / "ccache"
COMPILER_CACHE_DIR = "/var/cache/ccache"
# The folder this checkout of gpuinfra (or, installed, its site-packages) lives in: never a place for a key.
SOURCE_ROOT = Path(__file__).resolve().parents[2]


class SandboxConfigError(GpuinfraError):
    """The cluster file is valid but cannot describe a sandbox (no addresses, a bastion, a non-root user...)."""


@dataclass(frozen=True)
class ContainerSpec:
    host: str
    """Host name in the cluster file; also the container's hostname and its DNS name on the network."""
    name: str
    """Container name: `<cluster>-<host>`, so several sandboxes and scenarios can share a machine."""
    address: str
    gpus: int
    image: str

    @property
    def devices(self) -> list[str]:
        if not self.gpus:
            return []
        nodes = [f"/dev/nvidia{index}" for index in range(self.gpus)] + list(CONTROL_DEVICES)
        return [f"/dev/null:{node}" for node in nodes]


@dataclass(frozen=True)
class SandboxSpec:
    cluster: str
    network: str
    subnet: str
    gateway: str
    containers: list[ContainerSpec]
    ssh_key: Path
    known_hosts: Path
    users: list[str]
    """The Slurm accounts' users: a real site's directory service gives every node these Unix users."""

    @property
    def state_dir(self) -> Path:
        return self.ssh_key.parent


def sandbox_spec(loaded: LoadedCluster, image: str | None = None) -> SandboxSpec:
    """The sandbox a loaded cluster file describes; raises SandboxConfigError naming every problem at once. Each
    host runs `image`, or without one the base image of its own `os` (localhost/gpuinfra-debian13)."""
    model = loaded.model
    conn = model.connection
    problems: list[str] = []
    if conn.user != "root":
        problems.append(f"connection.user is {conn.user!r}: the sandbox logs in as root")
    if conn.port != 22:
        problems.append(f"connection.port is {conn.port}: the sandbox's sshd listens on 22")
    if conn.bastion is not None:
        problems.append("connection.bastion is set: the sandbox's containers are reached directly")
    if not conn.host_key_checking:
        problems.append("connection.host_key_checking is false: the sandbox records its host keys, keep it on")
    if not conn.ssh_key or not conn.known_hosts_file:
        problems.append(
            "set connection.ssh_key and connection.known_hosts_file: the sandbox writes its key pair and "
            "host keys there (e.g. ~/.local/share/gpuinfra/NAME/ssh/id_ed25519 and .../known_hosts)"
        )
    base = loaded.path.resolve().parent
    ssh_key = _path(base, conn.ssh_key or "id_ed25519")
    known_hosts = _path(base, conn.known_hosts_file or "known_hosts")
    if conn.ssh_key and conn.known_hosts_file and ssh_key.parent != known_hosts.parent:
        problems.append(
            "connection.ssh_key and connection.known_hosts_file must be in the same folder (the sandbox's state folder)"
        )

    addresses: dict[str, ipaddress.IPv4Address] = {}
    for host in loaded.resolved.hosts.values():
        try:
            addresses[host.name] = ipaddress.IPv4Address(host.address)
        except ValueError:
            problems.append(
                f"host {host.name}: needs an IPv4 address under its group's `addresses` (got "
                f"{host.address!r}); the sandbox gives each container that fixed address"
            )
    subnets = {ipaddress.IPv4Network(f"{address}/24", strict=False) for address in addresses.values()}
    if len(subnets) > 1:
        problems.append(
            f"the hosts' addresses span {len(subnets)} /24 networks "
            f"({', '.join(sorted(map(str, subnets)))}); put them all in one"
        )
    if image is None:
        problems += [
            f"host {h.name}: os {h.os} has no sandbox image; the sandbox runs {' and '.join(PLATFORMS)}"
            for h in loaded.resolved.hosts.values()
            if h.os not in PLATFORMS
        ]
    subnet = next(iter(subnets)) if subnets else ipaddress.IPv4Network("10.213.42.0/24")
    gateway = subnet.network_address + 1
    for name, address in addresses.items():
        if address in (subnet.network_address, gateway, subnet.broadcast_address):
            problems.append(f"host {name}: {address} is the network, gateway or broadcast address of {subnet}")
    if problems:
        raise SandboxConfigError(f"{loaded.path} cannot be a sandbox:\n" + "\n".join(f"  - {p}" for p in problems))

    accounts = model.slurm.accounts if model.slurm else {}
    containers = [
        ContainerSpec(
            host=h.name,
            name=f"{model.name}-{h.name}",
            address=h.address,
            gpus=h.gpu_count,
            image=image or PLATFORMS[h.os].image,
        )
        for h in loaded.resolved.hosts.values()
    ]
    return SandboxSpec(
        cluster=model.name,
        network=f"gpuinfra-{model.name}",
        subnet=str(subnet),
        gateway=str(gateway),
        containers=containers,
        ssh_key=ssh_key,
        known_hosts=known_hosts,
        users=sorted({user for account in accounts.values() for user in account.users}),
    )


def user_id(name: str) -> int:
    """The same uid for a user on every host, as a directory service gives (10000-59999, stable per name)."""
    return 10000 + int(hashlib.sha256(name.encode()).hexdigest(), 16) % 50000


def check_state_folder(spec: SandboxSpec, file: str | Path) -> None:
    """Refuse a state folder inside a repository: `up` writes the private key there. (`status` and `down` do not
    check, so that a sandbox made with such a file can still be taken down.)"""
    repository = repository_of(spec.state_dir)
    if repository is not None:
        raise SandboxConfigError(
            f"{file} cannot be a sandbox:\n  - connection.ssh_key is inside {repository}: the sandbox writes a "
            "private key there, and no private key may be written into a repository; use a folder outside it, "
            f"e.g. ~/.local/share/gpuinfra/{spec.cluster}/ssh/id_ed25519"
        )


def repository_of(folder: Path) -> Path | None:
    """The git work tree (or gpuinfra's own source tree) that holds `folder`, if any.

    A home folder kept in git (dotfiles) does not count: every user data folder is under it.
    """
    folder = folder.resolve()
    if folder.is_relative_to(SOURCE_ROOT):
        return SOURCE_ROOT
    home = Path.home().resolve()
    for candidate in (folder, *folder.parents):
        if candidate != home and (candidate / ".git").exists():
            return candidate
    return None


def _path(base: Path, value: str) -> Path:
    path = Path(value).expanduser()
    return path if path.is_absolute() else (base / path).resolve()


def network_create_args(spec: SandboxSpec) -> list[str]:
    return [
        "network", "create", "--subnet", spec.subnet, "--gateway", spec.gateway,
        "--label", f"{LABEL}={spec.cluster}", spec.network,
    ]  # fmt: skip


def _settings_args(spec: SandboxSpec, container: ContainerSpec) -> list[str]:
    """The options that define a container; their digest tells `up` whether an existing one still matches."""
    args = [
        "--hostname", container.host,
        "--network", spec.network, "--ip", container.address, "--network-alias", container.host,
        "--runtime", RUNTIME, "--systemd", "always",
        # A reboot inside (`upgrade.reboot: always`) stops systemd; podman then starts the container again.
        "--restart", "always",
    ]  # fmt: skip
    for limit in ULIMITS:
        args += ["--ulimit", limit]
    for device in container.devices:
        args += ["--device", device]
    return args


def spec_digest(spec: SandboxSpec, container: ContainerSpec) -> str:
    text = "\0".join([*_settings_args(spec, container), container.image])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def run_args(spec: SandboxSpec, container: ContainerSpec) -> list[str]:
    """`podman run` arguments for one host: systemd as PID 1, fake GPUs, a fixed address, labels for `down`.

    GPU hosts also get the emulated GPUs' nvidia-smi answers (EMULATED_GPUS), read-only, and the machine's compiler
    cache (COMPILER_CACHE, which `up` creates). Both mounts are left out of the digest: their sources are places on
    this machine, not settings of the host."""
    mounts = (
        ["--volume", f"{EMULATED_GPUS}:{EMULATED_GPU_TOOLS}:ro", "--volume", f"{COMPILER_CACHE}:{COMPILER_CACHE_DIR}"]
        if container.gpus
        else []
    )
    return [
        "run", "--detach", "--name", container.name,
        *_settings_args(spec, container), *mounts,
        "--label", f"{LABEL}={spec.cluster}",
        "--label", f"{SPEC_LABEL}={spec_digest(spec, container)}",
        container.image, "/sbin/init",
    ]  # fmt: skip
