"""`gpuinfra plan FILE [--out DIR | --diff OLD]`: every generated file, rendered from the roles' own templates, or
only what changes from the cluster file OLD to FILE."""

from __future__ import annotations

import argparse
import difflib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import exitcodes
from .common import DEFAULT_CLUSTER, add_json
from .output import Output

if TYPE_CHECKING:
    from ..render.plan import Rendered


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("plan", help="render every generated artifact without touching a host")
    parser.add_argument("file", nargs="?", default=DEFAULT_CLUSTER, metavar="FILE")
    target = parser.add_mutually_exclusive_group()
    target.add_argument("--out", type=Path, help="write the artifacts under DIR instead of printing them")
    target.add_argument(
        "--diff",
        metavar="OLD",
        help="show only the artifacts that differ from those of the cluster file OLD, as unified diffs",
    )
    add_json(parser)
    parser.set_defaults(func=run)


def _render(output: Output) -> list[Rendered] | int:
    """The artifacts of output's cluster file, or the exit code of the error already reported."""
    from ..render.plan import RenderError, render  # Ansible's templar: imported by this verb only

    loaded = output.load()
    if loaded is None:
        return exitcodes.INVALID_INPUT
    try:
        return render(loaded.resolved)
    except RenderError as exc:
        return output.fail(str(exc))


def run(args: argparse.Namespace) -> int:
    output = Output("plan", args.json, args.file)
    rendered = _render(output)
    if isinstance(rendered, int):
        return rendered
    if args.diff:
        return _diff(args, output, rendered)
    if args.out:
        for item in rendered:
            target = args.out / item.artifact.path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(item.content)
    if args.json:
        artifacts = [
            {"path": r.artifact.path, "role": r.artifact.role, "host": r.host}
            | ({} if args.out else {"content": r.content})
            for r in rendered
        ]
        return output.finish({"status": "ok", "artifacts": artifacts}, exitcodes.OK)
    if args.out:
        for item in rendered:
            print(args.out / item.artifact.path)
    else:
        for item in rendered:
            host = f" (as rendered for {item.host})" if item.host else ""
            print(f"# ---- {item.artifact.path}{host}\n{item.content.rstrip()}\n")
    return exitcodes.OK


def _diff(args: argparse.Namespace, output: Output, rendered: list[Rendered]) -> int:
    """Each artifact that is new, gone or different from OLD's, with its unified diff; nothing else."""
    old = _render(Output("plan", args.json, args.diff))
    if isinstance(old, int):
        return old
    before = {item.artifact.path: item.content for item in old}
    after = {item.artifact.path: item.content for item in rendered}
    changes = []
    for path in [*after, *(p for p in before if p not in after)]:
        was, now = before.get(path), after.get(path)
        if was == now:
            continue
        status = "added" if was is None else "removed" if now is None else "changed"
        lines = difflib.unified_diff(
            (was or "").splitlines(keepends=True),
            (now or "").splitlines(keepends=True),
            fromfile="/dev/null" if was is None else f"a/{path}",
            tofile="/dev/null" if now is None else f"b/{path}",
        )
        changes.append({"path": path, "status": status, "diff": "".join(lines)})
    if args.json:
        return output.finish({"status": "ok", "old": args.diff, "changes": changes}, exitcodes.OK)
    if not changes:
        print(f"{args.file}: no artifact differs from {args.diff}'s")
    else:
        for change in changes:
            print(change["diff"], end="" if change["diff"].endswith("\n") else "\n")
        print(f"{len(changes)} of {len(after)} artifacts differ: {', '.join(c['path'] for c in changes)}")
    return exitcodes.OK
