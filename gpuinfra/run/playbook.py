"""Run one playbook of this repository against a cluster's inventory, through ansible-runner.

What a run reports (task names, diffs, failure messages, Ansible's errors and warnings) is redacted: nothing of a
`no_log` task's result, no password hash and no content of a file in the cluster's secrets folders
(gpuinfra/redact.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ansible_runner

from ..collection import ROOT
from ..progress import Change, Event, Failure, RunProgress, Update
from ..redact import Redactor, secrets_folders
from ..unsafe import as_data
from .environment import INVENTORY_SOURCE, check_dependencies, default_forks, envvars, run_directory, write_private
from .result import RunError, RunResult, outcome_of
from .stopping import Stopper, sigint_cancels

PLAYBOOKS = ROOT / "playbooks"
DEFAULT_PLAYBOOK = "site.yml"

# Called with each event's update and the run's progress so far, for a live display.
OnUpdate = Callable[[Update, RunProgress], None]


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


def playbook_path(playbook: str | Path) -> Path:
    path = Path(playbook)
    if not path.is_absolute() and path.parent == Path("."):
        path = PLAYBOOKS / path
    path = path.resolve()
    if not path.is_file():
        raise RunError(f"playbook not found: {path}")
    return path


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
    stopper = Stopper(cancel, options.timeout)

    def on_event(event: Event) -> bool:
        try:
            update = progress.handle(event)
            if update is not None and on_update is not None:
                on_update(update, progress)
        except Exception as exc:  # stops the run at the next poll
            stopper.errors.append(exc)
        return False  # keep no event files: everything needed is in `progress`

    cmdline = " ".join(flag for flag, wanted in (("--check", options.check), ("--diff", options.diff)) if wanted)
    with run_directory(inventory) as run_dir, sigint_cancels(stopper.cancelled):
        stopper.run_dir = run_dir
        limit = options.limit
        if options.only:
            write_private(run_dir / "limit", "\n".join(options.only))
            limit = f"@{run_dir / 'limit'}"
        runner = ansible_runner.run(
            private_data_dir=str(run_dir),
            playbook=str(playbook),
            inventory=str(run_dir / INVENTORY_SOURCE),
            envvars=envvars(run_dir),
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
            cancel_callback=stopper,
        )
    if stopper.errors:
        raise stopper.errors[0]
    status, rc = str(runner.status), int(runner.rc if runner.rc is not None else 1)
    if stopper.timed_out.is_set() and not stopper.cancelled.is_set():
        status = "timeout"
    result = _result(progress, status, rc, playbook, options.check, time.monotonic() - stopper.started)
    # Again with what the folders hold now: the run may have generated secrets that were not there at its start.
    return result.redacted(Redactor.from_folders(folders))


def _result(progress: RunProgress, status: str, rc: int, playbook: Path, check: bool, seconds: float) -> RunResult:
    # Hosts finish tasks in any order; report per host in inventory order, each host's own events in time order.
    order = {host: index for index, host in enumerate(progress.hosts)}

    def by_host(item: Failure | Change) -> int:
        return order[item.host]

    return RunResult(
        outcome=outcome_of(status, rc, progress),
        status=status,
        rc=rc,
        playbook=playbook,
        check=check,
        hosts={name: p.stats for name, p in progress.hosts.items()},
        failures=sorted(progress.failures, key=by_host),
        changes=sorted(progress.changes, key=by_host),
        errors=list(progress.errors),
        warnings=list(progress.warnings),
        duration_s=seconds,
        artifacts=dict(progress.artifacts),
    )
