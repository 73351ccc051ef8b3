#!/usr/bin/python
# Copyright: gpuinfra maintainers
# Apache License 2.0 (see LICENSE)
"""Receipts: what each role last converged a host to, so that a re-apply skips a role only when neither its inputs
nor the state it manages have changed since."""

from __future__ import annotations

import glob
import hashlib
import json
import os
import re
import shutil
import stat
import subprocess
import time
from typing import Any

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
---
module: receipt
short_description: Record what a role converged a host to, or find which roles' receipts still hold
version_added: "0.1.0"
description:
  - With O(state=record), the last step of a role, writes the role's receipt to
    C(/var/lib/gpuinfra/receipts/ROLE.json), readable by root only. It holds the digest of the role's inputs and the
    live state of everything the role manages, read back from the host.
  - With O(state=probe), at the start of a run, reads every receipt in one round trip and reads the same state
    again. A role is fresh when its receipt exists, its inputs digest is the one given, and none of its watched
    state differs. Anything else (no receipt, new inputs, an edited file, a stopped or disabled service, a package
    at another version, a removed hold, a changed command output) makes it stale, with the reason.
  - Watched state is read only with fixed programs (C(systemctl show), C(dpkg-query)) and the role's own read-only
    commands, never through a shell.
  - The action plugin of the same name fills O(inputs) and O(secrets) on the controller. It completes each role's
    inputs digest from the inventory with the values the run gives the public variables the role reads, whatever
    their source (inventory, group_vars, ansible-vault, extra vars, AWX), digested with a key kept in the
    controller's secrets folder.
