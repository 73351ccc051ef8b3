"""What one concern gives the inventory, as a type: every concern module ends with its `CONCERN`, and registry.py
lists them by import, so tools and type checkers see each one and each part of one."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ...resolve import Host, ResolvedCluster
from ..artifacts import Artifact


@dataclass(frozen=True)
class Concern:
    name: str
    artifacts: Sequence[Artifact]
    """The files `gpuinfra plan` renders from the concern's role templates."""
    group_vars: Callable[[ResolvedCluster], dict[str, Any]]
    """Role-prefixed variables for the `all` group."""
    host_vars: Callable[[Host], dict[str, Any]] | None = None
    """Settings that differ per host."""
    node_group_vars: Callable[[ResolvedCluster], dict[str, dict[str, Any]]] | None = None
    """Node group -> settings that differ per node group."""
    inventory_groups: Callable[[ResolvedCluster], dict[str, list[str]]] | None = None
    """Inventory groups beyond one per role."""
