"""gpuinfra's layers never point up: model, then resolve, then validate, then render and the verbs.

Read from the sources (ast), so a lazy import inside a function counts as much as one at the top. A unit is a
package (`gpuinfra.validate`) or a top-level module (`gpuinfra.hostlists`).
"""

from __future__ import annotations

import ast
from collections import defaultdict
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "gpuinfra"
# What the cluster model may build on: its own field types live inside it (gpuinfra.model.grammar).
MODEL_MAY_IMPORT = {"catalog"}
# Shared domain logic that validate and render both use: each sits below validate.
SHARED = {"hostlists", "limits", "mig_layouts", "k8s_resources", "catalog"}


def _module_name(path: Path) -> list[str]:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return parts[:-1] if parts[-1] == "__init__" else parts


def _imported(path: Path) -> set[str]:
    """The gpuinfra modules a file imports, as dotted names."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name[:-1]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            out.add(module)
            out.update(f"{module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
    return {m for m in out if m.startswith("gpuinfra.")}


def _unit(module: str) -> str:
    """gpuinfra.validate.load -> validate; gpuinfra.hostlists -> hostlists."""
    return module.split(".")[1]


@cache
def graph() -> dict[str, set[str]]:
    """Unit -> the other units it imports."""
    units = {
        p.name if p.is_dir() else p.stem for p in PACKAGE.iterdir() if p.suffix == ".py" or (p / "__init__.py").exists()
    }
    edges: dict[str, set[str]] = defaultdict(set)
    for path in PACKAGE.rglob("*.py"):
        source = _unit(".".join(_module_name(path))) if len(_module_name(path)) > 1 else "__init__"
        for module in _imported(path):
            target = _unit(module)
            if target in units and target != source:
                edges[source].add(target)
    return edges


def _reaches(start: str, goal: str) -> bool:
    seen, todo = set(), [start]
    while todo:
        unit = todo.pop()
        if unit == goal:
            return True
        if unit not in seen:
            seen.add(unit)
            todo.extend(graph().get(unit, ()))
    return False


def test_no_two_units_import_each_other_even_through_others() -> None:
    cycles = sorted((a, b) for a, targets in graph().items() for b in targets if _reaches(b, a))
    assert cycles == []


def test_the_model_imports_nothing_above_it() -> None:
    assert graph()["model"] <= MODEL_MAY_IMPORT


def test_resolve_render_and_the_shared_logic_never_import_validate() -> None:
    for unit in ("resolve", "render", *SHARED):
        assert "validate" not in graph().get(unit, set()), unit
        assert not _reaches(unit, "validate"), unit


def test_the_library_never_imports_the_command_line() -> None:
    """The verbs are library calls; cli/ only parses arguments, prints and maps outcomes to exit codes."""
    assert sorted(unit for unit, targets in graph().items() if "cli" in targets and unit != "__main__") == []


def test_the_graph_is_read() -> None:
    """The rules above hold because the graph was read, not because it came out empty."""
    assert {"model", "resolve"} <= graph()["validate"] and "hostlists" in graph()["resolve"]
    assert {"upgrade", "report", "health_sweep"} <= graph()["cli"]


def test_the_runner_only_runs_ansible() -> None:
    """gpuinfra.run is handed an inventory and the hosts it targets: it reads no cluster file and renders nothing."""
    for unit in ("render", "validate", "resolve", "model"):
        assert not _reaches("run", unit), unit
