"""The upgrade journal: an append-only record, on the controller, of every node's state.

Each line is one JSON object, flushed and fsynced before the step it records is taken, so after a crash or
Ctrl-C the journal still says which nodes were drained and how far each got. Replaying it gives every node's
last state; a re-run resumes from there.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path


class State(StrEnum):
    DRAINING = "draining"  # drain requested; jobs may still run
    DRAINED = "drained"  # no job left: the node is out of service
    UPGRADING = "upgrading"
    GATED = "gated"  # the kernel gate passed
    REBOOTING = "rebooting"
    HEALTHY = "healthy"  # the health gate passed
    RESUMED = "resumed"  # back in service: done
    FAILED = "failed"  # left drained, with the reason
    SKIPPED = "skipped"  # drain timed out; resumed untouched, reported


FINAL = {State.RESUMED, State.FAILED, State.SKIPPED}


@dataclass(frozen=True)
class Entry:
    node: str
    state: State
    target: str
    reason: str = ""
    time: float = 0.0


class Journal:
    def __init__(self, path: Path) -> None:
        self.path = path

    def record(self, node: str, state: State, target: str, reason: str = "") -> Entry:
        entry = Entry(node, state, target, reason, time.time())
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        line = json.dumps({"node": node, "state": state.value, "target": target, "reason": reason,
                           "time": entry.time})
        with self.path.open("a") as fh:
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
                out.append(Entry(raw["node"], State(raw["state"]), raw["target"], raw.get("reason", ""),
                                 raw.get("time", 0.0)))
            except (ValueError, KeyError):
                continue  # a line cut short by a crash mid-write: the step it names was never taken
        return out

    def last_states(self, target: str) -> dict[str, Entry]:
        """Each node's latest entry for this target version."""
        latest: dict[str, Entry] = {}
        for entry in self.entries():
            if entry.target == target:
                latest[entry.node] = entry
        return latest

    def out_of_service(self, target: str) -> list[Entry]:
        """Nodes drained (or draining) and not yet resumed: what a crash may have left behind."""
        return [e for e in self.last_states(target).values() if e.state not in FINAL or e.state is State.FAILED]


def split_outcomes(entries: Iterable[Entry]) -> tuple[list[str], list[str]]:
    """(succeeded, failed) nodes from a journal's latest entries."""
    ok = [e.node for e in entries if e.state is State.RESUMED]
    failed = [e.node for e in entries if e.state is State.FAILED]
    return ok, failed
