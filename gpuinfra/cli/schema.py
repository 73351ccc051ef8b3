"""`gpuinfra schema`: the JSON Schema of the cluster file, for editor completion."""

from __future__ import annotations

import argparse
from typing import Any

from ..schema import cluster_schema
from . import exitcodes
from .output import print_json


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("schema", help="print the JSON Schema of the cluster file")
    parser.add_argument("--json", action="store_true", help="accepted for symmetry; the output is always JSON")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    print_json(cluster_schema())
    return exitcodes.OK
