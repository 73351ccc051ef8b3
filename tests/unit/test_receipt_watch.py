"""A role's receipt watches every file the role writes on its host: a file missing from the watch list could be
edited by hand and the next apply, skipping the role, would never put it back.

Read from the roles' own task files: every template, copy, lineinfile, blockinfile, get_url and unarchive target
that is not on the controller must be named by the receipt's `paths`, directly, by the variables it is made of, or
by a watched folder above it.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ruamel.yaml import YAML

from gpuinfra.render.receipts import receipt_roles

ROOT = Path(__file__).resolve().parents[2]
WRITERS = {
    f"ansible.builtin.{name}" for name in ("template", "copy", "lineinfile", "blockinfile", "get_url", "unarchive")
}
RECEIPT = "gpuinfra.cluster.receipt"
_JINJA = re.compile(r"\{\{(.*?)\}\}")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _tasks(items: list[dict[str, Any]] | None, on_controller: bool = False) -> Iterator[tuple[dict[str, Any], bool]]:
    for task in items or []:
        local = on_controller or task.get("delegate_to") == "localhost"
        if "block" in task:
            for key in ("block", "rescue", "always"):
                yield from _tasks(task.get(key), local)
        else:
            yield task, local


def _role_tasks(role: str) -> list[tuple[dict[str, Any], bool]]:
    yaml = YAML(typ="safe")
    return [
        pair
        for path in sorted((ROOT / "roles" / role / "tasks").glob("*.yml"))
        for pair in _tasks(yaml.load(path.read_text()))
    ]


def _covered(dest: str, loop: Any, watch: list[str] | str) -> bool:
    """Whether the watch names `dest`: literally, under a watched folder, through a watched pattern (for each item
    of a literal loop), or by every variable `dest` and its loop are made of."""
    text = str(watch)
    entries = watch if isinstance(watch, list) else []
    if isinstance(loop, list) and "{{ item }}" in dest and all(isinstance(item, str) for item in loop):
        return all(_covered(dest.replace("{{ item }}", item), None, watch) for item in loop)
    if "item" not in dest and (
        dest in text or any(dest.startswith(e.rstrip("/") + "/") or fnmatch.fnmatch(dest, e) for e in entries)
    ):
        return True
    pattern = re.sub(r"\{\{ item[^}]*\}\}", "*", dest)
    if any(pattern.startswith(e.rstrip("/") + "/") or pattern == e for e in entries):
        return True
    names = {name for expr in _JINJA.findall(dest) for name in _NAME.findall(expr)} - {"item", "dest"}
    if "item" in dest:
        names |= {name for expr in _JINJA.findall(str(loop)) for name in _NAME.findall(expr)}
    return bool(names) and all(re.search(rf"\b{name}\b", text) for name in names)


@pytest.mark.parametrize("role", receipt_roles())
def test_the_receipt_watches_every_file_the_role_writes(role: str) -> None:
    tasks = _role_tasks(role)
    receipts = [task[RECEIPT] for task, _ in tasks if RECEIPT in task]
    assert len(receipts) == 1, f"{role} records {len(receipts)} receipts"
    watch = receipts[0].get("paths", [])
    unwatched = [
        task[module].get("dest") or task[module].get("path")
        for task, on_controller in tasks
        for module in WRITERS & set(task)
        if not on_controller
        and not _covered(
            str(task[module].get("dest") or task[module].get("path")).rstrip("/"), task.get("loop", ""), watch
        )
    ]
    assert unwatched == [], f"{role} writes files its receipt does not watch: {unwatched}"


def test_every_role_with_a_receipt_skips_itself_first() -> None:
    for role in receipt_roles():
        main = YAML(typ="safe").load((ROOT / "roles" / role / "tasks" / "main.yml").read_text())
        first = (
            main[0]
            if role != "gpu_health"
            else YAML(typ="safe").load((ROOT / "roles" / role / "tasks" / "install.yml").read_text())[0]
        )
        assert first.get("ansible.builtin.meta") == "end_role", role
        assert f"'{role}' in gpuinfra_fresh_roles" in first["when"], role
