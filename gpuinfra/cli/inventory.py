"""`gpuinfra inventory FILE`: the Ansible inventory, as `ansible-inventory --list --export` prints it (for Ansible and
other tools); with --json inside the document every verb prints."""

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
    parser.add_argument("--json", action="store_true", help="the inventory in the JSON document every verb prints")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    output = Output("inventory", args.json, args.file)
    loaded = output.load()
    if loaded is None:
        return exitcodes.INVALID_INPUT
    inventory = inventory_list(loaded.resolved)
    if args.json:
        return output.finish({"status": "ok", "inventory": inventory}, exitcodes.OK)
    print_json(inventory)
    return exitcodes.OK
