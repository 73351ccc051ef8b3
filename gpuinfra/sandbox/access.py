"""SSH access to the sandbox as to a real fleet: a generated key pair, per-container host keys, strict checking.

Host keys are read from inside each container through podman (a channel the machine already trusts), never
learned over the network, so the known_hosts file the runs use is right from the first connection.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from ..errors import GpuinfraError
from .podman import exec_in

# Present once a container's host keys are its own: the base image ships one set of keys for every container.
HOSTKEY_MARKER = "/etc/ssh/.gpuinfra-sandbox-hostkeys"


class SshError(GpuinfraError):
    """A sandbox host does not accept the sandbox's key over SSH."""


def ensure_state_dir(path: Path) -> None:
    """Make the state folder 0700, and any folder created on the way to it (the cluster's secrets folder)."""
    missing = [folder for folder in (path, *path.parents) if not folder.exists()]
    for folder in reversed(missing):
        folder.mkdir(mode=0o700, exist_ok=True)
    path.chmod(0o700)


def ensure_keypair(key: Path) -> bool:
    """Create an ed25519 key pair without a passphrase unless one is there; True when created."""
    if key.is_file() and key.with_name(key.name + ".pub").is_file():
        return False
    for stale in (key, key.with_name(key.name + ".pub")):
        stale.unlink(missing_ok=True)
    done = subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "gpuinfra-sandbox", "-f", str(key)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SshError(f"ssh-keygen failed: {done.stderr.strip()}")
    key.chmod(0o600)
    return True


def public_key(key: Path) -> str:
    return key.with_name(key.name + ".pub").read_text().strip()


def own_host_keys(container: str) -> bool:
    """Give the container host keys of its own, once; True when it got new ones."""
    script = (
        f"test -e {HOSTKEY_MARKER} && exit 0; "
        "rm -f /etc/ssh/ssh_host_*; ssh-keygen -A >/dev/null; "
        "systemctl restart ssh; "
        f"touch {HOSTKEY_MARKER}; echo new"
    )
    return exec_in(container, script).strip() == "new"


def authorize(container: str, pubkey: str) -> bool:
    """Make the sandbox's key root's only authorized key; True when that changed the file."""
    script = (
        "mkdir -p -m 0700 /root/.ssh; f=/root/.ssh/authorized_keys; "
        'new="$(cat)"; '
        'if [ -f "$f" ] && [ "$(cat "$f")" = "$new" ]; then exit 0; fi; '
        'printf "%s\\n" "$new" > "$f"; chmod 0600 "$f"; echo changed'
    )
    return exec_in(container, script, input=pubkey + "\n").strip() == "changed"


def host_key(container: str) -> str:
    """The container's ed25519 host key, `ssh-ed25519 AAAA...`."""
    fields = exec_in(container, "cat /etc/ssh/ssh_host_ed25519_key.pub").split()
    return " ".join(fields[:2])


def known_hosts_text(entries: dict[str, tuple[str, str]]) -> str:
    """host -> (address, key) as known_hosts lines: each key under its address (what Ansible connects to)
    and its name (what a person types)."""
    return "".join(f"{address},{host} {key}\n" for host, (address, key) in entries.items())


def write_if_changed(path: Path, text: str, mode: int = 0o600) -> bool:
    if path.is_file() and path.read_text() == text:
        return False
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as out:
        out.write(text)
    tmp.replace(path)
    return True


def ssh_command(key: Path, known_hosts: Path, address: str) -> list[str]:
    """The SSH command Ansible's connection amounts to: strict host key checking, only the sandbox's key."""
    return [
        "ssh", "-i", str(key), "-o", f"UserKnownHostsFile={known_hosts}", "-o", "StrictHostKeyChecking=yes",
        "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes", "-o", "ConnectTimeout=5", f"root@{address}",
    ]  # fmt: skip


def wait_for_ssh(host: str, key: Path, known_hosts: Path, address: str, timeout: float = 60) -> None:
    """Poll until `ssh root@ADDRESS true` works (sshd restarts after the host keys change)."""
    deadline = time.monotonic() + timeout
    while True:
        done = subprocess.run(
            [*ssh_command(key, known_hosts, address), "true"], capture_output=True, text=True, check=False
        )
        if done.returncode == 0:
            return
        if time.monotonic() > deadline:
            raise SshError(f"{host} ({address}) does not accept the sandbox's key over SSH: {done.stderr.strip()}")
        time.sleep(0.5)
