"""Hypothesis: any text, bytes or YAML (anchors, aliases and merge keys included) yields a model or positioned
diagnostics within the loader's limits, never a traceback; values built to attack the places they land in are
refused; dump -> load is stable."""

from __future__ import annotations

import io
import tracemalloc
from pathlib import Path
from typing import Any, Protocol

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ruamel.yaml import YAML

from gpuinfra.errors import InvalidInput
from gpuinfra.model import Cluster
from gpuinfra.validate.load import load_cluster

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "inventories").glob("*/cluster.yml"))
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def _load_or_diagnose(path: Path) -> Cluster | None:
    """The model, or None after checking that every diagnostic has a place and a message."""
    try:
        return load_cluster(path).model
    except InvalidInput as exc:
        assert exc.diagnostics, "InvalidInput without a diagnostic"
        for diagnostic in exc.diagnostics:
            assert diagnostic.line >= 1 and diagnostic.col >= 1
            assert diagnostic.message
        return None


def _assert_round_trip(model: Cluster, folder: Path) -> None:
    """dump -> load gives the same model."""
    out = io.StringIO()
    YAML(typ="safe").dump(model.model_dump(mode="json", exclude_defaults=True), out)
    folder.mkdir(exist_ok=True)
    (folder / "cluster.yml").write_text(out.getvalue())
    assert Cluster.model_validate(load_cluster(folder / "cluster.yml").model.model_dump()) == model


@FUZZ
@given(st.binary(max_size=400))
def test_arbitrary_bytes(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "c.yml"
    path.write_bytes(data)
    _load_or_diagnose(path)


# Characters that make YAML structure, plus a non-ASCII one.
YAML_ALPHABET = [*"name: node_groups{}[]-,'\"\n\t #&*!|>%@`gpu01:0x.", "\u00e9"]


@FUZZ
@given(st.text(alphabet=st.sampled_from(YAML_ALPHABET), max_size=300))
def test_arbitrary_yaml_like_text(tmp_path: Path, text: str) -> None:
    path = tmp_path / "c.yml"
    path.write_text(text)
    _load_or_diagnose(path)


# Values built to break out of the place they land in: templates, new lines, options, shell, huge ranges.
HOSTILE = [
    "{{ lookup('pipe', 'id') }}",
    "{% raw %}x",
    "{# x #}",
    "x\nNodeName=evil",
    "x\rExecStartPre=/bin/sh",
    "-oProxyCommand=id",
    "$(id)",
    "a;b",
    "node[1-999999999]",
    "6-999999999",
    "7-6",
    "\u2028",
    "x" * 5000,
]
hostile = st.sampled_from(HOSTILE)

scalars = st.one_of(
    hostile,
    st.none(),
    st.booleans(),
    st.integers(-5, 10**6),
    st.floats(allow_nan=False),
    st.text(max_size=12),
    st.lists(st.text(max_size=5), max_size=3),
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=2),
)


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix] if prefix else []
    if isinstance(node, dict):
        for key, value in node.items():
            out += _paths(value, (*prefix, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            out += _paths(value, (*prefix, i))
    return out


@FUZZ
@given(example=st.sampled_from(EXAMPLES), data=st.data())
def test_mutated_examples(tmp_path: Path, example: Path, data: st.DataObject) -> None:
    tree = YAML(typ="safe", pure=True).load(example.read_text())  # YAML 1.2, as the loader reads it
    for _ in range(data.draw(st.integers(1, 3))):
        path = data.draw(st.sampled_from(_paths(tree)))
        parent = tree
        for part in path[:-1]:
            parent = parent[part]
        if data.draw(st.booleans()) and isinstance(parent, dict):
            del parent[path[-1]]
        else:
            parent[path[-1]] = data.draw(scalars)
        if not _paths(tree):
            break
    out = io.StringIO()
    YAML(typ="safe").dump(tree, out)
    target = tmp_path / "c.yml"
    target.write_text(out.getvalue())
    model = _load_or_diagnose(target)
    if model is not None:  # a mutation the model accepts must survive dump -> load too
        _assert_round_trip(model, tmp_path / "again")
        _assert_no_hostile_value(model)


def _assert_no_hostile_value(model: Cluster) -> None:
    """No field accepts a template delimiter or a control character (free text may hold `;` or `$(`: it is quoted
    where it lands)."""
    for value in _strings(model.model_dump()):
        assert not any(d in value for d in ("{{", "{%", "{#")), value
        assert value.isprintable(), repr(value)


def _strings(node: Any) -> list[str]:
    if isinstance(node, str):
        return [node]
    if isinstance(node, dict):
        return [s for k, v in node.items() for s in (*_strings(k), *_strings(v))]
    if isinstance(node, list):
        return [s for v in node for s in _strings(v)]
    return []


class Draw(Protocol):
    """How `_tree` draws: `DataObject.draw`. Hypothesis's own `DrawFn` also declares a `__signature__` member, which
    only the functions `@composite` makes carry, so a bound `draw` method does not match it."""

    def __call__[T](self, strategy: st.SearchStrategy[T], label: Any = None) -> T: ...


def _tree(draw: Draw, depth: int = 0) -> Any:
    """A YAML-able tree in which some subtrees are the same object, so the dumper writes anchors and aliases; some
    mappings also merge another mapping of the tree with `<<`."""
    if depth > 3 or draw(st.integers(0, 3)) == 0:
        return draw(scalars)
    if draw(st.booleans()):
        node: Any = [_tree(draw, depth + 1) for _ in range(draw(st.integers(0, 4)))]
        if node and draw(st.booleans()):
            node.extend([node[0]] * draw(st.integers(1, 9)))  # the same object again: an alias
        return node
    keys = draw(st.lists(st.sampled_from(["name", "node_groups", "hosts", "roles", "gpu", "a", "b"]), unique=True))
    mapping = {key: _tree(draw, depth + 1) for key in keys}
    merged = [v for v in mapping.values() if isinstance(v, dict)]
    if len(merged) > 0 and draw(st.booleans()):
        mapping["<<"] = merged[0]
    if draw(st.integers(0, 9)) == 0:
        mapping["self"] = mapping  # an alias inside the node it names
    return mapping


@FUZZ
@given(data=st.data())
def test_arbitrary_yaml_with_aliases_and_merge_keys(tmp_path: Path, data: st.DataObject) -> None:
    tree = {"name": "lab", "node_groups": _tree(data.draw)}
    for _ in range(data.draw(st.integers(0, 4))):  # nest the tree in itself: aliases of aliases
        tree = {"name": "lab", "node_groups": [tree, tree, tree, tree, tree, tree, tree, tree, tree]}
    out = io.StringIO()
    yaml = YAML(typ="safe")
    yaml.representer.ignore_aliases = lambda _data: False
    yaml.dump(tree, out)
    path = tmp_path / "c.yml"
    path.write_text(out.getvalue())
    tracemalloc.start()
    try:
        _load_or_diagnose(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 256 * 1024 * 1024, f"loading took {peak // 2**20} MiB"


def test_examples_round_trip(tmp_path: Path) -> None:
    """load -> dump -> load gives the same model, for every example cluster."""
    assert EXAMPLES
    for example in EXAMPLES:
        _assert_round_trip(load_cluster(example).model, tmp_path / example.parent.name)
