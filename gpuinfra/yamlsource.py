"""YAML with positions: a round-trip load that remembers where every key and item came from.

Duplicate keys are errors. The loader speaks YAML 1.2, so `no`, `on` or `yes` stay strings unless the file
declares `%YAML 1.1`; the strict model then refuses a string where a boolean belongs, with a hint.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.constructor import DuplicateKeyError
from ruamel.yaml.error import MarkedYAMLError, YAMLError

from .errors import Diagnostic, InvalidInput

Loc = Sequence[str | int]


@dataclass(frozen=True)
class YamlSource:
    name: str
    data: Any

    def position(self, loc: Loc) -> tuple[int, int]:
        """1-based (line, column) of the deepest node of `loc` that exists: the key for mappings, the item
        for sequences; a missing key points at its parent."""
        line, col = 1, 1
        node = self.data
        for part in loc:
            if isinstance(node, CommentedMap) and part in node:
                line, col = node.lc.key(part)
                line, col = line + 1, col + 1
                node = node[part]
            elif isinstance(node, CommentedSeq) and isinstance(part, int) and 0 <= part < len(node):
                line, col = node.lc.item(part)
                line, col = line + 1, col + 1
                node = node[part]
            else:
                break
        return line, col

    def diagnostic(self, loc: Loc, path: str, message: str, severity: str = "error") -> Diagnostic:
        line, col = self.position(loc)
        return Diagnostic(self.name, line, col, path, message, "warning" if severity == "warning" else "error")


def _fail(name: str, message: str, line: int = 1, col: int = 1) -> InvalidInput:
    return InvalidInput([Diagnostic(name, line, col, "", message)])


def read_yaml(path: str | Path, display: str | None = None) -> YamlSource:
    """Load one YAML document; any problem with the file itself becomes an InvalidInput, never a traceback."""
    name = display or str(path)
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise _fail(name, f"cannot read the file: {exc.strerror or exc}") from None
    if b"\x00" in raw:
        raise _fail(name, "this is a binary file, not YAML")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise _fail(name, f"not UTF-8 text (byte {exc.start}); save the file as UTF-8") from None
    yaml = YAML(typ="rt")
    yaml.allow_duplicate_keys = False
    try:
        docs = list(yaml.load_all(text))
    except DuplicateKeyError as exc:
        mark = exc.problem_mark
        key = str(exc.problem).split('"')[1] if '"' in str(exc.problem) else "a key"
        raise _fail(name, f"duplicate key {key!r}; each key may appear once", mark.line + 1, mark.column + 1) from None
    except MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        problem = exc.problem or exc.context or "invalid YAML"
        line, col = (mark.line + 1, mark.column + 1) if mark else (1, 1)
        raise _fail(name, f"invalid YAML: {problem}", line, col) from None
    except YAMLError as exc:
        raise _fail(name, f"invalid YAML: {exc}") from None
    except RecursionError:
        raise _fail(name, "invalid YAML: nesting is too deep") from None
    if len(docs) > 1:
        raise _fail(name, "the file holds several YAML documents; put the cluster in one")
    if not docs or docs[0] is None:
        raise _fail(name, "the file is empty")
    return YamlSource(name, docs[0])


def to_plain(node: Any) -> Any:
    """The round-trip tree as plain Python values, so the strict model sees int, str, bool and float only."""
    if isinstance(node, dict):
        return {to_plain(k): to_plain(v) for k, v in node.items()}
    if isinstance(node, list):
        return [to_plain(v) for v in node]
    if isinstance(node, bool):
        return bool(node)
    if isinstance(node, int):
        return int(node)
    if isinstance(node, float):
        return float(node)
    if isinstance(node, str):
        return str(node)
    if isinstance(node, datetime.date):
        # Kept as a date so that a string field refuses it with a "quote it" hint.
        return node
    return node
