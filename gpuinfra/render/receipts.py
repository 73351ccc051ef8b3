"""The digest of each role's inputs on each host, which the role's receipt records (plugins/modules/receipt.py).

A re-apply skips a role on a host when the digest is the one its receipt holds and the state the receipt watches
has not drifted. So the digest must change whenever anything the role could read changes:
- the collection's code: the role's own files, the roles it pulls in, the playbooks and the plugins;
- the value of every inventory variable whose name appears anywhere in those role files (an identifier scan: it
  may count a variable the role never reads, which only costs a skipped skip, never a missed change);
- the groups the host is in;
- for a role that reads `groups`, the members of the groups it names (`groups['slurm_controller']`), or of every
  group where it reads them any other way;
- for a role that reads another host's `hostvars`, the variables of every host (`hostvars[inventory_hostname]` is
  the host's own, already counted). Where the role can only name those hosts through the groups it subscripts and
  the values it reads (it subscripts `hostvars` and `groups`, and reads no list of the play's or the inventory's
  hosts), only the members of those groups and the hosts those values name count: so a new GPU node leaves
  Alertmanager's peers alone.

Facts are not inputs: what a role reads from the host itself is the state its receipt watches.

That digest covers gpuinfra's own inventory. A value may also come from elsewhere: group_vars or host_vars beside a
plain inventory, ansible-vault, `-e`, an AWX survey. So the inventory also names, per role, the public role
variables its files read (`NAMES`), and the receipt's action plugin digests their values as the run sees
them, whatever their source, into the same receipt.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Iterator, Mapping
from functools import cache
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML

from ..collection import ROOT, module_util

_PROTOCOL = module_util("receipt_protocol")  # the names the receipt's action plugin reads, defined there once
INPUTS_PREFIX: str = _PROTOCOL.INPUTS_PREFIX
HOST_INPUTS: str = _PROTOCOL.HOST_INPUTS
"""Each host carries one digest of its own variables, and each role's digest is shared by a whole node group."""
HOST_MARK: str = _PROTOCOL.HOST_MARK
NAMES: str = _PROTOCOL.NAMES
RECEIPT_MODULE = "gpuinfra.cluster.receipt"
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_ROLE_REFERENCE = re.compile(r"gpuinfra\.cluster\.([a-z0-9_]+)")
_GROUP_SUBSCRIPT = re.compile(r"""\bgroups\[\s*(['"])([\w.-]+)\1\s*\]""")
_GROUPS_KEY = re.compile(r"\bgroups\s*:")  # a YAML key (a rules file's `groups:`, a module's argument): no read
_OWN_HOSTVARS = re.compile(r"\bhostvars\[\s*inventory_hostname\s*\]")
_HOSTVARS_WHOLE = re.compile(r"\bhostvars\b(?!\s*\[)")  # hostvars not subscripted: `map('extract', hostvars)`
_HOST_LISTS = re.compile(
    r"\b(ansible_play_hosts|ansible_play_hosts_all|ansible_play_batch|play_hosts|inventory_hostnames)\b"
)
_DIGEST_LENGTH = 24  # 96 bits: no collision between two states of one role on one host


def _files(folder: Path) -> list[Path]:
    return sorted(path for path in folder.rglob("*") if path.is_file() and "__pycache__" not in path.parts)


def _digest(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:_DIGEST_LENGTH]


@cache
def _code_digest() -> str:
    """Playbooks and plugins: a change to either may change what any role does."""
    digest = hashlib.sha256()
    for folder in ("playbooks", "plugins"):
        for path in _files(ROOT / folder):
            digest.update(f"{path.relative_to(ROOT)}\0".encode() + path.read_bytes() + b"\0")
    return digest.hexdigest()


@cache
def _role_files(role: str) -> tuple[str, tuple[Path, ...]]:
    """(digest of the role's files and those of the roles it names, those files)."""
    seen: list[str] = []
    pending = [role]
    while pending:
        name = pending.pop()
        if name in seen or not (ROOT / "roles" / name).is_dir():
            continue
        seen.append(name)
        for path in _files(ROOT / "roles" / name):
            pending.extend(_ROLE_REFERENCE.findall(path.read_text(errors="replace")))
    digest = hashlib.sha256()
    files = [path for name in sorted(seen) for path in _files(ROOT / "roles" / name)]
    for path in files:
        digest.update(f"{path.relative_to(ROOT)}\0".encode() + path.read_bytes() + b"\0")
    return digest.hexdigest(), tuple(files)


