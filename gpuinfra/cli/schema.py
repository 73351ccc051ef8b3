"""`gpuinfra schema`: the JSON Schema of the cluster file, for editor completion; with --json inside the document every
verb prints."""

from __future__ import annotations

import argparse
from typing import Any

from ..schema import cluster_schema
from . import exitcodes
from .output import Output, print_json


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("schema", help="print the JSON Schema of the cluster file")
    parser.add_argument("--json", action="store_true", help="the schema in the JSON document every verb prints")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.json:
        return Output("schema", as_json=True).finish({"status": "ok", "schema": cluster_schema()}, exitcodes.OK)
    print_json(cluster_schema())
    return exitcodes.OK
