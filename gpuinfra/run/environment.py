"""Where and how ansible-playbook runs: a private run directory, its environment, its configuration and forks.

Every run gets a private run directory (0700, removed afterwards) holding the inventory, a link that makes the
repository root the collection `gpuinfra.cluster`, runner tuning settings and runner's artifacts. Secrets never go
there: no passwords, ssh keys, extra vars or environment files are written.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from ..collection import ROOT, link_collection
from .result import RunError

INVENTORY_PLUGIN = "gpuinfra.cluster.cluster"
INVENTORY_SOURCE = Path("inventory") / "gpuinfra.yml"

# Hosts worked on at once when no --forks is given: every host of the run, up to this many. Ansible's own default of 5
# makes a fleet wait in batches of five, and ansible-playbook polls for a free worker every 0.1 ms while they work,
# controller CPU that grows with each host's time on its task. Each worker is a forked ansible-playbook of a few tens
# of MB, mostly shared with its parent.
MAX_DEFAULT_FORKS = 50

# How often ansible-playbook looks at its workers' results while the hosts work. Ansible's 1 ms costs the controller
# CPU for as long as a task waits on its slowest host: a quarter of a no-op's at 33 hosts (benchmarks/noop_scaling.py).
# 10 ms adds at most that to a task. The setting has no environment variable, hence a file.
RUN_CONFIG = "[defaults]\ninternal_poll_interval = 0.01\n"
# Where Ansible looks for a configuration after ANSIBLE_CONFIG and ./ansible.cfg (a run's working folder is its own).
USER_CONFIGS = (Path("~/.ansible.cfg"), Path("/etc/ansible/ansible.cfg"))

# How often runner looks at the cancel flag and the timeout while ansible-playbook runs (seconds).
POLL_SECONDS = 0.2


def _collection_folders() -> list[str]:
    """Where Ansible looks for collections by its own configuration (~/.ansible/collections unless the user set
    ANSIBLE_COLLECTIONS_PATH or ansible.cfg), then wherever this Python finds bundled ones (the `ansible` package)."""
    from ansible import constants

    found: list[str] = []
    configured = [str(Path(entry).expanduser()) for entry in constants.COLLECTIONS_PATHS]
    for entry in [*configured, *sys.path]:
        if entry and (Path(entry) / "ansible_collections").is_dir() and entry not in found:
            found.append(entry)
    return found


def _collections_path(run_dir: Path) -> str:
    """The run directory (for gpuinfra.cluster) first, then the folders Ansible itself would use."""
    return os.pathsep.join([str(run_dir), *_collection_folders()])


def check_dependencies(inventory: Mapping[str, Any]) -> None:
    """Refuse a run whose roles call a collection that is not installed, naming the command that installs it.

    ansible-core alone runs a Slurm cluster; the Kubernetes roles call kubernetes.core (galaxy.yml's dependencies
    give the version range). Without this, the run would fail in its first Kubernetes task, hosts half done.
    """
    groups = (inventory.get("all") or {}).get("children") or {}
    if not (groups.get("k8s_control") or {}).get("hosts"):
        return
    from ruamel.yaml import YAML

    dependencies: dict[str, str] = YAML(typ="safe").load(ROOT / "galaxy.yml")["dependencies"]
    folders = [Path(entry) for entry in _collection_folders()]
    for name, versions in dependencies.items():
        if not any((folder / "ansible_collections" / name.replace(".", "/")).is_dir() for folder in folders):
            raise RunError(
                f"the Kubernetes roles need the collection {name}, which Ansible does not find: install it with "
                f"ansible-galaxy collection install '{name}:{versions}'"
            )


def default_forks(hosts: int) -> int | None:
    """Forks for a run of `hosts` hosts when none were asked for: one per host up to MAX_DEFAULT_FORKS, or Ansible's
    own default when the count is unknown (0)."""
    return min(hosts, MAX_DEFAULT_FORKS) if hosts > 0 else None


def envvars(run_dir: Path) -> dict[str, str]:
    env = {
        # ansible-playbook from the same environment as this library, even when it is not on PATH.
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", os.defpath)]),
        "ANSIBLE_COLLECTIONS_PATH": _collections_path(run_dir),
        "ANSIBLE_ROLES_PATH": str(ROOT / "roles"),
        # ansible-runner turns host key checking off unless told otherwise; a cluster file may relax it per
        # connection (connection.host_key_checking), never the run as a whole.
        "ANSIBLE_HOST_KEY_CHECKING": "True",
        # The run's inventory is a source file of the collection's plugin that points to the JSON gpuinfra wrote:
        # loaded as it is, several times faster than Ansible's YAML plugin reads the same file at 10,000 hosts.
        "ANSIBLE_INVENTORY_ENABLED": INVENTORY_PLUGIN,
        "ANSIBLE_INVENTORY_UNPARSED_FAILED": "True",
        "ANSIBLE_NOCOLOR": "True",
        "ANSIBLE_FORCE_COLOR": "False",
        "ANSIBLE_PIPELINING": os.environ.get("ANSIBLE_PIPELINING", "True"),
        # site.yml has a play per concern: gather each host's facts once per run, not once per play.
        "ANSIBLE_GATHERING": os.environ.get("ANSIBLE_GATHERING", "smart"),
    }
    config = config_file(run_dir)
    if config is not None:
        env["ANSIBLE_CONFIG"] = str(config)
    return env


def config_file(run_dir: Path) -> Path | None:
    """The Ansible configuration a run reads, where gpuinfra picks it: the checkout's ansible.cfg when it has one,
    else the run's own (RUN_CONFIG), unless the user has a configuration Ansible would read (ANSIBLE_CONFIG or one
    of USER_CONFIGS): that one is never overridden."""
    if "ANSIBLE_CONFIG" in os.environ:
        return None
    if (ROOT / "ansible.cfg").is_file():
        return ROOT / "ansible.cfg"
    if any(path.expanduser().is_file() for path in USER_CONFIGS):
        return None
    path = run_dir / "ansible.cfg"
    path.write_text(RUN_CONFIG)
    return path


def write_private(path: Path, text: str) -> None:
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)


@contextlib.contextmanager
def run_directory(inventory: Mapping[str, Any]) -> Iterator[Path]:
    """A private directory for one run, removed on the way out whatever happens."""
    run_dir = Path(tempfile.mkdtemp(prefix="gpuinfra-run-"))  # mkdtemp creates it 0700
    try:
        write_private(run_dir / "inventory" / "hosts.json", json.dumps(inventory))
        write_private(run_dir / INVENTORY_SOURCE, f"plugin: {INVENTORY_PLUGIN}\ninventory_file: hosts.json\n")
        link_collection(run_dir)
        # Passing `settings` to runner is ignored when env files are suppressed, so the (secret-free) tuning goes
        # in the one file runner reads for it: poll often, and keep no copy of Ansible's stdout on disk.
        settings = {"pexpect_timeout": POLL_SECONDS, "suppress_output_file": True}
        write_private(run_dir / "env" / "settings", json.dumps(settings))
        yield run_dir
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
