"""A role's receipt watches everything the role manages on its host: state missing from the watch list could be
changed by hand and the next apply, skipping the role, would never put it back.

Read from the roles' own task files, for every task that is not run on the controller:
- every file, folder or link a task writes or sets (template, copy, lineinfile, blockinfile, get_url, unarchive,
  file) must be named by the receipt's `paths` or `folders`, directly, by the variables it is made of, or by a
  watched folder above it;
- every unit a task starts, stops, enables or masks (systemd_service, service) must be named by its `services`;
- every package a task installs (apt, package, dnf) must be named by its `packages`;
- every group or user a task creates must be named by its `commands` (a `getent` of it).
"""

from __future__ import annotations

import fnmatch
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ruamel.yaml import YAML

from gpuinfra.render.receipts import receipt_roles

ROOT = Path(__file__).resolve().parents[2]
WRITERS = {
    f"ansible.builtin.{name}"
    for name in ("template", "copy", "lineinfile", "blockinfile", "get_url", "unarchive", "file")
}
UNITS = {"ansible.builtin.systemd_service", "ansible.builtin.service"}
UNIT_CHANGES = {"state", "enabled", "masked"}
PACKAGES = {"ansible.builtin.apt", "ansible.builtin.package", "ansible.builtin.dnf"}
ACCOUNTS = {"ansible.builtin.group", "ansible.builtin.user"}
RECEIPT = "gpuinfra.cluster.receipt"
PACKAGE_SOURCE = "package_source"
# Files a role writes and removes again in the same run: the policy that keeps services stopped while local
# packages install (roles/local_packages).
TRANSIENT = {"/usr/sbin/policy-rc.d"}
_JINJA = re.compile(r"\{\{(.*?)\}\}", re.DOTALL)
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_PACKAGE_LIST = re.compile(r"_(packages?|headers)$")


def _tasks(items: list[dict[str, Any]] | None, on_controller: bool = False) -> Iterator[tuple[dict[str, Any], bool]]:
    for task in items or []:
        local = on_controller or task.get("delegate_to") == "localhost"
        if "block" in task:
            for key in ("block", "rescue", "always"):
                yield from _tasks(task.get(key), local)
        else:
            yield task, local


_INCLUDES = ("ansible.builtin.include_role", "ansible.builtin.import_role")
_SIMPLE = re.compile(r"^\{\{ ([A-Za-z_][A-Za-z0-9_]*) \}\}$")


def _included_role(task: dict[str, Any]) -> str | None:
    module = next((name for name in _INCLUDES if name in task), None)
    return None if module is None else str(task[module]["name"]).removeprefix("gpuinfra.cluster.")


def _included(task: dict[str, Any], on_controller: bool) -> list[tuple[dict[str, Any], bool]]:
    """The tasks of a role another role includes (monitoring_web), written in the includer's variables: what they
    write is the includer's to watch. The package_source role's files follow its own contract, checked below."""
    role = _included_role(task)
    if role is None or role == PACKAGE_SOURCE:
        return []
    text = json.dumps(YAML(typ="safe").load((ROOT / "roles" / role / "tasks" / "main.yml").read_text()))
    for name, value in task.get("vars", {}).items():
        simple = _SIMPLE.match(str(value))
        if simple:
            text = re.sub(rf"\b{name}\b", simple[1], text)
    return list(_tasks(json.loads(text), on_controller))


def _role_tasks(role: str) -> list[tuple[dict[str, Any], bool]]:
    yaml = YAML(typ="safe")
    pairs = [
        pair
        for path in sorted((ROOT / "roles" / role / "tasks").glob("*.yml"))
        for pair in _tasks(yaml.load(path.read_text()))
    ]
    return pairs + [pair for task, local in pairs for pair in _included(task, local)]


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


def _receipt(role: str) -> tuple[list[tuple[dict[str, Any], bool]], dict[str, Any]]:
    tasks = _role_tasks(role)
    receipts = [task[RECEIPT] for task, _ in tasks if RECEIPT in task]
    assert len(receipts) == 1, f"{role} records {len(receipts)} receipts"
    return tasks, receipts[0]


