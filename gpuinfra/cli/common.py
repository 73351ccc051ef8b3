"""What several verbs share: loading a cluster file with its diagnostics printed, and JSON output."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ..errors import Diagnostic, InvalidInput
from ..load import LoadedCluster, load_cluster

DEFAULT_CLUSTER = "inventories/sandbox/cluster.yml"


def add_json(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print machine-readable JSON on stdout")


def print_json(data: Any) -> None:
    json.dump(data, sys.stdout, indent=2, sort_keys=False, default=str)
    sys.stdout.write("\n")


def print_diagnostics(diagnostics: list[Diagnostic]) -> None:
    for diagnostic in diagnostics:
        print(diagnostic, file=sys.stderr)


def load_or_report(path: str, as_json: bool) -> LoadedCluster | None:
    """Load and print warnings; on invalid input print every diagnostic and return None."""
    try:
        loaded = load_cluster(path)
    except InvalidInput as exc:
        if as_json:
            print_json({"valid": False, "diagnostics": [d.as_dict() for d in exc.diagnostics]})
        else:
            print_diagnostics(exc.diagnostics)
            count = len(exc.errors)
            print(f"{path}: {count} error{'s' if count != 1 else ''}", file=sys.stderr)
        return None
    if not as_json:
        print_diagnostics(loaded.warnings)
    return loaded
