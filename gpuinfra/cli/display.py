"""How a verb shows a playbook run: a live table per host on a terminal, a line per play, task and notable result
in logs and pipes, and the summary once the run ends (apply, health)."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import TextIO

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from ..progress import HostProgress, HostState, RunProgress, Update
from ..run import OnUpdate, Outcome, RunResult
from .output import Output

# Lines of a diff shown per change in the human summary (--json carries all of it).
_DIFF_LINES = 60


def display(output: Output) -> _Display:
    """The display for this verb's output: live on a terminal, plain lines otherwise, none on stdout under --json
    unless stderr is a terminal."""
    if output.human.isatty():
        return _LiveDisplay(output.console)
    return _PlainDisplay(None if output.as_json else output.human)


class _Display:
    """Context manager yielding the `on_update` callback that run_playbook calls for each event."""

    def __enter__(self) -> OnUpdate:
        return self.update

    def __exit__(self, *exc: object) -> None:
        return None

    def update(self, update: Update, progress: RunProgress) -> None:
        return None


class _PlainDisplay(_Display):
    """One line per play, task and notable result, for logs and pipes (ok and skipped results are only counted)."""

    def __init__(self, stream: TextIO | None) -> None:
        self.stream = stream

    def update(self, update: Update, progress: RunProgress) -> None:
        if self.stream is None:
            return
        if update.kind == "play":
            line = f"PLAY {update.text}"
        elif update.kind == "task":
            line = f"TASK {update.task}"
        elif update.kind == "result" and update.result in ("changed", "failed", "unreachable"):
            line = f"  {update.host}: {update.result}"
        else:
            return
        self.stream.write(line + "\n")
        self.stream.flush()


class _LiveDisplay(_Display):
    """A live table: one row per host with its current task and counts, redrawn a few times a second."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.progress: RunProgress | None = None
        self.started = time.monotonic()
        self.live = Live(console=console, get_renderable=self.render, transient=True, refresh_per_second=4)

    def __enter__(self) -> OnUpdate:
        self.live.start()
        return self.update

    def __exit__(self, *exc: object) -> None:
        self.live.stop()

    def update(self, update: Update, progress: RunProgress) -> None:
        self.progress = progress

    def render(self) -> RenderableType:
        elapsed = f"{time.monotonic() - self.started:.0f}s"
        if self.progress is None:
            return Text(f"Starting ansible-playbook ... {elapsed}")
        title = f"{self.progress.play or ''}  [{elapsed}]"
        rows = list(self.progress.hosts.values())
        room = max(self.console.height - 8, 5)
        shown = sorted(rows, key=_row_order)[:room] if len(rows) > room else rows
        table = _stats_table(title, shown, with_task=True)
        if len(shown) < len(rows):
            return Group(table, Text(f"... and {len(rows) - len(shown)} more hosts"))
        return table


_STATE_STYLE = {"failed": "red", "unreachable": "red", "changed": "yellow", "ok": "green", "running": "cyan"}


def _row_order(row: HostProgress) -> int:
    """Rows that need attention first when not every host fits on screen."""
    return {"failed": 0, "unreachable": 0, "running": 1, "changed": 2}.get(row.state, 3)


def _stats_table(title: str | None, rows: Iterable[HostProgress], with_task: bool) -> Table:
    table = Table(title=title, title_justify="left", show_edge=False, pad_edge=False)
    table.add_column("host", no_wrap=True)
    if with_task:
        table.add_column("task", overflow="ellipsis", no_wrap=True, max_width=60)
    for name in ("ok", "changed", "failed", "unreachable", "skipped"):
        table.add_column(name, justify="right")
    for row in rows:
        stats = row.stats
        cells = [Text(row.name, style=_STATE_STYLE.get(row.state, ""))]
        if with_task:
            cells.append(Text(row.task or ""))
        cells += [Text(str(n)) for n in (stats.ok, stats.changed, stats.failed, stats.unreachable, stats.skipped)]
        table.add_row(*cells)
    return table


