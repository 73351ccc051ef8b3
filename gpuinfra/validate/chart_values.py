"""The GPU Operator chart's values as a key tree, to check the values gpuinfra hands to Helm.

Helm ignores a value its chart does not know, without a word, so a misspelt key in `extra_values` would change
nothing and say nothing. gpuinfra ships the key tree of the chart version it pins (gpuinfra/data), generated from the
chart itself (tests/unit/test_gpu_operator_chart.py regenerates it, and fails while it is stale), since the chart is
not on the machine that runs `validate`.

A node of the tree is a mapping of the keys the chart knows there, or a leaf kind:

- `scalar`: one string, number or boolean;
- `list`: a list, whose items are not checked;
- `map`: a mapping with keys of the user's choosing (labels, annotations, resource names);
- `any`: anything (a key the chart reads without a default, or a configuration it passes on unread).

`null` fits every node: in Helm it removes the chart's default.
"""

from __future__ import annotations

import datetime
import json
import math
from collections.abc import Iterator, Mapping, Sequence
from functools import cache
from importlib import resources
from typing import Any

from ..model.grammar import HELM_VALUE_KEY, HELM_VALUE_TEXT
from .diagnostics import suggest

CHART = "gpu-operator"
LEAF_KINDS = ("scalar", "list", "map", "any")

KeyTree = dict[str, Any] | str
"""A mapping of key -> KeyTree, or one of LEAF_KINDS."""
Loc = tuple[str | int, ...]


def tree_file(version: str) -> str:
    """The file name of a chart version's key tree under gpuinfra/data."""
    return f"{CHART}-{version}-values.json"


@cache
def key_tree(version: str) -> KeyTree | None:
    """The key tree of the chart at `version`, or None where gpuinfra ships none for it."""
    path = resources.files("gpuinfra") / "data" / tree_file(version)
    if not path.is_file():
        return None
    tree: KeyTree = json.loads(path.read_text(encoding="utf-8"))["values"]
    return tree


def shipped_versions() -> list[str]:
    """The chart versions gpuinfra ships a key tree for."""
    folder = resources.files("gpuinfra") / "data"
    prefix, suffix = f"{CHART}-", "-values.json"
    names = [entry.name for entry in folder.iterdir()] if folder.is_dir() else []
    return sorted(n[len(prefix) : -len(suffix)] for n in names if n.startswith(prefix) and n.endswith(suffix))


def check(values: Any, tree: KeyTree, version: str, loc: Sequence[str | int] = ()) -> list[tuple[Loc, str]]:
    """Every problem of `values` against the chart's key tree, as (location, message): keys the chart does not know,
    a mapping where the chart takes a single value or a list (or the reverse), and strings or keys that a chart could
    not take safely. Locations start with `loc`."""
    return list(_check(values, tree, version, tuple(loc)))


def _check(value: Any, tree: KeyTree, version: str, loc: Loc) -> Iterator[tuple[Loc, str]]:
    if value is None:
        return
    if isinstance(value, dict):
        if tree in ("scalar", "list"):
            yield loc, f"the chart {CHART} {version} takes {_kind_text(tree)} here, not a mapping"
            return
        yield from _check_mapping(value, tree, version, loc)
        return
    if isinstance(value, list):
        if isinstance(tree, dict) or tree in ("scalar", "map"):
            yield loc, f"the chart {CHART} {version} takes {_kind_text(tree)} here, not a list"
            return
        for index, item in enumerate(value):
            yield from _check(item, "any", version, (*loc, index))
        return
    if isinstance(tree, dict) or tree in ("list", "map"):
        yield loc, f"the chart {CHART} {version} takes {_kind_text(tree)} here, not {_value_text(value)}"
        return
    yield from _check_scalar(value, loc)


def _check_mapping(value: Mapping[Any, Any], tree: KeyTree, version: str, loc: Loc) -> Iterator[tuple[Loc, str]]:
    for key, item in value.items():
        where = (*loc, str(key))
        if not isinstance(key, str):
            yield where, f"the key {key!r} is not a string: quote it"
            continue
        try:
            HELM_VALUE_KEY.validate(key)
        except ValueError as problem:
            yield where, str(problem)
            continue
        if isinstance(tree, dict):
            if key not in tree:
                known = sorted(tree)
                yield where, f"unknown key of the chart {CHART} {version} (Helm would ignore it); {suggest(key, known)}"
                continue
            yield from _check(item, tree[key], version, where)
        else:  # a free mapping: any keys, values unchecked except for their grammar
            yield from _check(item, "any", version, where)


def _check_scalar(value: Any, loc: Loc) -> Iterator[tuple[Loc, str]]:
    if isinstance(value, str):
        try:
            HELM_VALUE_TEXT.validate(value)
        except ValueError as problem:
            yield loc, str(problem)
    elif isinstance(value, datetime.date):
        yield loc, f"YAML reads {value.isoformat()} as a date: quote it ('{value.isoformat()}')"
    elif isinstance(value, float) and not math.isfinite(value):
        yield loc, f"{value} is not a number Helm can write: use a finite number"
    elif not isinstance(value, (bool, int, float)):
        yield loc, f"{_value_text(value)} is not a Helm value: use a string, a number, a boolean, a list or a mapping"


def _kind_text(tree: KeyTree) -> str:
    if isinstance(tree, dict) or tree == "map":
        return "a mapping"
    return {"scalar": "a single value", "list": "a list"}.get(tree, "a value")


def _value_text(value: Any) -> str:
    if isinstance(value, bool):
        return f"the boolean {str(value).lower()}"
    if isinstance(value, (int, float)):
        return f"the number {value}"
    if isinstance(value, str):
        return f"the string {value!r}"
    return type(value).__name__
