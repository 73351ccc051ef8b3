"""The arguments several verbs share: the cluster file's default, --json and --extra-vars."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML

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
