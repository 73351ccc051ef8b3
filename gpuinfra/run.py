"""Run a playbook of this repository against a cluster's inventory, through ansible-runner.

Every run gets a private run directory (0700, removed afterwards) holding the inventory, a link that makes the
repository root the collection `gpuinfra.cluster`, runner tuning settings and runner's artifacts. Secrets never go
there: no passwords, ssh keys, extra vars or environment files are written.

The outcome comes from runner's status and rc and from Ansible's final stats, never from parsing output. What a run
reports (task names, diffs, failure messages, Ansible's errors and warnings) is redacted: nothing of a `no_log`
task's result, no password hash and no content of a file in the cluster's secrets folders (gpuinfra/redact.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from types import FrameType
from typing import Any

import ansible_runner
import psutil

from .collection import ROOT, link_collection
from .errors import GpuinfraError
from .progress import Change, Event, Failure, HostStats, RunProgress, Update, redact_data
from .redact import Redactor, secrets_folders
from .render.inventory import as_data, inventory_yaml
from .validate.load import LoadedCluster

PLAYBOOKS = ROOT / "playbooks"
DEFAULT_PLAYBOOK = "site.yml"

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
_POLL_SECONDS = 0.2


# Called with each event's update and the run's progress so far, for a live display.
OnUpdate = Callable[[Update, RunProgress], None]


class RunError(GpuinfraError):
    """A run that could not be started: missing playbook, unusable inventory or limit."""


class Outcome(StrEnum):
    OK = "ok"
    CHANGED = "changed"
    FAILED = "failed"
    TIMEOUT = "timeout"
    CANCELLED = "cancelled"


@dataclass(frozen=True)
class RunOptions:
    playbook: str | Path = DEFAULT_PLAYBOOK
    """A file name under playbooks/ (`site.yml`, `upgrade_driver.yml`) or a path to a playbook."""
    limit: str | None = None
    only: tuple[str, ...] = ()
    """These hosts only, by name, instead of `limit`: written to a file of the run directory that the limit names
    (`--limit @FILE`), since 10,000 names are too long for one argument."""
    tags: tuple[str, ...] = ()
    skip_tags: tuple[str, ...] = ()
    check: bool = False
    diff: bool = False
    timeout: int | None = None
    """Seconds the whole run may take; past it, the run is stopped and the outcome is TIMEOUT."""
    forks: int | None = None
    extra_vars: Mapping[str, Any] = field(default_factory=dict)
    """Passed on ansible-playbook's command line, so visible to other local users: never put secrets here."""


@dataclass(frozen=True)
class RunResult:
    outcome: Outcome
    status: str
    """ansible-runner's status: successful, failed, timeout or canceled."""
    rc: int
    playbook: Path
    check: bool
    hosts: dict[str, HostStats]
    failures: list[Failure]
    changes: list[Change]
    """Tasks that changed a host, or would have in check mode."""
    errors: list[str]
    warnings: list[str]
    duration_s: float
    artifacts: dict[str, Any] = field(default_factory=dict)
    """Data the playbook published with `ansible.builtin.set_stats` (aggregated, not per host): structured
    results of playbooks that read state, such as playbooks/report.yml."""

    @property
    def changed(self) -> bool:
        return any(stats.changed for stats in self.hosts.values())

    def redacted(self, redact: Callable[[str], str]) -> RunResult:
        """The same result with `redact` applied to every text that came from the run."""
        return dataclasses.replace(
            self,
            failures=[dataclasses.replace(f, task=redact(f.task), message=redact(f.message)) for f in self.failures],
            changes=[dataclasses.replace(c, task=redact(c.task), diff=redact(c.diff)) for c in self.changes],
            errors=[redact(e) for e in self.errors],
            warnings=[redact(w) for w in self.warnings],
            artifacts=redact_data(self.artifacts, redact),
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "status": self.outcome.value,
            "check": self.check,
            "playbook": str(self.playbook),
            "runner": {"status": self.status, "rc": self.rc},
            "duration_s": round(self.duration_s, 3),
            "hosts": {name: stats.as_dict() for name, stats in self.hosts.items()},
            "failures": [f.as_dict() for f in self.failures],
            "changes": [c.as_dict() for c in self.changes],
            "errors": self.errors,
            "warnings": self.warnings,
        }


def playbook_path(playbook: str | Path) -> Path:
    path = Path(playbook)
    if not path.is_absolute() and path.parent == Path("."):
        path = PLAYBOOKS / path
    path = path.resolve()
    if not path.is_file():
        raise RunError(f"playbook not found: {path}")
    return path


