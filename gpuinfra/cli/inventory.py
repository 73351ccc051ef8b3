"""`gpuinfra inventory FILE`: the Ansible inventory, as `ansible-inventory --list --export` prints it."""

from __future__ import annotations

import argparse
from typing import Any

from ..render.inventory import inventory_list
from . import exitcodes
from .common import DEFAULT_CLUSTER
from .output import Output, print_json


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("inventory", help="print the Ansible inventory with typed vars as JSON")
    parser.add_argument("file", nargs="?", default=DEFAULT_CLUSTER, metavar="FILE")
    parser.add_argument("--json", action="store_true", help="diagnostics as JSON too (the inventory is always JSON)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    loaded = Output("inventory", args.json, args.file).load()
    if loaded is None:
        return exitcodes.INVALID_INPUT
    print_json(inventory_list(loaded.resolved))
    return exitcodes.OK
