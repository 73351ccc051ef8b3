"""What several verbs share: loading a cluster file with its diagnostics printed, --extra-vars, and JSON output."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML

from ..errors import Diagnostic, InvalidInput
from ..validate.load import LoadedCluster, load_cluster

DEFAULT_CLUSTER = "inventories/sandbox/cluster.yml"


def add_json(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print machine-readable JSON on stdout")


def add_extra_vars(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-e",
        "--extra-vars",
        action="append",
        default=[],
        metavar="VARS",
        help="role variables for every run, as key=value, JSON or @file.yml (repeatable; never secrets)",
    )


def parse_extra_vars(items: list[str]) -> dict[str, Any]:
    """Ansible's -e forms: key=value pairs, a JSON or YAML mapping, or @file."""
    out: dict[str, Any] = {}
    for item in items:
        text = Path(item[1:]).read_text() if item.startswith("@") else item
        stripped = text.strip()
        if item.startswith("@") or stripped.startswith("{"):
            data = YAML(typ="safe", pure=True).load(text) if item.startswith("@") else json.loads(stripped)
            if not isinstance(data, dict):
                raise ValueError(f"{item}: extra vars must be a mapping")
            out.update(data)
        else:
            for pair in stripped.split():
                key, sep, value = pair.partition("=")
                if not sep:
                    raise ValueError(f"{pair!r}: extra vars are key=value, JSON or @file")
                out[key] = value
    return out


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