def print_summary(console: Console, result: RunResult) -> None:
    """Per-host recap, every failure with host, task and message, pending changes in check mode, a verdict."""
    out = console.print
    if result.hosts:
        if console.is_terminal:
            rows = [
                HostProgress(name, state=_summary_state(s.failed, s.unreachable, s.changed), stats=s)
                for name, s in result.hosts.items()
            ]
            out(_stats_table(None, rows, with_task=False))
        else:
            width = max(len(name) for name in result.hosts)
            for name, s in result.hosts.items():
                out(
                    Text(
                        f"{name:<{width}}  ok={s.ok} changed={s.changed} failed={s.failed} "
                        f"unreachable={s.unreachable} skipped={s.skipped}"
                    )
                )
    for failure in result.failures:
        kind = "UNREACHABLE" if failure.unreachable else "FAILED"
        out(Text(f"\n{kind} {failure.host}: {failure.task}", style="bold red"))
        out(Text(_indent(failure.message)))
    if result.changes and (result.check or _diff_wanted(result)):
        _print_changes(console, result)
    for warning in dict.fromkeys(result.warnings):
        out(Text(f"warning: {warning.splitlines()[0]}", style="yellow"))
    out(Text(_verdict(result), style="bold"))


def _diff_wanted(result: RunResult) -> bool:
    return any(change.diff for change in result.changes)


def _print_changes(console: Console, result: RunResult) -> None:
    heading = "Changes pending (check mode: nothing was changed)" if result.check else "Changes made"
    console.print(Text(f"\n{heading}:", style="bold"))
    by_host: dict[str, list[str]] = {}
    for change in result.changes:
        lines = [f"  ~ {change.task}"]
        if change.diff:
            diff = change.diff.splitlines()
            lines += [f"      {line}" for line in diff[:_DIFF_LINES]]
            if len(diff) > _DIFF_LINES:
                lines.append(f"      ... {len(diff) - _DIFF_LINES} more lines (--json has all of them)")
        by_host.setdefault(change.host, []).extend(lines)
    for host, lines in by_host.items():
        console.print(Text(f"{host}:\n" + "\n".join(lines)))


def _summary_state(failed: int, unreachable: int, changed: int) -> HostState:
    return "unreachable" if unreachable else "failed" if failed else "changed" if changed else "ok"


def _indent(text: str) -> str:
    return "\n".join(f"    {line}" for line in text.splitlines()) or "    (no message)"


def _verdict(result: RunResult) -> str:
    hosts = len(result.hosts)
    changed_hosts = sum(1 for s in result.hosts.values() if s.changed)
    tasks = sum(s.changed for s in result.hosts.values())
    took = f"in {result.duration_s:.0f}s"
    if result.outcome is Outcome.CANCELLED:
        return f"\nCancelled {took}: ansible-playbook was stopped; hosts may be part-way through a task."
    if result.outcome is Outcome.TIMEOUT:
        return (
            f"\nTimed out after {result.duration_s:.0f}s: ansible-playbook was stopped; hosts may be "
            "part-way through a task. Run apply again to finish."
        )
    if result.outcome is Outcome.FAILED:
        failed = sum(1 for s in result.hosts.values() if s.failed)
        unreachable = sum(1 for s in result.hosts.values() if s.unreachable)
        if not failed and not unreachable:
            return f"\nRun failed {took} (runner status {result.status}, rc {result.rc}); see the errors above."
        return f"\nRun failed {took}: {failed} host(s) failed, {unreachable} unreachable, of {hosts}."
    if result.check:
        if tasks:
            return f"\nCheck done {took}: {tasks} change(s) pending on {changed_hosts} of {hosts} host(s)."
        return f"\nCheck done {took}: no changes pending on {hosts} host(s)."
    return f"\nApply complete {took}: {tasks} change(s) on {changed_hosts} of {hosts} host(s)."
