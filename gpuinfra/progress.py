"""What an Ansible run is doing, per host, built from ansible-runner's events.

`RunProgress.handle(event)` folds one runner event into the model and returns an `Update` saying what happened, so
a display can redraw a table or print a line. Counts follow Ansible's recap: `ok` includes `changed`. The final
`playbook_on_stats` event replaces the live counts with Ansible's own.

Nothing of a `no_log` task's result is kept: Ansible sends a `censored` note in its place, and a change it made is
listed without a diff (`HIDDEN_DIFF`). Every text that is kept (names, diffs, messages) goes through the `redact`
function given to `RunProgress` (see gpuinfra/redact.py), so password hashes and secrets stay out of reports.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

# Raw runner events are JSON objects; nothing about their shape is guaranteed, so every read is defensive.
Event = Mapping[str, Any]

HostState = Literal["pending", "running", "ok", "changed", "failed", "unreachable"]
UpdateKind = Literal["play", "task", "result", "message", "stats"]
ResultKind = Literal["ok", "changed", "failed", "unreachable", "skipped", "ignored"]

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_MESSAGE_TAG = re.compile(r"^\[(ERROR|WARNING|DEPRECATION WARNING)\]:?\s*")
HIDDEN = "the output is hidden because the task has no_log: true"
HIDDEN_DIFF = "(the diff is hidden because the task has no_log: true)"
# Lines of command output kept in a failure message: the end of stderr is where the reason usually is.
_OUTPUT_TAIL_LINES = 20

# Stats keys of playbook_on_stats -> HostStats fields.
_STATS_FIELDS = {
    "ok": "ok",
    "changed": "changed",
    "failures": "failed",
    "dark": "unreachable",
    "skipped": "skipped",
    "rescued": "rescued",
    "ignored": "ignored",
}


@dataclass
class HostStats:
    ok: int = 0
    changed: int = 0
    failed: int = 0
    unreachable: int = 0
    skipped: int = 0
    rescued: int = 0
    ignored: int = 0

    def as_dict(self) -> dict[str, int]:
        return dict(vars(self))


@dataclass
class HostProgress:
    name: str
    task: str | None = None
    """Last task started on this host."""
    state: HostState = "pending"
    stats: HostStats = field(default_factory=HostStats)


@dataclass(frozen=True)
class Failure:
    host: str
    task: str
    message: str
    unreachable: bool = False
    action: str = ""
    """The module that failed (`gpuinfra.cluster.gpu_health`), as the task names it."""
    problems: tuple[str, ...] = ()
    """The `problems` list a gpuinfra module returns with its failure (the health verdict), redacted."""
    unknown: tuple[str, ...] = ()
    """Its `unknown` list: what the health check could not look at, redacted."""

    def as_dict(self) -> dict[str, object]:
        return {"host": self.host, "task": self.task, "message": self.message, "unreachable": self.unreachable}


@dataclass(frozen=True)
class Change:
    """A task that changed a host, or would have in check mode; `diff` is filled when the run asked for diffs."""

    host: str
    task: str
    diff: str = ""

    def as_dict(self) -> dict[str, object]:
        return {"host": self.host, "task": self.task, "diff": self.diff}


@dataclass(frozen=True)
class Update:
    kind: UpdateKind
    host: str | None = None
    task: str | None = None
    result: ResultKind | None = None
    text: str | None = None


def _unchanged(text: str) -> str:
    return text


class RunProgress:
    def __init__(self, hosts: Iterable[str] = (), redact: Callable[[str], str] | None = None) -> None:
        self.redact = redact or _unchanged
        """Applied to every text kept or reported: play and task names, diffs, messages."""
        self.hosts: dict[str, HostProgress] = {name: HostProgress(name) for name in hosts}
        self.play: str | None = None
        self.task: str | None = None
        self.failures: list[Failure] = []
        self.changes: list[Change] = []
        self.errors: list[str] = []
        self.warnings: list[str] = []
        self.stats_final = False
        self.artifacts: dict[str, Any] = {}
        """What the playbook published with `ansible.builtin.set_stats` (runner's `artifact_data`): the one
        structured channel from a run back to Python, for playbooks that read state (reports)."""
        self._message: list[str] | None = None  # errors or warnings, while a message's lines are still arriving
        self._hidden_changes: set[tuple[str, str]] = set()  # (host, task uuid) of changed no_log loop items
        self._failed_items: dict[tuple[str, str], list[str]] = {}  # (host, task uuid) -> why each failed item failed

    def host(self, name: str) -> HostProgress:
        return self.hosts.setdefault(name, HostProgress(name))

    def totals(self) -> HostStats:
        total = HostStats()
        for progress in self.hosts.values():
            for key, value in progress.stats.as_dict().items():
                setattr(total, key, getattr(total, key) + value)
        return total

    def handle(self, event: Event) -> Update | None:
        kind = str(event.get("event", ""))
        data = event.get("event_data") or {}
        if kind == "verbose":
            return self._verbose(str(event.get("stdout") or ""))
        self._message = None
        if kind == "playbook_on_play_start":
            self.play = self.redact(str(data.get("play") or data.get("name") or ""))
            return Update("play", text=self.play)
        if kind in ("playbook_on_task_start", "playbook_on_handler_task_start"):
            self.task = self.redact(task_name(data))
            return Update("task", task=self.task)
        if kind == "runner_on_start":
            progress = self.host(str(data.get("host")))
            progress.task = self.redact(task_name(data))
            if progress.state != "unreachable":
                progress.state = "running"
            return None
        if kind in ("runner_on_ok", "runner_on_failed", "runner_on_unreachable", "runner_on_skipped"):
            return self._result(kind, data, str(event.get("stdout") or ""))
        if kind == "runner_item_on_ok":
            res = data.get("res")
            if isinstance(res, Mapping) and hidden(res) and _displayed_changed(str(event.get("stdout") or "")):
                self._hidden_changes.add((str(data.get("host")), str(data.get("task_uuid"))))
            return None
        if kind == "runner_item_on_failed":
            # The loop's own result says only "One or more items failed" (and ansible-core 2.21 no longer marks the
            # failed ones in its `results`): each failed item's event says which and why.
            res = data.get("res")
            res = res if isinstance(res, Mapping) else {}
            key = (str(data.get("host")), str(data.get("task_uuid")))
            self._failed_items.setdefault(key, []).append(HIDDEN if hidden(res) else _item_message(res))
            return None
        if kind == "playbook_on_stats":
            self._stats(data)
            return Update("stats")
        return None

    def _result(self, kind: str, data: Mapping[str, Any], stdout: str = "") -> Update:
        host, task = str(data.get("host")), self.redact(task_name(data))
        failed_items = self._failed_items.pop((host, str(data.get("task_uuid"))), [])
        progress = self.host(host)
        stats = progress.stats
        res = data.get("res")
        res = res if isinstance(res, Mapping) else {}
        result: ResultKind
        if kind == "runner_on_ok":
            stats.ok += 1
            changed = bool(res.get("changed"))
            if hidden(res) and "changed" not in res:
                # ansible-runner sends a no_log result as a bare `censored` note, without `changed`: only Ansible's
                # display line (or those of its loop items) says it. This decides what is listed, never the outcome.
                item = (host, str(data.get("task_uuid")))
                changed = _displayed_changed(stdout) or item in self._hidden_changes
                self._hidden_changes.discard(item)
            result = "changed" if changed else "ok"
            if result == "changed":
                stats.changed += 1
                diff = HIDDEN_DIFF if hidden(res) else self.redact(diff_text(res))
                self.changes.append(Change(host, task, diff))
        elif kind == "runner_on_skipped":
            stats.skipped += 1
            result = "skipped"
        elif kind == "runner_on_unreachable":
            stats.unreachable += 1
            result = "unreachable"
            self.failures.append(Failure(host, task, self.redact(failure_message(res)), unreachable=True))
        elif data.get("ignore_errors"):
            stats.ok += 1
            stats.ignored += 1
            result = "ignored"
        else:
            stats.failed += 1
            result = "failed"
            problems, unknown = (res.get("problems"), res.get("unknown")) if not hidden(res) else (None, None)
            self.failures.append(
                Failure(
                    host,
                    task,
                    self.redact(failure_message(res, failed_items)),
                    action=str(data.get("task_action") or ""),
                    problems=self._texts(problems),
                    unknown=self._texts(unknown),
                )
            )
        progress.state = _state(stats)
        return Update("result", host=host, task=task, result=result)

    def _texts(self, items: Any) -> tuple[str, ...]:
        return tuple(self.redact(str(item)) for item in items) if isinstance(items, list) else ()

    def _stats(self, data: Mapping[str, Any]) -> None:
        per_host: dict[str, HostStats] = {}
        for key, attr in _STATS_FIELDS.items():
            counts = data.get(key) or {}
            for host, count in counts.items():
                setattr(per_host.setdefault(host, HostStats()), attr, int(count))
        for host, stats in per_host.items():
            progress = self.host(host)
            progress.stats = stats
            progress.state = _state(stats)
        self.failures = _unrescued(self.failures, per_host)
        artifacts = data.get("artifact_data")
        self.artifacts = redact_data(dict(artifacts), self.redact) if isinstance(artifacts, Mapping) else {}
        self.stats_final = True

    def _verbose(self, stdout: str) -> Update | None:
        """Ansible's own messages (errors before any task ran, warnings) arrive as display lines."""
        line = self.redact(_ANSI.sub("", stdout).rstrip())
        tag = _MESSAGE_TAG.match(line)
        if tag:
            self._message = self.errors if tag.group(1) == "ERROR" else self.warnings
            self._message.append(line[tag.end() :])
            return Update("message", text=line)
        if self._message is not None and line:
            # Continuation lines (the origin of a syntax error, for one) belong to the message above them.
            self._message[-1] += "\n" + line
        return None


_DISPLAYED_CHANGED = re.compile(r"^changed: \[", re.MULTILINE)


def _displayed_changed(stdout: str) -> bool:
    """Whether Ansible displayed a result as `changed: [host]`."""
    return bool(_DISPLAYED_CHANGED.search(_ANSI.sub("", stdout)))


def _unrescued(failures: list[Failure], stats: Mapping[str, HostStats]) -> list[Failure]:
    """Drop failures that a block's `rescue` handled: their events look like any other failure.

    A host stops at a failure nothing rescues, so its final failures are its last ones; the stats say how many.
    """
    keep: set[int] = set()
    for host, host_stats in stats.items():
        for unreachable, count in ((False, host_stats.failed), (True, host_stats.unreachable)):
            mine = [f for f in failures if f.host == host and f.unreachable is unreachable]
            keep.update(id(f) for f in (mine[len(mine) - count :] if count else []))
    return [f for f in failures if id(f) in keep]


def _state(stats: HostStats) -> HostState:
    if stats.unreachable:
        return "unreachable"
    if stats.failed:
        return "failed"
    return "changed" if stats.changed else "ok"


def redact_data(value: Any, redact: Callable[[str], str]) -> Any:
    """`value` (JSON data) with `redact` applied to every string in it, keys included."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, Mapping):
        return {redact(str(key)): redact_data(item, redact) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [redact_data(item, redact) for item in value]
    return value


def task_name(data: Mapping[str, Any]) -> str:
    """Task name as Ansible prints it: `role : task` for role tasks, the action when the task has no name."""
    name = str(data.get("task") or data.get("name") or data.get("task_action") or "")
    role = data.get("role")
    return f"{role} : {name}" if role and not name.startswith(f"{role} : ") else name


def hidden(res: Mapping[str, Any]) -> bool:
    """True for the result of a `no_log` task, or one with a `no_log` loop item: nothing of it may be shown."""
    items = res.get("results")
    sources = [res, *(items if isinstance(items, list) else [])]
    return any(isinstance(s, Mapping) and (s.get("censored") or s.get("_ansible_no_log")) for s in sources)


def failure_message(res: Mapping[str, Any], failed_items: Sequence[str] = ()) -> str:
    """One readable reason for a failed result: the module's message and the tail of command output, or for a loop
    the messages of its failed items."""
    if hidden(res):
        return HIDDEN
    if failed_items:
        return "\n".join(failed_items)
    return _single_message(res)


def _item_message(item: Mapping[str, Any]) -> str:
    label = item.get("_ansible_item_label", item.get("item"))
    return f"item {label}: {_single_message(item)}"


def _single_message(res: Mapping[str, Any]) -> str:
    msg = str(res.get("msg") or "").strip()
    output = str(res.get("stderr") or "").strip()
    if not output and res.get("rc") not in (None, 0):
        output = str(res.get("stdout") or "").strip()
    if output:
        tail = "\n".join(output.splitlines()[-_OUTPUT_TAIL_LINES:])
        msg = f"{msg}\n{tail}" if msg else tail
    if "rc" in res and res.get("rc") not in (None, 0) and "return code" not in msg:
        msg = f"{msg} (exit status {res['rc']})" if msg else f"exit status {res['rc']}"
    return msg or "failed without a message"


def diff_text(res: Mapping[str, Any]) -> str:
    """A unified diff of what a result changed, from `diff` entries (also those of loop items); none for the result
    of a `no_log` task."""
    if hidden(res):
        return ""
    entries: list[Any] = []
    for source in [res, *[i for i in res.get("results") or [] if isinstance(i, Mapping)]]:
        diff = source.get("diff")
        entries.extend(diff if isinstance(diff, list) else [diff] if isinstance(diff, Mapping) else [])
    return "\n".join(text for entry in entries if (text := _one_diff(entry)))


def _one_diff(entry: Mapping[str, Any]) -> str:
    if entry.get("prepared"):
        return str(entry["prepared"]).rstrip()
    before, after = entry.get("before"), entry.get("after")
    if before is None and after is None:
        return ""
    before_s, after_s = _diff_side(before), _diff_side(after)
    if before_s == after_s:
        return ""
    lines = difflib.unified_diff(
        before_s.splitlines(keepends=True),
        after_s.splitlines(keepends=True),
        fromfile=str(entry.get("before_header") or "before"),
        tofile=str(entry.get("after_header") or "after"),
    )
    return "".join(line if line.endswith("\n") else line + "\n" for line in lines).rstrip()


def _diff_side(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping):
        # Module state diffs such as {"state": "absent"} -> {"state": "directory"}.
        return "".join(f"{key}: {value[key]}\n" for key in sorted(value))
    return f"{value}\n"
