"""The podman commands the sandbox runs: each returns data or raises PodmanError with podman's own message."""

from __future__ import annotations

import json
import subprocess
from typing import Any

from ..errors import GpuinfraError


class PodmanError(GpuinfraError):
    """A podman command failed; the message holds the command and what podman said."""


def podman(*args: str, input: str | None = None, timeout: float = 300) -> str:
    """Run `podman ARGS` and return its stdout."""
    try:
        done = subprocess.run(
            ["podman", *args], input=input, capture_output=True, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired:
        raise PodmanError(f"podman {' '.join(args)}: no answer after {timeout:.0f} s") from None
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip().splitlines()
        raise PodmanError(f"podman {' '.join(args[:3])}...: {said[-1] if said else f'exit {done.returncode}'}")
    return done.stdout


def image_exists(name: str) -> bool:
    return subprocess.run(["podman", "image", "exists", name], capture_output=True, check=False).returncode == 0


def inspect_network(name: str) -> dict[str, Any] | None:
    if subprocess.run(["podman", "network", "exists", name], capture_output=True, check=False).returncode != 0:
        return None
    found: list[dict[str, Any]] = json.loads(podman("network", "inspect", name))
    return found[0]


def inspect_container(name: str) -> dict[str, Any] | None:
    if subprocess.run(["podman", "container", "exists", name], capture_output=True, check=False).returncode != 0:
        return None
    found: list[dict[str, Any]] = json.loads(podman("container", "inspect", name))
    return found[0]


def containers_labelled(label: str, value: str) -> list[str]:
    out = podman("ps", "--all", "--filter", f"label={label}={value}", "--format", "{{.Names}}")
    return sorted(out.split())


def networks_labelled(label: str, value: str) -> list[str]:
    out = podman("network", "ls", "--filter", f"label={label}={value}", "--format", "{{.Name}}")
    return sorted(out.split())


def exec_in(container: str, command: str, input: str | None = None, timeout: float = 120) -> str:
    """Run a shell command inside a running container (no SSH involved)."""
    return podman("exec", "--interactive", container, "sh", "-ec", command, input=input, timeout=timeout)