def cluster_inventory(loaded: LoadedCluster) -> dict[str, Any]:
    """The inventory of a loaded cluster. Its key and known_hosts paths are absolute (the loader takes `~/` from
    the home folder and relative paths from the cluster file's folder), since a run works in its run directory."""
    return inventory_yaml(loaded.resolved)


def target_hosts(inventory: Mapping[str, Any], limit: str | None = None) -> list[str]:
    """Hosts a run would touch, in inventory order, by Ansible's own rules for `limit` (groups, globs, !, &, ~re)."""
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader

    all_group = inventory.get("all") or {}
    children = all_group.get("children") or {}
    order = dict.fromkeys(all_group.get("hosts") or {})  # a dict keeps the order and finds a host at once
    for body in children.values():
        order.update(dict.fromkeys((body or {}).get("hosts") or {}))
    if not limit:  # every host: no need to build Ansible's inventory, seconds at 10,000 hosts
        return list(order)
    manager = InventoryManager(loader=DataLoader(), sources=None, parse=False)
    for host in all_group.get("hosts") or {}:
        manager.add_host(host)
    for group, body in children.items():
        manager.add_group(group)
        for host in (body or {}).get("hosts") or {}:
            manager.add_host(host, group=group)
    manager.reconcile_inventory()
    # Ansible prints its pattern warnings itself; the run reports them again as events, so keep this quiet.
    with contextlib.redirect_stderr(io.StringIO()):
        manager.subset(limit)
        matched = {host.name for host in manager.get_hosts("all")}
    return [host for host in order if host in matched]


def matching(inventory: Mapping[str, Any], hosts: list[str], limit: str | None) -> list[str]:
    """Those of `hosts` that `limit` matches, in their order; all of them when there is no limit."""
    if not limit:
        return hosts
    wanted = set(target_hosts(inventory, limit))
    return [host for host in hosts if host in wanted]


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


def _envvars(run_dir: Path) -> dict[str, str]:
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
    config = _config_file(run_dir)
    if config is not None:
        env["ANSIBLE_CONFIG"] = str(config)
    return env


def _config_file(run_dir: Path) -> Path | None:
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


def _write_private(path: Path, text: str) -> None:
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)


@contextlib.contextmanager
def run_directory(inventory: Mapping[str, Any]) -> Iterator[Path]:
    """A private directory for one run, removed on the way out whatever happens."""
    run_dir = Path(tempfile.mkdtemp(prefix="gpuinfra-run-"))  # mkdtemp creates it 0700
    try:
        _write_private(run_dir / "inventory" / "hosts.json", json.dumps(inventory))
        _write_private(run_dir / INVENTORY_SOURCE, f"plugin: {INVENTORY_PLUGIN}\ninventory_file: hosts.json\n")
        link_collection(run_dir)
        # Passing `settings` to runner is ignored when env files are suppressed, so the (secret-free) tuning goes
        # in the one file runner reads for it: poll often, and keep no copy of Ansible's stdout on disk.
        settings = {"pexpect_timeout": _POLL_SECONDS, "suppress_output_file": True}
        _write_private(run_dir / "env" / "settings", json.dumps(settings))
        yield run_dir
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


@contextlib.contextmanager
def _sigint_cancels(cancelled: threading.Event) -> Iterator[None]:
    """Ctrl-C during the run asks runner to stop ansible-playbook instead of unwinding past it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_sigint(signum: int, frame: FrameType | None) -> None:
        cancelled.set()

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def one_line(text: str, limit: int = 500) -> str:
    """A message from a run on one line, cut at `limit` characters."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


# How long ansible-playbook has, once asked to stop, to stop its workers and their commands.
STOP_GRACE_SECONDS = 10


def stop_ansible(run_dir: Path) -> None:
    """Stop this run's ansible-playbook and everything it started. Runner's own stop kills the process group of
    ansible-playbook, but each of its workers leads a group of its own (ansible-core 2.19 and later), so a task's
    command (an apt run, a reboot, a drain) would go on after the run reported it stopped. SIGTERM lets
    ansible-playbook stop its workers; whatever of the run is still alive after the grace period is killed."""
    ours = [p for p in psutil.Process().children() if _belongs(p, run_dir)]
    started = [child for p in ours for child in _children(p)]
    for process in ours:
        with contextlib.suppress(psutil.Error):
            process.terminate()
    # ansible-playbook itself is runner's to reap (pexpect waits for it); only what it started is waited for here.
    _, alive = psutil.wait_procs(started, timeout=STOP_GRACE_SECONDS)
    for process in alive:
        with contextlib.suppress(psutil.Error):
            process.kill()


