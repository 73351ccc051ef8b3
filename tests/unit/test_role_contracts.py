"""One source of truth: each role's argument_specs, its defaults, and the variables the model renders agree."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from ruamel.yaml import YAML

from gpuinfra.render.inventory import group_vars
from gpuinfra.validate.load import load_cluster

ROOT = Path(__file__).resolve().parents[2]
ROLES = sorted(p.name for p in (ROOT / "roles").iterdir() if p.is_dir()) if (ROOT / "roles").exists() else []
EXAMPLES = sorted((ROOT / "inventories").glob("*/cluster.yml"))
# Variables the inventory sets for every host that are not role options: connection and cluster-wide facts.
SHARED_PREFIXES = ("ansible_", "gpuinfra_")


def _yaml(path: Path) -> Any:
    return YAML(typ="safe").load(path.read_text()) if path.exists() else None


def _spec_options(role: str) -> dict[str, Any]:
    specs = _yaml(ROOT / "roles" / role / "meta" / "argument_specs.yml") or {}
    options: dict[str, Any] = {}
    for entry in (specs.get("argument_specs") or {}).values():
        options.update(entry.get("options") or {})
    return options


@pytest.mark.parametrize("role", ROLES)
def test_defaults_match_argument_specs(role: str) -> None:
    defaults = _yaml(ROOT / "roles" / role / "defaults" / "main.yml") or {}
    options = _spec_options(role)
    assert options, f"{role} has no meta/argument_specs.yml options"
    assert set(defaults) - set(options) == set(), f"{role}: defaults without an argument spec"
    unset = {name for name, spec in options.items() if name not in defaults and not spec.get("required")}
    assert unset == set(), f"{role}: optional arguments without a default"
    for name in options:
        assert name.startswith(f"{role}_"), f"{role}: public variable {name!r} lacks the role prefix"


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.parent.name)
def test_rendered_variables_are_role_options(example: Path) -> None:
    """Every variable the model renders is an option some role declares, so none is silently ignored."""
    declared = {name for role in ROLES for name in _spec_options(role)}
    rendered = group_vars(load_cluster(example).resolved)
    unknown = {k for k in rendered if not k.startswith(SHARED_PREFIXES) and k not in declared}
    assert unknown == set()
