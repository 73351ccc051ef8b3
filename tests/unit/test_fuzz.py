"""Hypothesis: any text or bytes yields a model or diagnostics, never a traceback; dump -> load is stable."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

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


scalars = st.one_of(
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
    yaml = YAML(typ="safe")
    tree = yaml.load(example.read_text())
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


def test_examples_round_trip(tmp_path: Path) -> None:
    """load -> dump -> load gives the same model, for every example cluster."""
    assert EXAMPLES
    for example in EXAMPLES:
        _assert_round_trip(load_cluster(example).model, tmp_path / example.parent.name)