def _belongs(process: psutil.Process, run_dir: Path) -> bool:
    with contextlib.suppress(psutil.Error):
        return any(str(run_dir) in argument for argument in process.cmdline())
    return False


def _children(process: psutil.Process) -> list[psutil.Process]:
    with contextlib.suppress(psutil.Error):
        return list(process.children(recursive=True))
    return []


def _outcome(status: str, rc: int, progress: RunProgress) -> Outcome:
    if status == "canceled":
        return Outcome.CANCELLED
    if status == "timeout":
        return Outcome.TIMEOUT
    totals = progress.totals()
    if status != "successful" or rc != 0 or totals.failed or totals.unreachable:
        return Outcome.FAILED
    return Outcome.CHANGED if totals.changed else Outcome.OK


def run_playbook(
    inventory: Mapping[str, Any],
    options: RunOptions | None = None,
    *,
    hosts: list[str] | None = None,
    on_update: OnUpdate | None = None,
    cancel: Callable[[], bool] | None = None,
) -> RunResult:
    """Run one playbook and return what happened.

    `hosts` seeds the progress model so every targeted host has a row before its first task. `on_update` is called
    in this thread for every event that changed the model. `cancel` is polled; returning True stops the run, as
    does Ctrl-C when this runs in the main thread (outcome CANCELLED either way).
    """
    options = options or RunOptions()
    playbook = playbook_path(options.playbook)
    check_dependencies(inventory)
    folders = secrets_folders(inventory, options.extra_vars)
    progress = RunProgress(hosts or [], redact=Redactor.from_folders(folders))
    cancelled = threading.Event()
    callback_error: list[BaseException] = []

    def on_event(event: Event) -> bool:
        try:
            update = progress.handle(event)
            if update is not None and on_update is not None:
                on_update(update, progress)
        except Exception as exc:  # a display bug must stop the run cleanly, not leave ansible-playbook behind
            callback_error.append(exc)
        return False  # keep no event files: everything needed is in `progress`

    timed_out, stopped = threading.Event(), threading.Event()

    def should_cancel() -> bool:
        try:
            if cancel is not None and cancel():
                cancelled.set()
        except Exception as exc:  # same reason as above
            callback_error.append(exc)
        if options.timeout and time.monotonic() - started > options.timeout:
            timed_out.set()
        stop = cancelled.is_set() or timed_out.is_set() or bool(callback_error)
        if stop and not stopped.is_set():
            stopped.set()
            stop_ansible(run_dir)
        return stop

    cmdline = " ".join(flag for flag, wanted in (("--check", options.check), ("--diff", options.diff)) if wanted)
    started = time.monotonic()
    with run_directory(inventory) as run_dir, _sigint_cancels(cancelled):
        limit = options.limit
        if options.only:
            _write_private(run_dir / "limit", "\n".join(options.only))
            limit = f"@{run_dir / 'limit'}"
        runner = ansible_runner.run(
            private_data_dir=str(run_dir),
            playbook=str(playbook),
            inventory=str(run_dir / INVENTORY_SOURCE),
            envvars=_envvars(run_dir),
            limit=limit,
            tags=",".join(options.tags) or None,
            skip_tags=",".join(options.skip_tags) or None,
            forks=options.forks or default_forks(len(hosts or ())),
            # Extra vars carry what hosts reported (health problems, XID texts, process names) as often as an
            # admin's settings: as data, never templates, exactly as the inventory's values are.
            extravars=as_data(dict(options.extra_vars)) or None,
            cmdline=cmdline or None,
            quiet=True,
            suppress_env_files=True,
            event_handler=on_event,
            cancel_callback=should_cancel,
        )
    if callback_error:
        raise callback_error[0]
    status, rc = str(runner.status), int(runner.rc if runner.rc is not None else 1)
    if timed_out.is_set() and not cancelled.is_set():
        status = "timeout"
    # Hosts finish tasks in any order; report per host in inventory order, each host's own events in time order.
    order = {host: index for index, host in enumerate(progress.hosts)}

    def by_host(item: Failure | Change) -> int:
        return order[item.host]

    result = RunResult(
        outcome=_outcome(status, rc, progress),
        status=status,
        rc=rc,
        playbook=playbook,
        check=options.check,
        hosts={name: p.stats for name, p in progress.hosts.items()},
        failures=sorted(progress.failures, key=by_host),
        changes=sorted(progress.changes, key=by_host),
        errors=list(progress.errors),
        warnings=list(progress.warnings),
        duration_s=time.monotonic() - started,
        artifacts=dict(progress.artifacts),
    )
    # Again with what the folders hold now: the run may have generated secrets that were not there at its start.
    return result.redacted(Redactor.from_folders(folders))