options:
  state:
    description: Write one role's receipt, or check every receipt on the host.
    type: str
    choices: [record, probe]
    required: true
  role:
    description: The role whose receipt O(state=record) writes.
    type: str
  inputs:
    description:
      - With O(state=record), the digest of the role's inputs.
      - With O(state=probe), a mapping of each role to the digest of its inputs in this run.
    type: raw
  secrets:
    description:
      - Keyed digests (HMAC-SHA256 under the controller's receipts key) of secret files on the controller, by path,
        filled in by the action plugin; never logged.
      - With O(state=record), those the role installs (a generated key or password); with O(state=probe), every
        file of the cluster's secrets folder but other hosts' own. A role whose recorded secret is now missing or
        different is stale.
    type: dict
    default: {}
  paths:
    description:
      - Files and folders the role manages; a folder stands for everything under it.
      - A wildcard pattern stands for the paths it matches, so a file added or removed there is a change too.
    type: list
    elements: str
    default: []
  folders:
    description:
      - Folders the role creates or sets, whose type, mode and owner are watched, but not what is in them (a log
        or spool folder others write into).
    type: list
    elements: str
    default: []
  services:
    description:
      - systemd units the role keeps running, whose active and enabled states it sets, masked included.
      - Such a unit is converged only while C(active). One C(failed), C(activating) (starting, or waiting to restart
        after a crash), C(reloading), C(deactivating) or C(inactive) is not, so no receipt is written while one is,
        and a probe that finds one makes the role stale, whatever the receipt recorded.
    type: list
    elements: str
    default: []
  packages:
    description: Debian packages whose version and hold the role sets.
    type: list
    elements: str
    default: []
  globs:
    description: Path patterns whose matches the role depends on (such as the installed kernels).
    type: list
    elements: str
    default: []
  commands:
    description: Read-only commands (argument lists) whose output shows state the role manages elsewhere.
    type: list
    elements: list
    default: []
  checks:
    description:
      - Read-only commands that must pass for the receipt to hold, whatever they answered when it was written, such
        as the node health program's verdict or the scheduler listing the node as in service.
      - Each is O(argv), an argument list, and optionally O(stdout), a regular expression its whole output (spaces
        around it stripped) must match. A check passes when it exits 0 and its output matches.
      - A probe runs them last, and only for a role that is fresh otherwise.
    type: list
    elements: dict
    default: []
  stale_after:
    description:
      - With O(state=record), a time (seconds since the epoch) after which the receipt no longer holds, whatever
        else is unchanged, for a role whose own state expires, such as a certificate due for renewal.
    type: int
  secrets_dir:
    description:
      - With O(state=probe), the controller's secrets folder, whose files the action plugin digests.
      - By default the folder the roles generate secrets into, C(gpuinfra_secrets_dir) or
        C(~/.local/share/gpuinfra/CLUSTER/secrets).
    type: path
  directory:
    description: Where receipts are kept.
    type: path
    default: /var/lib/gpuinfra/receipts
  group_prefix:
    description:
      - With O(state=probe), put the host, on the controller, in the group O(group_prefix)ROLE of each fresh role, of
        each role in O(left_out), and of each role of O(guards) whose guarded roles are all fresh, so that the plays
        of those roles leave it out (their hosts pattern C(gpu_nodes:!gpuinfra_fresh_nvidia_driver)). Empty joins
        no group.
      - Read by the action plugin; the groups live in this run's inventory only.
    type: str
    default: ""
  left_out:
    description:
      - With O(group_prefix), roles the cluster leaves out on this host, skipped as if fresh.
      - Without it, those the inventory names in C(gpuinfra_roles_left_out) and, for this host,
        C(gpuinfra_host_roles_left_out).
    type: list
    elements: str
  guards:
    description:
      - With O(group_prefix), a role that only guards others (its checks come before their installs), mapped to
        those roles; it is skipped where all of them are fresh.
    type: dict
    default: {}
author: gpuinfra maintainers
"""

EXAMPLES = r"""
- name: Read every receipt, and leave each host out of the plays of its fresh roles
  gpuinfra.cluster.receipt:
    state: probe
    group_prefix: gpuinfra_fresh_
    guards: {gpu_preflight: [nvidia_driver, nvidia_container_toolkit]}

- name: Record what this role converged
  gpuinfra.cluster.receipt:
    state: record
    role: munge
    paths: [/etc/munge/munge.key]
    services: [munge.service]
    packages: [munge]
"""

RETURN = r"""
fresh:
  description: With O(state=probe), the roles whose receipt still holds.
  type: list
  elements: str
  returned: state=probe
stale:
  description: With O(state=probe), each role with a receipt or inputs that does not hold, and why.
  type: dict
  returned: state=probe
"""

FORMAT = 1
COMMAND_TIMEOUT = 60
# The version of a package on a host without dpkg: never the same twice, so such a role is never skipped.
UNKNOWN = "unknown"


BYTECODE_CACHE = "__pycache__"


def file_digest(path: str) -> str:
    """Content, type, mode and owner of a path; a folder's digest covers everything under it but Python's bytecode
    caches."""
    digest = hashlib.sha256()

    def add(entry: str, rel: str) -> None:
        try:
            info = os.lstat(entry)
        except FileNotFoundError:
            digest.update(f"{rel}\0absent\n".encode())
            return
        digest.update(f"{rel}\0{info.st_mode:o}\0{info.st_uid}\0{info.st_gid}\0".encode())
        if stat.S_ISLNK(info.st_mode):
            digest.update(os.readlink(entry).encode())
        elif stat.S_ISREG(info.st_mode):
            with open(entry, "rb") as handle:
                for block in iter(lambda: handle.read(1 << 20), b""):
                    digest.update(block)
        elif stat.S_ISDIR(info.st_mode):
            # Python writes its bytecode cache beside a library the first time the library runs: that is not
            # something a role wrote, and watching it would make the role stale after its first use.
            for name in sorted(set(os.listdir(entry)) - {BYTECODE_CACHE}):
                add(os.path.join(entry, name), f"{rel}/{name}")
        digest.update(b"\n")

    add(path, path)
    return digest.hexdigest()


def folder_state(path: str) -> str:
    """Type, mode and owner of a folder itself, or `absent`."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return "absent"
    return f"{info.st_mode:o} {info.st_uid}:{info.st_gid}"


def service_states(module: AnsibleModule, units: list[str]) -> dict[str, str]:
    """`ActiveState/UnitFileState` of each unit, from one `systemctl show`."""
    if not units:
        return {}
    rc, out, err = module.run_command(["systemctl", "show", "--property=Id,ActiveState,UnitFileState", "--", *units])
    if rc != 0:
        module.fail_json(msg=f"systemctl show failed: {err.strip()}")
    states = []
    for block in out.strip().split("\n\n"):
        fields = dict(line.split("=", 1) for line in block.splitlines() if "=" in line)
        states.append(f"{fields.get('ActiveState', '')}/{fields.get('UnitFileState', '')}")
    return dict(zip(units, states, strict=False))


def package_states(module: AnsibleModule, names: list[str]) -> dict[str, str]:
    """`version want` of each package (want is `hold` for a held one), `absent` for one not installed."""
    if not names:
        return {}
    if shutil.which("dpkg-query") is None:
        return dict.fromkeys(names, UNKNOWN)
    # dpkg-query exits 1 when a name is not installed; the others are still listed.
    show = "--showformat=${Package}\t${db:Status-Abbrev}\t${Version}\t${db:Status-Want}\n"
    _, out, _ = module.run_command(["dpkg-query", "--show", show, "--", *names])
    found: dict[str, str] = {}
    for line in out.splitlines():
        package, status, version, want = [*line.split("\t"), "", "", ""][:4]
        if status.startswith("ii"):
            found[package.split(":")[0]] = f"{version} {want}"
    return {name: found.get(name, "absent") for name in names}


def command_digest(argv: list[str]) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, timeout=COMMAND_TIMEOUT, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"failed: {type(exc).__name__}"
    return hashlib.sha256(done.returncode.to_bytes(2, "big", signed=True) + done.stdout).hexdigest()


def failed_check(check: dict[str, Any]) -> str:
    """Why a check does not pass now, or empty when it does."""
    argv = [str(arg) for arg in check.get("argv") or []]
    if not argv:
        return "a check without a command"
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=COMMAND_TIMEOUT, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"check {argv[0]}: {type(exc).__name__}"
    if done.returncode != 0:
        return f"check {argv[0]} exited {done.returncode}"
    pattern = check.get("stdout")
    if pattern and re.fullmatch(pattern, done.stdout.strip()) is None:
        return f"check {argv[0]} answered {done.stdout.strip()[:80]!r}"
    return ""


def expand(patterns: list[str]) -> list[str]:
    """Each path, or every path a wildcard pattern matches now."""
    found = {path for pattern in patterns for path in (glob.glob(pattern) if set("*?[") & set(pattern) else [pattern])}
    return sorted(found)


def watched_state(
    module: AnsibleModule,
    watch: dict[str, Any],
    units: dict[str, str] | None = None,
    debs: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The live state of what `watch` names; `units` and `debs`, where given, already hold its services' and
    packages' states (one query for every role of a probe)."""
    services, packages = watch.get("services", []), watch.get("packages", [])
    return {
        "paths": {path: file_digest(path) for path in expand(watch.get("paths", []))},
        "folders": {path: folder_state(path) for path in watch.get("folders", [])},
        "services": {u: units[u] for u in services} if units is not None else service_states(module, services),
        "packages": {p: debs[p] for p in packages} if debs is not None else package_states(module, packages),
        "globs": {pattern: sorted(glob.glob(pattern)) for pattern in watch.get("globs", [])},
        "commands": {" ".join(argv): command_digest(argv) for argv in watch.get("commands", [])},
    }


# The one ActiveState in which a unit a role keeps running is converged. `activating` is a start still going (its
# outcome unknown) or a restart loop between crashes; `reloading` a configuration change still being read; both may
# yet end `failed`. A receipt is a claim that the state has settled, so they count as not running, as `inactive`,
# `deactivating` and `failed` do: the next apply runs the role again, which costs a run, where a receipt would
# have hidden a broken daemon until the next change.
RUNNING = "active"


def not_running(live: dict[str, Any]) -> list[str]:
    """Each watched unit that is not active, with its state: `slurmdbd.service is activating`."""
    states = {unit: state.split("/")[0] for unit, state in live.get("services", {}).items()}
    return [f"{unit} is {state or 'unknown'}" for unit, state in sorted(states.items()) if state != RUNNING]


def differences(recorded: dict[str, Any], live: dict[str, Any]) -> list[str]:
    """What differs between a receipt's state and the live one, one line per item."""
    out = []
    for kind in sorted(live):
        before, now = recorded.get(kind, {}), live[kind]
        for item in sorted(set(before) | set(now)):
            if before.get(item) != now.get(item) or now.get(item) == UNKNOWN:
                out.append(f"{kind} {item}: {before.get(item)!r} -> {now.get(item)!r}")
    return out


def read_receipt(path: str) -> dict[str, Any] | None:
    try:
        with open(path, encoding="utf-8") as handle:
            receipt = json.load(handle)
    except (OSError, ValueError):
        return None
    return receipt if isinstance(receipt, dict) and receipt.get("format") == FORMAT else None


def open_folder(path: str) -> str:
    """Why the receipts folder cannot be trusted (anyone but root may change it), or empty."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return ""
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != 0 or info.st_mode & 0o077:
        return f"the receipts folder {path} is {stat.filemode(info.st_mode)} owned by uid {info.st_uid}"
    return ""


def secure_folder(path: str) -> bool:
    """The receipts folder as record makes it: root's, 0700, whatever someone changed since. True if it was not."""
    info = os.lstat(path)
    changed = stat.S_IMODE(info.st_mode) != 0o700
    os.chmod(path, 0o700)
    if info.st_uid != 0 and os.geteuid() == 0:
        os.chown(path, 0, 0)
        changed = True
    return changed


def probe(module: AnsibleModule) -> dict[str, Any]:
    inputs = module.params["inputs"] or {}
    if not isinstance(inputs, dict):
        module.fail_json(msg="inputs must map each role to its digest when state=probe")
    fresh, stale, held = [], {}, {}
    untrusted = open_folder(module.params["directory"]) if os.geteuid() == 0 else ""
    for role, digest in sorted(inputs.items()):
        receipt = read_receipt(os.path.join(module.params["directory"], f"{role}.json"))
        if untrusted:
            stale[role] = untrusted
        elif receipt is None:
            stale[role] = "no receipt"
        elif receipt.get("inputs") != digest:
            stale[role] = "its inputs changed"
        elif receipt.get("stale_after") is not None and time.time() >= receipt["stale_after"]:
            stale[role] = "what it made expires (a certificate due for renewal)"
        elif any(module.params["secrets"].get(path) != sha for path, sha in receipt.get("secrets", {}).items()):
            stale[role] = "a secret on the controller changed"
        else:
            held[role] = receipt
    # One systemctl and one dpkg-query for the services and packages of every receipt still held, not one each.
    watches = [receipt.get("watch", {}) for receipt in held.values()]
    units = service_states(module, list(dict.fromkeys(u for watch in watches for u in watch.get("services", []))))
    debs = package_states(module, list(dict.fromkeys(p for watch in watches for p in watch.get("packages", []))))
    for role, receipt in held.items():
        watch = receipt.get("watch", {})
        live = watched_state(module, watch, units, debs)
        # A unit that is not running was never converged, even where the receipt recorded it so (an older module
        # wrote one while a unit was activating). Checks run last, and stop at the first that fails: they may
        # take a while (a health check).
        failed = (
            "; ".join(differences(receipt.get("state", {}), live))
            or "; ".join(f"services {unit}, not active" for unit in not_running(live))
            or next(filter(None, map(failed_check, watch.get("checks", []))), "")
        )
        if failed:
            stale[role] = failed
        else:
            fresh.append(role)
    return {"changed": False, "fresh": fresh, "stale": stale}


def record(module: AnsibleModule) -> dict[str, Any]:
    role, inputs = module.params["role"], module.params["inputs"]
    if not role or not isinstance(inputs, str):
        module.fail_json(msg="state=record needs role and the inputs digest of that role")
    kinds = ("paths", "folders", "services", "packages", "globs", "commands", "checks")
    watch = {key: module.params[key] for key in kinds}
    receipt = {
        "format": FORMAT,
        "role": role,
        "inputs": inputs,
        "secrets": module.params["secrets"],
        "watch": watch,
        "state": watched_state(module, watch),
        "stale_after": module.params["stale_after"],
    }
    directory = module.params["directory"]
    target = os.path.join(directory, f"{role}.json")
    stopped = not_running(receipt["state"])
    if stopped:
        # Not converged: the next apply runs the role again rather than skip it.
        if not module.check_mode and os.path.exists(target):
            os.unlink(target)
        return {"changed": False, "msg": f"no receipt while a unit is not active: {', '.join(stopped)}"}
    closed = False
    if not module.check_mode:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        closed = secure_folder(directory)
        temporary = f"{target}.tmp"
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
            json.dump(receipt, handle, sort_keys=True)
        os.replace(temporary, target)
    # Bookkeeping of gpuinfra's own, not a change to the cluster; closing the folder someone opened is one.
    return {"changed": closed}


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "state": {"type": "str", "choices": ["record", "probe"], "required": True},
            "role": {"type": "str"},
            # Keyed digests of values and secrets: never logged, as a module's arguments are in the host's journal.
            "inputs": {"type": "raw", "no_log": True},
            "secrets": {"type": "dict", "default": {}, "no_log": True},
            "paths": {"type": "list", "elements": "str", "default": []},
            "folders": {"type": "list", "elements": "str", "default": []},
            "services": {"type": "list", "elements": "str", "default": []},
            "packages": {"type": "list", "elements": "str", "default": []},
            "globs": {"type": "list", "elements": "str", "default": []},
            "commands": {"type": "list", "elements": "list", "default": []},
            "checks": {"type": "list", "elements": "dict", "default": []},
            "stale_after": {"type": "int"},
            "secrets_dir": {"type": "path"},
            "directory": {"type": "path", "default": "/var/lib/gpuinfra/receipts"},
        },
        supports_check_mode=True,
    )
    module.exit_json(**(probe(module) if module.params["state"] == "probe" else record(module)))


if __name__ == "__main__":
    main()
