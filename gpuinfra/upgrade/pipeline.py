"""The controller side of a rolling upgrade: per-node phases, the journal between them, the window around them.

Each node goes through four phases, each one run of Ansible limited to that node (see `ansible.py`):

    drain    drain with a reason naming the upgrade, wait until DRAINED (or give up after the timeout)
    upgrade  stop the GPU clients, packages, DKMS, kernel gate, module reload or reboot
    health   the health gate
    resume   back in service

The journal entry for a phase is written before the phase starts (DRAINING before any drain), and its result
after it ends, so a node is never out of service without a record. Re-running picks every node up at its last
recorded state, except that a node left before or inside `upgrade` is drained again first: the journal says it was
drained, but someone may have resumed it since, and the upgrade must never run under a job. Draining a drained node
changes nothing. The journal only resumes: a node the caller found without the target installed (`off_target`) is
taken through every phase again, whatever an earlier run recorded for it. Nodes run in worker threads, never more
than the window allows.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Literal

from .journal import FINAL, RUN, Journal, State
from .rolling_window import RollingWindow


@dataclass(frozen=True)
class Phase:
    name: str
    """The playbook tag that runs this phase."""
    before: State | None
    """Recorded before the phase starts (None: the state before it says enough)."""
    after: State
    """Recorded when it succeeds."""


PHASES: tuple[Phase, ...] = (
    Phase("drain", State.DRAINING, State.DRAINED),
    Phase("upgrade", State.UPGRADING, State.GATED),
    Phase("health", None, State.HEALTHY),
    Phase("resume", None, State.RESUMED),
)

# Last recorded state -> index of the phase to run next. The drain is re-asserted before any host change.
_NEXT_PHASE = {
    State.DRAINING: 0,
    State.DRAINED: 0,
    State.UPGRADING: 0,
    State.GATED: 2,
    State.HEALTHY: 3,
}


@dataclass(frozen=True)
class PhaseResult:
    status: Literal["ok", "failed", "skipped", "cancelled"]
    reason: str = ""


# Runs one phase on one node: (node, phase name) -> result. The real one runs Ansible; tests pass their own.
Executor = Callable[[str, str], PhaseResult]
# Told about every state recorded: (node, state, reason).
Listener = Callable[[str, State, str], None]


class Interrupted(Exception):
    """The run was cancelled (Ctrl-C); the journal holds every node's state, and a re-run resumes."""


@dataclass
class UpgradeReport:
    target: str
    states: dict[str, State] = field(default_factory=dict)
    reasons: dict[str, str] = field(default_factory=dict)
    peak_unavailable: int = 0
    stopped: bool = False
    """Failures passed max_failures (or filled the window), so some nodes were never started."""
    not_started: list[str] = field(default_factory=list)
    found: dict[str, str] = field(default_factory=dict)
    """The driver version each node had installed before the run (driver upgrades)."""
    left: dict[str, str] = field(default_factory=dict)
    """The driver version each node the run worked on has installed after it."""
    current: list[str] = field(default_factory=list)
    """Nodes that already had the target installed, and were left alone."""

    def nodes_in(self, state: State) -> list[str]:
        return [node for node, s in self.states.items() if s is state]

    @property
    def complete(self) -> bool:
        return not self.not_started and all(s is State.RESUMED for s in self.states.values())


@dataclass
class Rollout:
    journal: Journal
    target: str
    nodes: Sequence[str]
    executor: Executor
    max_unavailable: int = 1
    canary: int = 1
    max_failures: int = 0
    health_gate: bool = True
    retry_failed: bool = False
    off_target: Collection[str] = ()
    """Nodes found without the target installed: an earlier run's RESUMED or SKIPPED for them is stale (a cluster
    made again, a package moved off its pin since), so they start again from the drain."""
    listener: Listener | None = None
    cancel: threading.Event = field(default_factory=threading.Event)

    def run(self) -> UpgradeReport:
        """Take every node to the target, or as far as the failure policy allows.

        Raises Interrupted when cancelled, after the running phases have stopped; re-raises anything else a
        worker raised (a crash), in both cases with the journal as the only record of where nodes are.
        """
        stale = {State.RESUMED, State.SKIPPED}
        latest = {
            n: e
            for n, e in self.journal.last_states(self.target).items()
            if n in self.nodes and not (n in self.off_target and e.state in stale)
        }
        failed = [n for n, e in latest.items() if e.state is State.FAILED]
        # Retried failures are still drained: like interrupted nodes, they go first.
        retried = failed if self.retry_failed else []
        window = RollingWindow(list(self.nodes), self.max_unavailable, self.canary, self.max_failures)
        window.restore(
            succeeded=[n for n, e in latest.items() if e.state is State.RESUMED],
            failed=[n for n in failed if n not in retried],
            in_flight=[n for n, e in latest.items() if e.state not in FINAL] + retried,
        )
        report = UpgradeReport(self.target)
        report.peak_unavailable = window.out_of_service
        with ThreadPoolExecutor(max_workers=max(self.max_unavailable, len(window.resuming), 1)) as pool:
            running: dict[Future[State], str] = {}
            try:
                while True:
                    if not self.cancel.is_set():
                        for node in window.startable():
                            window.started(node)
                            start = latest.get(node)
                            running[pool.submit(self._node, node, start.state if start else None)] = node
                    report.peak_unavailable = max(report.peak_unavailable, window.out_of_service)
                    if not running:
                        break
                    done, _ = wait(running, return_when=FIRST_COMPLETED)
                    for future in done:
                        node = running.pop(future)
                        state = future.result()  # a worker's crash propagates from here
                        window.finished(node, ok=state is State.RESUMED, skipped=state is State.SKIPPED)
            except BaseException:
                self.cancel.set()  # stop the other workers between (or inside) their phases
                raise
        if self.cancel.is_set():
            raise Interrupted(f"cancelled; the journal {self.journal.path} records where every node is")
        final = self.journal.last_states(self.target)
        for node in self.nodes:  # in the rollout's order, not the order workers happened to finish in
            if node in final:
                report.states[node] = final[node].state
                report.reasons[node] = final[node].reason
        report.not_started = list(window.pending)
        report.stopped = bool(window.pending)
        if not window.pending and not window.failed:
            self.journal.record(RUN, State.DONE, self.target)
        return report

    def _record(self, node: str, state: State, reason: str = "") -> None:
        self.journal.record(node, state, self.target, reason)
        if self.listener is not None:
            self.listener(node, state, reason)

    def _node(self, node: str, last: State | None) -> State:
        """One node through its remaining phases; returns its final state. Raises Interrupted when cancelled."""
        first = 0 if last is None or last in FINAL else _NEXT_PHASE[last]
        for phase in PHASES[first:]:
            if self.cancel.is_set():
                raise Interrupted(f"{node}: stopped before {phase.name}")
            if phase.name == "health" and not self.health_gate:
                self._record(node, State.HEALTHY, "health gate off (upgrade.health_gate: false)")
                continue
            if phase.before is not None:
                self._record(node, phase.before)
            result = self.executor(node, phase.name)
            if result.status == "cancelled":
                raise Interrupted(f"{node}: {phase.name} cancelled")
            if result.status == "skipped":
                self._record(node, State.SKIPPED, result.reason)
                return State.SKIPPED
            if result.status == "failed":
                self._record(node, State.FAILED, f"{phase.name}: {result.reason}")
                return State.FAILED
            self._record(node, phase.after)
            last = phase.after
        return State.RESUMED
