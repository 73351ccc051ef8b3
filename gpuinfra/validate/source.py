"""YAML with positions: the composed node graph remembers where every key and item came from.

The file is composed once, with ruamel.yaml's C parser where it is installed (about ten times faster than the
pure-Python one), checked against the limits in limits.py on that graph, where an alias is one node, and only then
built into data: an alias bomb or a deeply nested file is refused at its place in bounded time. The C parser is
libyaml, a YAML 1.1 parser that refuses some valid YAML 1.2 (`{max_time: 7-00:00:00}`); a file it refuses is parsed
again by the pure-Python YAML 1.2 parser, whose verdict stands.

Duplicate keys are errors. The loader speaks YAML 1.2, so `no`, `on` or `yes` stay strings unless the file
declares `%YAML 1.1`; the strict model then refuses a string where a boolean belongs, with a hint. Merge keys
(`<<: *defaults`) are supported: a merged key is positioned where its anchor wrote it.
"""

from __future__ import annotations

import datetime
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.composer import ComposerError
from ruamel.yaml.constructor import ConstructorError, DuplicateKeyError, SafeConstructor
from ruamel.yaml.error import MarkedYAMLError, YAMLError
from ruamel.yaml.events import CollectionEndEvent, CollectionStartEvent
from ruamel.yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode
from ruamel.yaml.parser import ParserError
from ruamel.yaml.scanner import ScannerError

from ..errors import Diagnostic, InvalidInput
from ..limits import MAX_DEPTH, MAX_FILE_BYTES, MAX_NODES

Loc = Sequence[str | int]
MERGE_TAG = "tag:yaml.org,2002:merge"


@dataclass(frozen=True)
class YamlSource:
    name: str
    data: Any
    root: Node

    def position(self, loc: Loc) -> tuple[int, int]:
        """1-based (line, column) of the deepest node of `loc` that exists: the key for mappings, the item
        for sequences; a missing key points at its parent."""
        line, col = 1, 1
        node: Node | None = self.root
        for part in loc:
            if isinstance(node, MappingNode):
                pair = _pair(node, part)
                if pair is None:
                    break
                key, node = pair
            elif isinstance(node, SequenceNode) and isinstance(part, int) and 0 <= part < len(node.value):
                key = node = node.value[part]
            else:
                break
            line, col = key.start_mark.line + 1, key.start_mark.column + 1
        return line, col

    def diagnostic(self, loc: Loc, path: str, message: str, severity: str = "error") -> Diagnostic:
        line, col = self.position(loc)
        return Diagnostic(self.name, line, col, path, message, "warning" if severity == "warning" else "error")


def _pair(node: MappingNode, key: str | int) -> tuple[Node, Node] | None:
    """The key and value nodes of `key`: written in the mapping itself, or else in a mapping it merges (`<<`), as
    YAML's merge rules find it (own keys first, then the merged mappings in order)."""
    merged: list[MappingNode] = []
    for key_node, value_node in node.value:
        if key_node.tag == MERGE_TAG:
            merged.extend(value_node.value if isinstance(value_node, SequenceNode) else [value_node])
        elif isinstance(key_node, ScalarNode) and key_node.value == str(key):
            return key_node, value_node
    for source in merged:
        if isinstance(source, MappingNode) and (found := _pair(source, key)) is not None:
            return found
    return None


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
        before = raw[: exc.start]  # valid UTF-8: the bad byte is the first
        line, col = before.count(b"\n") + 1, len(before[before.rfind(b"\n") + 1 :].decode("utf-8-sig")) + 1
        raise _fail(name, f"not UTF-8 text (byte {exc.start}); save the file as UTF-8", line, col) from None


def _at(mark: Any) -> tuple[int, int]:
    return mark.line + 1, mark.column + 1


def _check_size(name: str, root: Node) -> None:
    """Refuse a node graph that refers to itself, or whose depth or expanded size is beyond the limits, at the node
    that crosses them."""
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()

    def size(node: Node, depth: int) -> int:
        mark = node.start_mark
        if id(node) in open_nodes:
            raise _fail(name, "an alias refers to a node that contains it: the data would never end", *_at(mark))
        if id(node) in sizes:  # an alias: its size is known, and counts again wherever it is used
            return sizes[id(node)]
        if depth > MAX_DEPTH:
            raise _fail(name, f"nesting is deeper than {MAX_DEPTH} levels", *_at(mark))
        open_nodes.add(id(node))
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
                raise _fail(
                    name,
                    f"the file expands to more than {MAX_NODES} YAML nodes (aliases count each time they are used)",
                    *_at(child.start_mark),
                )
        open_nodes.discard(id(node))
        sizes[id(node)] = total
        return total

    size(root, 1)


class _Constructor(SafeConstructor):
    """ruamel.yaml's safe constructor, with the scalars it resolves as numbers but cannot convert ('-_', '._')
    reported at their place instead of as a bare ValueError."""

    def construct_object(self, node: Node, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep)
        except (ValueError, TypeError, OverflowError):
            raise ConstructorError(None, None, f"cannot read the value {node.value!r}", node.start_mark) from None


def _yaml(pure: bool) -> YAML:
    yaml = YAML(typ="safe", pure=pure)
    yaml.Constructor = _Constructor
    yaml.allow_duplicate_keys = False
    return yaml


def _check_depth(yaml: YAML, text: str, name: str) -> None:
    """Refuse nesting beyond MAX_DEPTH from the parser's events, before anything recursive sees the file: the C
    composer recurses on the C stack, where 100,000 levels of `[` crash the process instead of raising."""
    depth = 0
    for event in yaml.parse(text):
        if isinstance(event, CollectionStartEvent):
            depth += 1
            if depth > MAX_DEPTH:
                raise _fail(name, f"nesting is deeper than {MAX_DEPTH} levels", *_at(event.start_mark))
        elif isinstance(event, CollectionEndEvent):
            depth -= 1


def _compose_check_construct(yaml: YAML, text: str, name: str, pure: bool) -> tuple[Node, Any]:
    """Compose the node graph, check it, then build the data from it. The pure-Python composer needs no event
    pass first: deep nesting ends in a RecursionError there, and _check_size bounds the depth it lets through."""
    if not pure:
        _check_depth(yaml, text, name)
    root = yaml.compose(text)
    if root is None:
        raise _fail(name, "the file is empty")
    _check_size(name, root)
    return root, yaml.constructor.construct_document(root)


def read_yaml(path: str | Path, display: str | None = None) -> YamlSource:
    """Load one YAML document; any problem with the file itself becomes an InvalidInput, never a traceback."""
    name = display or str(path)
    text = read_text(path, name)
    try:
        try:
            root, data = _compose_check_construct(_yaml(pure=False), text, name, pure=False)
        except (ScannerError, ParserError):
            root, data = _compose_check_construct(_yaml(pure=True), text, name, pure=True)
    except DuplicateKeyError as exc:
        mark = exc.problem_mark
        key = str(exc.problem).split('"')[1] if '"' in str(exc.problem) else "a key"
        raise _fail(name, f"duplicate key {key!r}; each key may appear once", mark.line + 1, mark.column + 1) from None
    except ComposerError as exc:
        if "single document" in f"{exc.context} {exc.problem}":
            line, col = _at(exc.problem_mark) if exc.problem_mark else (1, 1)  # where the second document starts
            raise _fail(name, "the file holds several YAML documents; put the cluster in one", line, col) from None
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
    return YamlSource(name, data, root)


def to_plain(node: Any) -> Any:
    """The loaded tree as plain Python values, so the strict model sees int, str, bool and float only."""
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
