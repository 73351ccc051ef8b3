"""YAML with positions: a round-trip load that remembers where every key and item came from.

Duplicate keys are errors. The loader speaks YAML 1.2, so `no`, `on` or `yes` stay strings unless the file
declares `%YAML 1.1`; the strict model then refuses a string where a boolean belongs, with a hint. Merge keys
(`<<: *defaults`) are supported: a merged key is positioned where its anchor wrote it.

The file is checked against the limits in limits.py on its composed node graph, where an alias is one node,
before anything is built: an alias bomb or a deeply nested file is refused at its place in bounded time.
"""

from __future__ import annotations

import datetime
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq, merge_attrib
from ruamel.yaml.composer import ComposerError
from ruamel.yaml.constructor import DuplicateKeyError
from ruamel.yaml.error import MarkedYAMLError, YAMLError
from ruamel.yaml.nodes import MappingNode, Node, SequenceNode

from ..errors import Diagnostic, InvalidInput
from .limits import MAX_DEPTH, MAX_FILE_BYTES, MAX_NODES

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
                owner = _owner(node, part)
                line, col = owner.lc.key(part)
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


def _owner(node: CommentedMap, key: Any) -> CommentedMap:
    """The mapping that wrote `key`: the node itself, or the anchored mapping a merge key took it from."""
    if key in node.lc.data:
        return node
    for merged in getattr(node, merge_attrib, ()):
        if isinstance(merged, CommentedMap) and key in merged:
            return _owner(merged, key)
    return node


def _fail(name: str, message: str, line: int = 1, col: int = 1) -> InvalidInput:
    return InvalidInput([Diagnostic(name, line, col, "", message)])


def read_text(path: str | Path, name: str) -> str:
    """A regular file's text, at most MAX_FILE_BYTES; anything else is an InvalidInput, never a traceback or a hang
    (a FIFO or /dev/zero is refused before it is read)."""
    try:
        if not stat.S_ISREG(Path(path).stat().st_mode):  # before open(), which blocks on a FIFO
            raise _fail(name, "not a regular file; give the path of a YAML file")
        with open(path, "rb") as handle:
            raw = handle.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise _fail(name, f"cannot read the file: {exc.strerror or exc}") from None
    if len(raw) > MAX_FILE_BYTES:
        raise _fail(name, f"the file is larger than {MAX_FILE_BYTES // 1024} KiB; a cluster file is far smaller")
    if b"\x00" in raw:
        raise _fail(name, "this is a binary file, not YAML")
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise _fail(name, f"not UTF-8 text (byte {exc.start}); save the file as UTF-8") from None


def _check_size(name: str, root: Node) -> None:
    """Refuse a node graph whose expanded size or depth is beyond the limits, at the node that crosses them."""
    sizes: dict[int, int] = {}

    def size(node: Node, depth: int) -> int:
        if id(node) in sizes:  # an alias: its size is known, and counts again wherever it is used
            return sizes[id(node)]
        if depth > MAX_DEPTH:
            mark = node.start_mark
            raise _fail(name, f"nesting is deeper than {MAX_DEPTH} levels", mark.line + 1, mark.column + 1)
        sizes[id(node)] = 1  # a recursive alias counts once here; the constructor refuses it later
        total = 1
        if isinstance(node, MappingNode):
            children = [child for pair in node.value for child in pair]
        elif isinstance(node, SequenceNode):
            children = list(node.value)
        else:
            children = []
        for child in children:
            total += size(child, depth + 1)
            if total > MAX_NODES:
                mark = child.start_mark
                raise _fail(
                    name,
                    f"the file expands to more than {MAX_NODES} YAML nodes (aliases count each time they are used)",
                    mark.line + 1,
                    mark.column + 1,
                )
        sizes[id(node)] = total
        return total

    size(root, 0)


def _compose_check_construct(yaml: YAML, text: str, name: str) -> Any:
    """One parse: compose the node graph (an alias is one node there), check it, then build the data from it."""
    constructor, parser = yaml.get_constructor_parser(text)
    try:
        root = constructor.composer.get_single_node()
        if root is None:
            raise _fail(name, "the file is empty")
        _check_size(name, root)
        return constructor.construct_document(root)
    finally:
        parser.dispose()


def read_yaml(path: str | Path, display: str | None = None) -> YamlSource:
    """Load one YAML document; any problem with the file itself becomes an InvalidInput, never a traceback."""
    name = display or str(path)
    text = read_text(path, name)
    yaml = YAML(typ="rt")
    yaml.allow_duplicate_keys = False
    try:
        data = _compose_check_construct(yaml, text, name)
    except DuplicateKeyError as exc:
        mark = exc.problem_mark
        key = str(exc.problem).split('"')[1] if '"' in str(exc.problem) else "a key"
        raise _fail(name, f"duplicate key {key!r}; each key may appear once", mark.line + 1, mark.column + 1) from None
    except ComposerError as exc:
        if "single document" in f"{exc.context} {exc.problem}":
            raise _fail(name, "the file holds several YAML documents; put the cluster in one") from None
        raise _fail(name, f"invalid YAML: {exc.problem or exc.context}") from None
    except MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        problem = exc.problem or exc.context or "invalid YAML"
        line, col = (mark.line + 1, mark.column + 1) if mark else (1, 1)
        raise _fail(name, f"invalid YAML: {problem}", line, col) from None
    except YAMLError as exc:
        raise _fail(name, f"invalid YAML: {exc}") from None
    except RecursionError:
        raise _fail(name, "invalid YAML: nesting is too deep") from None
    if data is None:
        raise _fail(name, "the file is empty")
    return YamlSource(name, data)


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
