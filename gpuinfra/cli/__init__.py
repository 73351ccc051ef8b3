"""The `gpuinfra` command: argument parsing, printing and exit codes only.

Each verb lives in its own module with `register(subparsers)`, which adds its parser and sets `func`, a callable
taking the parsed arguments and returning the exit code.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from . import exitcodes

# Verb modules, in the order `gpuinfra --help` lists them.
VERBS: tuple[str, ...] = (
    "validate",
    "plan",
    "apply",
    "upgrade",
    "health",
    "report",
    "sandbox",
    "inventory",
    "schema",
)


def build_parser() -> argparse.ArgumentParser:
    import importlib
    from importlib.metadata import version

    parser = argparse.ArgumentParser(prog="gpuinfra", description="NVIDIA GPU clusters from one YAML file.")
    parser.add_argument("--version", action="version", version=f"gpuinfra {version('gpuinfra')}")
    subparsers = parser.add_subparsers(dest="verb", required=True, metavar="VERB")
    for verb in VERBS:
        importlib.import_module(f"{__name__}.{verb}").register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        code: int = args.func(args)
    except KeyboardInterrupt:
        print("gpuinfra: interrupted", file=sys.stderr)
        return exitcodes.CANCELLED
    except BrokenPipeError:
        # The reader of the output went away (`gpuinfra plan ... | head`): stop quietly, as other Unix tools do, and
        # keep Python from failing again when it flushes stdout at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return exitcodes.OUTPUT_CLOSED
    return code
