"""The upgrade journal: an append-only record, on the controller, of every node's state.

Each line is one JSON object, flushed and fsynced before the step it records is taken, so after a crash or
Ctrl-C the journal still says which nodes were drained and how far each got. Replaying it gives every node's
last state; a re-run resumes from there.

Entries belong to a target: a driver version (`535.261.03`) or one kernel update (`kernel@2026-11-22T10:00:00Z`).
A run that saw every node to a final state appends a `done` marker (node `*`), so the next kernel update starts a
new target instead of resuming a finished one.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

RUN = "*"  # the node name of run-wide entries


class State(StrEnum):
    DRAINING = "draining"  # recorded before the drain: jobs may still run
    DRAINED = "drained"  # no job left: the node is out of service
    UPGRADING = "upgrading"  # recorded before packages, DKMS, kernel gate and reboot or reload
    GATED = "gated"  # the upgrade and the kernel gate passed, the node runs the new module
    HEALTHY = "healthy"  # the health gate passed
    RESUMED = "resumed"  # back in service: done
    FAILED = "failed"  # left drained, with the reason
    SKIPPED = "skipped"  # drain timed out (resumed untouched) or drained by someone else (left alone); reported
    DONE = "done"  # run marker: every node reached a final state


FINAL = {State.RESUMED, State.FAILED, State.SKIPPED}


@dataclass(frozen=True)
class Entry:
    node: str
    state: State
    target: str
    reason: str = ""
    time: float = 0.0


class JournalBusy(Exception):
    """Another controller holds the journal: two runs at once would each keep their own window."""


class Journal:
    def __init__(self, path: Path) -> None:
        self.path = path

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        """Hold the journal's lock for a whole run; raises JournalBusy when another process has it."""
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(self.path.with_name(self.path.name + ".lock"), os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise JournalBusy(f"another gpuinfra upgrade is running on {self.path}") from None
            yield
        finally:
            os.close(fd)  # closing releases the lock

    def record(self, node: str, state: State, target: str, reason: str = "") -> Entry:
        entry = Entry(node, state, target, reason, time.time())
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        line = json.dumps({"node": node, "state": state.value, "target": target, "reason": reason, "time": entry.time})
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        with os.fdopen(fd, "a") as fh:
            fh.write(line + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        return entry

    def entries(self) -> list[Entry]:
        if not self.path.exists():
            return []
        out = []
        for line in self.path.read_text().splitlines():
            try:
                raw = json.loads(line)
                out.append(
                    Entry(raw["node"], State(raw["state"]), raw["target"], raw.get("reason", ""), raw.get("time", 0.0))
                )
            except (ValueError, KeyError, TypeError):
                continue  # a line cut short by a crash mid-write: the step it names was never taken
        return out

    def last_states(self, target: str) -> dict[str, Entry]:
        """Each node's latest entry for this target version."""
        latest: dict[str, Entry] = {}
        for entry in self.entries():
            if entry.target == target and entry.node != RUN:
                latest[entry.node] = entry
        return latest

    def out_of_service(self, target: str) -> list[Entry]:
        """Nodes drained (or draining) and not yet resumed: what a crash may have left behind."""
        return [e for e in self.last_states(target).values() if e.state not in FINAL or e.state is State.FAILED]

    def finished(self, target: str) -> bool:
        return any(e.node == RUN and e.state is State.DONE and e.target == target for e in self.entries())

    def open_target(self, prefix: str) -> str | None:
        """The latest target starting with `prefix`, when it has no `done` marker: a run to resume."""
        targets = [e.target for e in self.entries() if e.target.startswith(prefix)]
        if not targets or self.finished(targets[-1]):
            return None
        return targets[-1]
