"""How `sandbox up` treats a container that already exists, with podman's answers replaced by recorded ones."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpuinfra.sandbox import lifecycle
from gpuinfra.sandbox.podman import PodmanError
from gpuinfra.sandbox.spec import LABEL, SPEC_LABEL, SandboxSpec, sandbox_spec, spec_digest
from gpuinfra.validate.load import load_cluster

ROOT = Path(__file__).resolve().parents[2]
SANDBOX = ROOT / "inventories" / "sandbox" / "cluster.yml"


class FakePodman:
    """Answers inspect and exec as podman would for one existing container, and records what is run."""

    def __init__(self, spec: SandboxSpec, status: str, exec_works: bool, label: str | None = None) -> None:
        container = spec.containers[0]
        self.found: dict[str, Any] | None = {
            "State": {"Status": status},
            "Config": {
                "Labels": {LABEL: label or spec.cluster, SPEC_LABEL: spec_digest(spec, container)},
            },
        }
        self.exec_works = exec_works
        self.commands: list[tuple[str, ...]] = []

    def inspect(self, name: str) -> dict[str, Any] | None:
        return self.found

    def podman(self, *args: str, **_: Any) -> str:
        self.commands.append(args)
        if args[0] == "rm":
            self.found = None
        return ""

    def exec_in(self, name: str, command: str, **_: Any) -> str:
        if not self.exec_works:
            raise PodmanError(f"podman exec --interactive {name}...: cannot exec in a stopped container")
        return "running\n"


@pytest.fixture
def spec() -> SandboxSpec:
    return sandbox_spec(load_cluster(SANDBOX), "localhost/img")


def install(monkeypatch: pytest.MonkeyPatch, fake: FakePodman) -> None:
    monkeypatch.setattr(lifecycle, "inspect_container", fake.inspect)
    monkeypatch.setattr(lifecycle, "podman", fake.podman)
    monkeypatch.setattr(lifecycle, "exec_in", fake.exec_in)


def test_a_running_container_that_answers_is_left_alone(monkeypatch: pytest.MonkeyPatch, spec: SandboxSpec) -> None:
    fake = FakePodman(spec, "running", exec_works=True)
    install(monkeypatch, fake)
    changes: list[str] = []
    assert lifecycle._ensure_container(spec, spec.containers[0], changes) is False
    assert (fake.commands, changes) == ([], [])


def test_a_container_running_only_in_podmans_record_is_made_anew(
    monkeypatch: pytest.MonkeyPatch, spec: SandboxSpec
) -> None:
    """A machine restored from a snapshot: podman says running, runc has no process, so exec fails."""
    container = spec.containers[0]
    fake = FakePodman(spec, "running", exec_works=False)
    install(monkeypatch, fake)
    changes: list[str] = []
    assert lifecycle._ensure_container(spec, container, changes) is True
    assert fake.commands[0] == ("rm", "--force", "--time", "0", container.name)
    assert fake.commands[1][0] == "run" and len(fake.commands) == 2
    assert [line.split(":")[1].split()[0] for line in changes] == ["removed", "created"]


def test_a_stopped_container_is_started(monkeypatch: pytest.MonkeyPatch, spec: SandboxSpec) -> None:
    fake = FakePodman(spec, "exited", exec_works=True)
    install(monkeypatch, fake)
    changes: list[str] = []
    assert lifecycle._ensure_container(spec, spec.containers[0], changes) is False
    assert fake.commands == [("start", spec.containers[0].name)]


def test_a_foreign_container_is_never_removed(monkeypatch: pytest.MonkeyPatch, spec: SandboxSpec) -> None:
    fake = FakePodman(spec, "running", exec_works=False, label="someone-else")
    install(monkeypatch, fake)
    with pytest.raises(lifecycle.SandboxError, match="not made by this sandbox"):
        lifecycle._ensure_container(spec, spec.containers[0], [])
    assert fake.commands == []
