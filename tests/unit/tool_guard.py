"""Which programs a unit test starts, seen through Python's audit hooks: `subprocess.Popen` in the test's process,
and `os.exec` in a process it forked (ansible-runner starts ansible-playbook that way), which appends to a file.

A test that starts Ansible, a daemon or another system tool must carry the `tools` mark, so that the quick loop
(scripts/check: no root, no apt, no containers) can leave it out. tests/unit/conftest.py fails an unmarked test
that starts one.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

# Programs that need more than this checkout's .venv, or that run Ansible: Ansible's commands (they fork workers and
# take seconds), the Debian packages the setup installs, helm, podman, and this project's CLI (it runs Ansible).
TOOLS = frozenset(
    {
        "ansible", "ansible-playbook", "ansible-inventory", "ansible-doc", "ansible-galaxy", "ansible-config",
        "ansible-lint", "molecule", "gpuinfra", "helm", "promtool", "podman", "mariadbd", "mysqld",
        "mariadb-install-db", "mysql_install_db", "slurmctld", "slurmd", "slurmdbd", "munged", "containerd",
        "dockerd", "apt-get", "apt-config", "apt-cache", "dpkg", "dpkg-deb", "dpkg-query", "openssl", "gpg",
    }
)  # fmt: skip
_EVENTS = frozenset({"subprocess.Popen", "os.exec", "os.posix_spawn", "os.spawn", "os.system"})
_started: list[str] = []
_log: Path | None = None


def tool_of(executable: Any, argv: Any) -> str | None:
    """The tool a launch starts, or None. `python -m gpuinfra` counts as the CLI."""
    text = os.fsdecode  # os.exec hands its path and arguments as bytes
    words = [text(a) for a in argv] if isinstance(argv, Sequence) and not isinstance(argv, (str, bytes)) else []
    words = words or text(argv or "").split()
    program = os.path.basename(text(executable) if executable else (words[0] if words else ""))
    if program in ("sh", "bash") and len(words) > 2 and words[1] == "-c":  # a shell runs its first word
        program = os.path.basename(words[2].split()[0]) if words[2].split() else program
    if program in TOOLS:
        return program
    if program.startswith("python") and words[1:3] == ["-m", "gpuinfra"]:
        return "gpuinfra"
    return None


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if event not in _EVENTS:
        return
    tool = tool_of(args[0], args[1] if len(args) > 1 else None) if event != "os.system" else tool_of(None, args[0])
    if tool is None:
        return
    if event == "os.exec" and _log is not None:  # in a forked child: the parent reads the file
        with open(_log, "a", encoding="utf-8") as log:
            log.write(tool + "\n")
    else:
        _started.append(tool)


def install() -> None:
    sys.addaudithook(_audit)


def watch(log: Path) -> None:
    """Start recording for one test."""
    global _log
    _started.clear()
    _log = log


def started() -> set[str]:
    """The tools started since `watch`."""
    found = set(_started)
    if _log is not None and _log.exists():
        found.update(_log.read_text().split())
    return found