def _package_sources(role: str) -> list[dict[str, Any]]:
    """The settings each package_source include of a role passes."""
    return [task["vars"] for task, _ in _role_tasks(role) if _included_role(task) == PACKAGE_SOURCE]


def _names(value: Any) -> set[str]:
    """The variables a templated value is made of, or the value itself when it is literal."""
    text = str(value)
    found = {name for expr in _JINJA.findall(text) for name in _NAME.findall(expr)} - {"item"}
    return found or {text}


@pytest.mark.parametrize("role", receipt_roles())
def test_the_receipt_watches_every_file_the_role_writes(role: str) -> None:
    tasks, receipt = _receipt(role)
    paths, folders = receipt.get("paths", []), receipt.get("folders", [])
    both = isinstance(paths, list) and isinstance(folders, list)
    watch: list[str] | str = [*paths, *folders] if both else f"{paths} {folders}"
    unwatched = [
        task[module].get("dest") or task[module].get("path")
        for task, on_controller in tasks
        for module in WRITERS & set(task)
        if not on_controller
        and (task[module].get("dest") or task[module].get("path")) not in TRANSIENT
        and not _covered(
            str(task[module].get("dest") or task[module].get("path")).rstrip("/"), task.get("loop", ""), watch
        )
    ]
    assert unwatched == [], f"{role} writes files its receipt does not watch: {unwatched}"


# What the package_source role writes for a product NAME (its argument specs say the same to the including role).
PACKAGE_SOURCE_FILES = {
    "__package_source_apt_sources": "/etc/apt/sources.list.d/gpuinfra-{{ package_source_name }}.sources",
    "__package_source_apt_keyring": (
        "/etc/apt/keyrings/gpuinfra-{{ package_source_name }}{{ __package_source_key_ext }}"
    ),
    "__package_source_rpm_key": "/etc/pki/rpm-gpg/RPM-GPG-KEY-gpuinfra-{{ package_source_name }}",
    "__package_source_local_dir": "/var/cache/gpuinfra/{{ package_source_name }}",
}
PACKAGE_SOURCE_WATCH = (
    "/etc/apt/sources.list.d/gpuinfra-{}.sources",
    "/etc/apt/keyrings/gpuinfra-{}*",
    "/var/cache/gpuinfra/{}",
)


def test_the_package_source_role_writes_only_files_named_after_its_product() -> None:
    """Every file it writes, itself or through the roles it includes, is one of PACKAGE_SOURCE_FILES (or the key's
    staging copy beside it), so that an including role's receipt can name them all from the product's name."""
    folder = ROOT / "roles" / PACKAGE_SOURCE
    assert {
        k: v
        for k, v in YAML(typ="safe").load((folder / "vars" / "main.yml").read_text()).items()
        if k in PACKAGE_SOURCE_FILES
    } == PACKAGE_SOURCE_FILES
    named = {f"{{{{ {name} }}}}" for name in PACKAGE_SOURCE_FILES}
    written = []
    for path in sorted((folder / "tasks").glob("*.yml")):
        for task, _ in _tasks(YAML(typ="safe").load(path.read_text())):
            written += [task[m].get("dest") or task[m].get("path") for m in WRITERS & set(task)]
            if _included_role(task) == "package_signing_key":
                written += re.findall(r"__package_source_\w+", task["vars"]["package_signing_key_dest"])
            if _included_role(task) == "local_packages":
                written.append(task["vars"]["local_packages_dest"])
    written = [w if w.startswith("{{") else f"{{{{ {w} }}}}" for w in written]
    assert written and set(written) <= named, f"package_source writes {set(written) - named}"


@pytest.mark.parametrize("role", [r for r in receipt_roles() if _package_sources(r)])
def test_the_receipt_watches_the_package_source_of_the_role(role: str) -> None:
    _, receipt = _receipt(role)
    watch, packages = str(receipt.get("paths", [])), str(receipt.get("packages", ""))
    for settings in _package_sources(role):
        missing = [w.format(settings["package_source_name"]) for w in PACKAGE_SOURCE_WATCH]
        assert [w for w in missing if w not in watch] == []
        names = _names(settings["package_source_packages"]) | {"gpg"}  # gpg reads a signing key's fingerprint
        assert [n for n in names if not re.search(rf"\b{re.escape(n)}\b", packages)] == []


