"""Where the Ansible collection gpuinfra.cluster (roles, playbooks, plugins) is.

An installed wheel carries it inside this package (`_collection/`, see pyproject.toml); a checkout is itself the
collection, one folder above this package.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

_PACKAGED = Path(__file__).resolve().parent / "_collection"
_CHECKOUT = Path(__file__).resolve().parents[1]

ROOT = _PACKAGED if (_PACKAGED / "galaxy.yml").is_file() else _CHECKOUT
"""The collection's root folder: the one holding galaxy.yml, roles/ and playbooks/."""


def link_collection(folder: Path) -> None:
    """Make `folder` a collections path that holds gpuinfra.cluster: a link to ROOT under
    `folder/ansible_collections/gpuinfra/cluster` (the folders made private)."""
    link = folder / "ansible_collections" / "gpuinfra" / "cluster"
    link.parent.mkdir(mode=0o700, parents=True)
    link.symlink_to(ROOT, target_is_directory=True)


def module_util(name: str) -> ModuleType:
    """A module of the collection's plugins/module_utils, loaded from its file: for a definition gpuinfra shares with
    the plugins (which import it as ansible_collections.gpuinfra.cluster.plugins.module_utils.NAME)."""
    qualified = f"gpuinfra_module_utils_{name}"
    if qualified in sys.modules:
        return sys.modules[qualified]
    spec = importlib.util.spec_from_file_location(qualified, ROOT / "plugins" / "module_utils" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[qualified] = module  # before it runs: its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module
