"""`gpuinfra apply FILE`: validate, show the plan, confirm, then run playbooks/site.yml with per-host progress.

Human output goes to stdout (stderr for errors); with --json, stdout holds exactly one JSON document and any
progress display moves to stderr (cli/output.py, cli/display.py).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import hostlist
from rich.text import Text

from ..apply import ApplyPlan, apply, plan_apply
from ..errors import Refused
from ..run import Outcome, RunError, RunOptions, RunResult
from . import exitcodes
from .common import DEFAULT_CLUSTER, add_json
from .display import display, print_summary
from .output import Output

_EXIT = {
    Outcome.OK: exitcodes.OK,
    Outcome.FAILED: exitcodes.FAILED,
    Outcome.TIMEOUT: exitcodes.TIMEOUT,
    Outcome.CANCELLED: exitcodes.CANCELLED,
}


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
    parser.add_argument(
        "--forks",
        type=_positive_int,
        metavar="N",
        help="hosts worked on in parallel (default: every targeted host, up to 50)",
    )
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
    output = Output("apply", args.json, args.file)
    loaded = output.load()
    if loaded is None:
        return exitcodes.INVALID_INPUT
    try:
        plan = plan_apply(loaded, args.limit)
    except Refused as exc:
        return output.refuse(str(exc))
    targets = plan.targets
    if not (args.json and not output.human.isatty()):
        _print_plan(output, args, plan)

    if not args.check and not args.yes:
        answer = output.confirm(f"Apply to {len(targets)} host{'s' if len(targets) != 1 else ''}?")
        if answer is None:
            return exitcodes.INVALID_INPUT
        if not answer:
            return output.fail("apply cancelled; nothing was run", exitcodes.CANCELLED)

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
        with display(output) as on_update:
            result = apply(plan.inventory, options, hosts=targets, on_update=on_update)
    except RunError as exc:
        return output.fail(str(exc))
    return _result(output, args, result, targets)


def _print_plan(output: Output, args: argparse.Namespace, plan: ApplyPlan) -> None:
    mode = "check (dry run: hosts are not changed)" if args.check else "apply"
    lines = [
        f"Cluster {plan.cluster} ({args.file}): {mode}, playbooks/site.yml",
        f"  hosts: {len(plan.targets)} of {plan.hosts}",
    ]
    for name, (roles, members) in plan.node_groups.items():
        lines.append(f"    {name} ({', '.join(roles)}): {hostlist.collect_hostlist(members)}")
    if args.tags or args.skip_tags:
        lines.append(f"  tags: {args.tags or 'all'}" + (f", skipping {args.skip_tags}" if args.skip_tags else ""))
    if plan.files:
        lines.append(f"  {plan.files} configuration files rendered from the model (`gpuinfra plan` shows them)")
    output.console.print(Text("\n".join(lines)))


def _result(output: Output, args: argparse.Namespace, result: RunResult, targets: list[str]) -> int:
    code = _EXIT.get(result.outcome, exitcodes.OK)
    if result.outcome is Outcome.CHANGED:
        code = exitcodes.CHANGES_PENDING if args.detailed_exitcode else exitcodes.OK
    if not args.json:
        for error in result.errors:
            print(f"ansible: {error}", file=sys.stderr)
        print_summary(output.console, result)
    return output.finish({**result.as_dict(), "limit": args.limit, "targets": targets}, code)