@pytest.mark.parametrize("role", receipt_roles())
def test_the_receipt_watches_every_unit_package_and_account_the_role_manages(role: str) -> None:
    tasks, receipt = _receipt(role)
    kinds = [(UNITS, "services"), (PACKAGES, "packages"), (ACCOUNTS, "commands")]
    unwatched = []
    for task, on_controller in tasks:
        for modules, kind in kinds:
            for module in modules & set(task):
                args = task[module]
                if on_controller or (kind == "services" and not UNIT_CHANGES & set(args)) or "name" not in args:
                    continue  # a local .deb (apt's deb:) is the package its name is watched by
                names = _names(args.get("name")) | (_names(task["loop"]) if "loop" in task else set())
                if kind == "packages":  # the package lists a name is made of (a version is not a package)
                    names = {n for n in names if not _JINJA.search(str(args.get("name"))) or _PACKAGE_LIST.search(n)}
                watch = str(receipt.get(kind, ""))
                if not all(re.search(rf"(?<![A-Za-z0-9_]){re.escape(name)}(?![A-Za-z0-9_])", watch) for name in names):
                    unwatched.append(f"{module} {args.get('name')} (not in {kind})")
    assert unwatched == [], f"{role} manages state its receipt does not watch: {unwatched}"


def test_every_unit_a_role_enables_is_unmasked_too() -> None:
    """A masked unit cannot be started: a role that enables a unit must also unmask it, so that one apply puts a
    masked unit back (its receipt sees the mask as drift)."""
    masked = [
        f"{role}: {task.get('name')}"
        for role in sorted(p.name for p in (ROOT / "roles").iterdir())
        for task, _ in _role_tasks(role)
        for module in UNITS & set(task)
        if task[module].get("enabled") is True and task[module].get("masked") is not False
    ]
    assert masked == []


def _site_plays() -> Iterator[dict[str, Any]]:
    yaml = YAML(typ="safe")
    for entry in yaml.load((ROOT / "playbooks" / "site.yml").read_text()):
        yield from yaml.load((ROOT / "playbooks" / entry["ansible.builtin.import_playbook"]).read_text())


# The entry points a role's receipt covers, where not main.yml: gpu_health's main is the health sweep, which runs
# at every apply; its receipt covers the installed health check.
RECEIPT_ENTRIES = {"gpu_health": {"install.yml"}, "slurm_accounting": {"main.yml", "cluster.yml"}}


def _play_entries(play: dict[str, Any]) -> set[tuple[str, str]]:
    """(role, tasks file) for each role a play runs."""
    entries = {((item["role"] if isinstance(item, dict) else item), "main.yml") for item in play.get("roles", [])}
    for task, _ in _tasks(play.get("tasks")):
        for module in ("ansible.builtin.import_role", "ansible.builtin.include_role"):
            if module in task:
                entries.add((task[module]["name"], task[module].get("tasks_from", "main.yml")))
    return {(name.removeprefix("gpuinfra.cluster."), tasks) for name, tasks in entries}


def test_every_play_leaves_out_the_hosts_of_its_fresh_roles() -> None:
    """A role with a receipt is skipped one way only: its plays leave out the group gpuinfra_fresh_<role> that
    playbooks/receipts.yml puts each fresh host in, so a skipped role costs the host nothing, not even its facts."""
    with_receipt = set(receipt_roles())
    missing = [
        f"{play['name']}: {role}"
        for play in _site_plays()
        for role, tasks in sorted(_play_entries(play))
        if role in with_receipt and tasks in RECEIPT_ENTRIES.get(role, {"main.yml"})
        if f"!gpuinfra_fresh_{role}" not in play["hosts"].split(":")
    ]
    assert missing == []
