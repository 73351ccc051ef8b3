"""`gpuinfra apply FILE`: validate, show the plan, confirm, then run playbooks/site.yml with per-host progress.

Human output goes to stdout (stderr for errors); with --json, stdout holds exactly one JSON document and any
progress display moves to stderr. The progress displays and the summary here are meant for every verb that runs a
playbook (`upgrade`, `health`).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Iterable
from typing import Any, TextIO

import hostlist
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from ..errors import InvalidInput
from ..progress import HostProgress, HostState, RunProgress, Update
from ..render.plan import RenderError, render
from ..run import Outcome, RunError, RunOptions, RunResult, cluster_inventory, run_playbook, target_hosts
from ..validate.load import LoadedCluster, load_cluster
from . import exitcodes
from .common import DEFAULT_CLUSTER, add_json, print_diagnostics, print_json

_EXIT = {
    Outcome.OK: exitcodes.OK,
    Outcome.FAILED: exitcodes.FAILED,
    Outcome.TIMEOUT: exitcodes.TIMEOUT,
    Outcome.CANCELLED: exitcodes.CANCELLED,
}
# Lines of a diff shown per change in the human report (--json carries all of it).
_DIFF_LINES = 60


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("apply", help="make the hosts match the cluster file (plan, confirm, run)")
    parser.add_argument(
        "file", nargs="?", default=DEFAULT_CLUSTER, metavar="FILE", help=f"cluster file (default: {DEFAULT_CLUSTER})"
    )
    parser.add_argument("-y", "--yes", action="store_true", help="apply without asking for confirmation")
    parser.add_argument(
        "--check",
        action="store_true",
        help="dry run against the real hosts (Ansible check mode): report what would change",
    )
    parser.add_argument("--diff", action="store_true", help="show the changes to files and settings, per host")
    parser.add_argument("--limit", metavar="PATTERN", help="only these hosts or groups (Ansible host pattern)")
    parser.add_argument("--tags", metavar="TAGS", help="only tasks with these tags (comma-separated)")
    parser.add_argument("--skip-tags", metavar="TAGS", help="skip tasks with these tags (comma-separated)")
    parser.add_argument("--forks", type=_positive_int, metavar="N", help="hosts worked on in parallel")
    parser.add_argument(
        "--full",
        action="store_true",
        help="run every role on every host, even where its receipt shows that nothing changed since the last apply",
    )
    parser.add_argument(
        "--timeout",
        type=_positive_int,
        metavar="SECONDS",
        help=f"stop the run after SECONDS (exit {exitcodes.TIMEOUT})",
    )
    parser.add_argument(
        "--detailed-exitcode",
        action="store_true",
        help=f"exit {exitcodes.CHANGES_PENDING} when the run changed (or, with --check, would "
        f"change) anything, {exitcodes.OK} when nothing",
    )
    add_json(parser)
    parser.set_defaults(func=run)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def _tags(text: str | None) -> tuple[str, ...]:
    return tuple(tag.strip() for tag in (text or "").split(",") if tag.strip())


def run(args: argparse.Namespace) -> int:
    report = _ApplyReport(args)
    try:
        loaded = load_cluster(args.file)
    except InvalidInput as exc:
        return report.invalid(exc)
    report.warnings = [d.as_dict() for d in loaded.warnings]
    if not args.json:
        print_diagnostics(loaded.warnings)

    inventory = cluster_inventory(loaded)
    targets = target_hosts(inventory, args.limit)
    if not targets:
        return report.refuse(f"--limit {args.limit!r} matches no host of cluster {loaded.model.name!r}")
    try:
        files = len(render(loaded.resolved))
    except RenderError as exc:
        return report.error(f"cannot plan: {exc}", exitcodes.FAILED)
    report.plan(loaded, targets, files)

    if not args.check and not args.yes:
        if not sys.stdin.isatty():
            return report.refuse("stdin is not a terminal, so no one can confirm; pass --yes to apply anyway")
        if not report.confirm(len(targets)):
            return report.error("apply cancelled; nothing was run", exitcodes.CANCELLED)

    options = RunOptions(
        limit=args.limit,
        tags=_tags(args.tags),
        skip_tags=_tags(args.skip_tags),
        check=args.check,
        diff=args.diff,
        timeout=args.timeout,
        forks=args.forks,
        extra_vars={"gpuinfra_full": True} if args.full else {},
    )
    try:
        with report.display() as on_update:
            result = run_playbook(inventory, options, hosts=targets, on_update=on_update)
    except RunError as exc:
        return report.error(str(exc), exitcodes.FAILED)
    return report.result(result, targets)


class _ApplyReport:
    """Everything apply prints, in one place: human text on a rich console, or one JSON document."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.as_json: bool = args.json
        # Human output: stdout normally; stderr with --json so stdout stays one JSON document.
        self.stream: TextIO = sys.stderr if self.as_json else sys.stdout
        self.console = Console(file=self.stream, highlight=False, soft_wrap=True)
        self.warnings: list[dict[str, object]] = []  # the cluster file's warnings, for --json

    def _exit(self, code: int, doc: dict[str, Any]) -> int:
        if self.as_json:
            extra = {"diagnostics": self.warnings} if self.warnings and "diagnostics" not in doc else {}
            print_json({**doc, "exit_code": code, "file": self.args.file, **extra})
        return code

    def invalid(self, exc: InvalidInput) -> int:
        if self.as_json:
            return self._exit(
                exitcodes.INVALID_INPUT, {"status": "invalid", "diagnostics": [d.as_dict() for d in exc.diagnostics]}
            )
        print_diagnostics(exc.diagnostics)
        count = len(exc.errors)
        print(f"{self.args.file}: {count} error{'s' if count != 1 else ''}; nothing was run", file=sys.stderr)
        return exitcodes.INVALID_INPUT

    def refuse(self, message: str) -> int:
        return self.error(message, exitcodes.INVALID_INPUT)

    def error(self, message: str, code: int) -> int:
        print(f"gpuinfra apply: {message}", file=sys.stderr)
        status = {exitcodes.INVALID_INPUT: "invalid", exitcodes.CANCELLED: "cancelled"}.get(code, "failed")
        return self._exit(code, {"status": status, "errors": [message]})

    def plan(self, loaded: LoadedCluster, targets: list[str], files: int) -> None:
        if self.as_json and not self.stream.isatty():
            return
        wanted = set(targets)
        mode = "check (dry run: hosts are not changed)" if self.args.check else "apply"
        lines = [
            f"Cluster {loaded.model.name} ({self.args.file}): {mode}, playbooks/site.yml",
            f"  hosts: {len(targets)} of {len(loaded.resolved.hosts)}",
        ]
        for name, group in loaded.model.node_groups.items():
            members = [h.name for h in loaded.resolved.hosts.values() if h.group == name and h.name in wanted]
            if members:
                lines.append(f"    {name} ({', '.join(group.roles)}): {hostlist.collect_hostlist(members)}")
        if self.args.tags or self.args.skip_tags:
            lines.append(
                f"  tags: {self.args.tags or 'all'}"
                + (f", skipping {self.args.skip_tags}" if self.args.skip_tags else "")
            )
        if files:
            lines.append(f"  {files} configuration files rendered from the model (`gpuinfra plan` shows them)")
        self.console.print(Text("\n".join(lines)))

    def confirm(self, count: int) -> bool:
        self.stream.write(f"\nApply to {count} host{'s' if count != 1 else ''}? Only 'yes' is accepted: ")
        self.stream.flush()
        try:
            return sys.stdin.readline().strip() == "yes"
        except EOFError:
            return False

    def display(self) -> _Display:
        if self.stream.isatty():
            return _LiveDisplay(self.console)
        return _PlainDisplay(None if self.as_json else self.stream)

    def result(self, result: RunResult, targets: list[str]) -> int:
        code = _EXIT.get(result.outcome, exitcodes.OK)
        if result.outcome is Outcome.CHANGED:
            code = exitcodes.CHANGES_PENDING if self.args.detailed_exitcode else exitcodes.OK
        if self.as_json:
            return self._exit(code, {**result.as_dict(), "limit": self.args.limit, "targets": targets})
        for error in result.errors:
            print(f"ansible: {error}", file=sys.stderr)
        print_summary(self.console, result)
        return code


OnUpdate = Callable[[Update, RunProgress], None]


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
