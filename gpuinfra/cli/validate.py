"""`gpuinfra validate FILE...`: check cluster files, or mig-parted files, without touching a host."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ..errors import InvalidInput
from ..validate.load import is_mig_parted, load_cluster, load_mig_parted
from . import exitcodes
from .common import add_json
from .output import Output, print_diagnostics, status_of


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("validate", help="check cluster files (or mig-parted v1 files)")
    parser.add_argument("files", nargs="+", metavar="FILE")
    add_json(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    results = []
    for path in args.files:
        try:
            warnings = load_mig_parted(path) if is_mig_parted(path) else load_cluster(path).warnings
            results.append({"file": path, "valid": True, "diagnostics": [d.as_dict() for d in warnings]})
            if not args.json:
                print_diagnostics(warnings)
                print(f"{path}: valid" + (f" ({len(warnings)} warnings)" if warnings else ""), file=sys.stderr)
        except InvalidInput as exc:
            results.append({"file": path, "valid": False, "diagnostics": [d.as_dict() for d in exc.diagnostics]})
            if not args.json:
                print_diagnostics(exc.diagnostics)
                count = len(exc.errors)
                print(f"{path}: {count} error{'s' if count != 1 else ''}", file=sys.stderr)
    code = exitcodes.OK if all(r["valid"] for r in results) else exitcodes.INVALID_INPUT
    return Output("validate", args.json).finish({"status": status_of(code), "files": results}, code)
