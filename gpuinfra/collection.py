"""Where the Ansible collection gpuinfra.cluster (roles, playbooks, plugins) is.

An installed wheel carries it inside this package (`_collection/`, see pyproject.toml); a checkout is itself the
collection, one folder above this package.
"""

from __future__ import annotations

from pathlib import Path

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