def _strings(value: Any) -> Iterator[str]:
    """Every scalar inside a YAML value, as text."""
    if isinstance(value, Mapping):
        for key, item in value.items():
            yield str(key)
            yield from _strings(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _strings(item)
    else:
        yield str(value)


# Files Ansible never evaluates: a role's README, and its argument specs, whose defaults are documentation (the
# values come from defaults/main.yml) and whose option names are all in defaults/main.yml too.
_NOT_READ = ("README.md", "meta/argument_specs.yml")


@cache
def role_text(role: str, overridden: frozenset[str] = frozenset()) -> str:
    """What the role and the roles it names may evaluate, for the scans below: their files, less those Ansible never
    reads, and less the default value of each variable in `overridden`. The inventory sets those for every host,
    and role defaults are Ansible's lowest precedence, so those values are never evaluated (their names stay)."""
    texts = []
    for path in _role_files(role)[1]:
        if path.as_posix().endswith(_NOT_READ):
            continue
        text = path.read_text(errors="replace")
        if path.parent.name == "defaults" and path.name == "main.yml" and overridden:
            defaults = YAML(typ="safe", pure=True).load(text) or {}
            text = "\n".join(
                f"{name}: " + ("" if name in overridden else " ".join(_strings(value)))
                for name, value in defaults.items()
            )
        texts.append(text)
    return "\n".join(texts)


def _code(text: str) -> str:
    """The text less its comment lines (YAML, Jinja line comments, shell): a word there is never read."""
    return "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))


def group_reads(text: str) -> frozenset[str] | None:
    """The inventory groups whose members a role's text may read: those it subscripts by name, or None (every
    group) where it reads `groups` any other way."""
    code = _code(text)
    if re.search(r"\bgroups\b", _GROUPS_KEY.sub("", _GROUP_SUBSCRIPT.sub("", code))):
        return None
    return frozenset(match[1] for match in _GROUP_SUBSCRIPT.findall(code))


def reads_other_hosts(text: str) -> bool:
    """Whether a role's text may read another host's variables: any `hostvars` but the host's own."""
    return re.search(r"\bhostvars\b", _OWN_HOSTVARS.sub("", _code(text))) is not None


def names_its_hosts(text: str) -> bool:
    """Whether every other host a role may read the variables of is named by a group it subscripts or by a value it
    reads: it subscripts `hostvars` and `groups` only, and reads no list of the play's or the inventory's hosts."""
    code = _code(text)
    return group_reads(text) is not None and not _HOSTVARS_WHOLE.search(code) and not _HOST_LISTS.search(code)


@cache
def receipt_roles() -> tuple[str, ...]:
    """Roles that record a receipt: those whose tasks call the receipt module."""
    return tuple(
        role.name
        for role in sorted((ROOT / "roles").iterdir())
        if any(RECEIPT_MODULE in path.read_text() for path in _files(role / "tasks"))
    )


@cache
def _public_variables() -> frozenset[str]:
    """Every variable a user may set: the keys of every role's defaults."""
    yaml = YAML(typ="safe", pure=True)
    names: set[str] = set()
    for defaults in (ROOT / "roles").glob("*/defaults/main.yml"):
        names.update(yaml.load(defaults.read_text()) or {})
    return frozenset(names)


@cache
def receipt_variables() -> dict[str, list[str]]:
    """Role -> the public role variables its files (and those of the roles it names) read."""
    return {role: sorted(set(_IDENTIFIER.findall(role_text(role))) & _public_variables()) for role in receipt_roles()}


def _other_hosts(
    text: str,
    names: list[str],
    shared: Mapping[str, Any],
    group_values: Mapping[str, Mapping[str, Any]],
    own: Mapping[str, Mapping[str, Any]],
    node_group_of: Mapping[str, str],
    groups: Mapping[str, list[str]],
) -> Any:
    """What a role may read of the other hosts' variables (see the module's doc): None when it reads none."""
    if not reads_other_hosts(text):
        return None
    if not names_its_hosts(text):
        return [group_values, own, node_group_of]
    values = [
        [shared.get(name) for name in names],
        list(group_values.values()),
        [[variables[name] for name in names if name in variables] for variables in own.values()],
    ]
    found = {word for word in _strings(values) if word in own}
    for name in group_reads(text) or ():
        found.update(groups.get(name, []))
    return {
        host: [node_group_of.get(host), group_values.get(node_group_of.get(host, ""), {}), own.get(host, {})]
        for host in sorted(found)
    }


def receipt_inputs(
    shared: Mapping[str, Any],
    node_groups: Mapping[str, tuple[list[str], Mapping[str, Any]]],
    own: Mapping[str, Mapping[str, Any]],
    members: Mapping[str, Iterable[str]],
) -> dict[str, dict[str, str]]:
    """host -> {`gpuinfra_receipt_<role>`: digest, HOST_INPUTS: digest}, from the inventory's `all` vars, the
    vars each node group's hosts share, each host's own vars (which win, as in Ansible) and the inventory's groups.

    Hosts of one node group differ in few variables (their address), and those go into the host's one digest: a
    role gets one digest per node group, so 10,000 hosts cost as much as their node groups, plus a digest each."""
    groups = {name: sorted(hosts) for name, hosts in members.items()}
    host_groups: dict[str, list[str]] = {host: [] for host in own}
    for name, hosts in groups.items():
        for host in hosts:
            host_groups.setdefault(host, []).append(name)
    node_group_of = {host: group for group, (hosts, _) in node_groups.items() for host in hosts}
    # Hosts of one node group and the same groups get one digest per role (unless the role reads their own vars).
    alike = {host: (node_group_of.get(host), tuple(host_groups[host])) for host in own}
    known = set(shared).union(*own.values(), *(variables for _, variables in node_groups.values()))
    out: dict[str, dict[str, str]] = {host: {HOST_INPUTS: _digest(variables)} for host, variables in own.items()}
    for role in receipt_roles():
        files = _role_files(role)[0]
        text = role_text(role, _public_variables().intersection(shared))
        identifiers = set(_IDENTIFIER.findall(text))
        names = sorted(identifiers & known)
        group_values = {g: {n: v[n] for n in names if n in v} for g, (_, v) in node_groups.items()}
        read_groups = group_reads(text)
        base = _digest(
            _code_digest(),
            files,
            {name: shared[name] for name in names if name in shared},
            groups if read_groups is None else {name: groups.get(name, []) for name in sorted(read_groups)},
            _other_hosts(text, names, shared, group_values, own, node_group_of, groups),
        )
        read = set(names)
        seen: dict[tuple[Any, ...], str] = {}
        for host, variables in own.items():
            key = (*alike[host], not read.isdisjoint(variables))
            if key not in seen:
                group = key[0]
                digest = _digest(base, host_groups[host], group_values.get(group, {}) if group else {})
                seen[key] = digest + HOST_MARK if key[-1] else digest
            out[host][INPUTS_PREFIX + role] = seen[key]
    return out
