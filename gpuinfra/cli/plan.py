"""`gpuinfra plan FILE [--out DIR]`: every generated file, rendered from the roles' own templates."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from ..render.plan import RenderError, render
from . import exitcodes
from .common import DEFAULT_CLUSTER, add_json, load_or_report, print_json


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("plan", help="render every generated artifact without touching a host")
    parser.add_argument("file", nargs="?", default=DEFAULT_CLUSTER, metavar="FILE")
    parser.add_argument("--out", type=Path, help="write the artifacts under DIR instead of printing them")
    add_json(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    loaded = load_or_report(args.file, args.json)
    if loaded is None:
        return exitcodes.INVALID_INPUT
    try:
        rendered = render(loaded.resolved)
    except RenderError as exc:
        print(f"gpuinfra plan: {exc}", file=sys.stderr)
        return exitcodes.FAILED
    if args.out:
        for item in rendered:
            target = args.out / item.artifact.path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(item.content)
    if args.json:
        print_json(
            [
                {
                    "path": r.artifact.path,
                    "role": r.artifact.role,
                    "host": r.host,
                    **({} if args.out else {"content": r.content}),
                }
                for r in rendered
            ]
        )
    elif args.out:
        for item in rendered:
            print(args.out / item.artifact.path)
    else:
        for item in rendered:
            host = f" (as rendered for {item.host})" if item.host else ""
            print(f"# ---- {item.artifact.path}{host}\n{item.content.rstrip()}\n")
    return exitcodes.OK
