# Copyright: gpuinfra maintainers
# Apache License 2.0 (see LICENSE)
"""The controller's half of gpuinfra.cluster.receipt: the inputs digests from the inventory, completed with the
values the run gives the role's variables, and keyed digests of the secrets on the controller, handed to the module
that reads and writes the receipts on the host.

A secret's digest is an HMAC under the controller's receipts key, so what a host keeps can never be tested against a
guessed secret; and a host gets none of the files another host owns (`<host>.crt`, `<host>.key`)."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
from collections.abc import Callable
from typing import Any

from ansible.errors import AnsibleActionFail, AnsibleError
from ansible.plugins.action import ActionBase
from ansible_collections.gpuinfra.cluster.plugins.module_utils.receipt_protocol import (
    HOST_INPUTS,
    HOST_MARK,
    HOST_ROLES_LEFT_OUT,
    INPUTS_PREFIX,
    NAMES,
    ROLES_LEFT_OUT,
)

# The key those values are digested with (HMAC-SHA256), made once in the controller's secrets folder: what a host
# keeps in its receipts can never be tested against a guessed password or key.
VALUES_KEY = "receipts.key"


def secret_digests(paths: list[str], key: bytes, root: str, host: str, hosts: list[str]) -> dict[str, str]:
    """Each file's HMAC-SHA256 under `key`, by its absolute path; a folder stands for every file under it, less the
    receipts key and, below the secrets folder `root`, the files of other hosts (`monitoring-tls/<host>.key`)."""
    others = set(hosts) - {host}
    root = os.path.abspath(os.path.expanduser(root))
    out: dict[str, str] = {}
    for given in paths:
        path = os.path.abspath(os.path.expanduser(given))
        files = [path]
        if os.path.isdir(path):
            files = [os.path.join(top, name) for top, _, names in os.walk(path) for name in names]
        for name in files:
            base = os.path.basename(name)
            owned = os.path.dirname(name) != root and base.split(".", 1)[0] in others
            if base == VALUES_KEY or owned or not os.path.isfile(name):
                continue
            try:
                with open(name, "rb") as handle:
                    out[name] = hmac.new(key, handle.read(), hashlib.sha256).hexdigest()
            except OSError:
                continue
    return out


def inputs_digest(digest: str, task_vars: dict[str, Any]) -> str:
    """A role's inputs digest on this host: the inventory's, completed with the host's own where it says so."""
    if digest.endswith(HOST_MARK):
        return f"{digest[: -len(HOST_MARK)]}:{task_vars.get(HOST_INPUTS, '')}"
    return str(digest)


def secrets_folder(task_vars: dict[str, Any]) -> str:
    """The controller's secrets folder, as the roles that generate secrets name it."""
    cluster = task_vars.get("gpuinfra_cluster_name") or "cluster"
    folder = task_vars.get("gpuinfra_secrets_dir") or f"~/.local/share/gpuinfra/{cluster}/secrets"
    return os.path.expanduser(str(folder))


def values_key(folder: str) -> bytes:
    """The controller's key for digests of values, made once (0600, in a 0700 folder). Forks race to make it: the
    first link wins and every fork reads the winner's."""
    path = os.path.join(folder, VALUES_KEY)
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except FileNotFoundError:
        pass
    os.makedirs(folder, mode=0o700, exist_ok=True)
    temporary = f"{path}.{os.getpid()}.tmp"
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "wb") as handle:
        handle.write(secrets.token_bytes(32))
    try:
        os.link(temporary, path)
    except FileExistsError:
        pass
    finally:
        os.unlink(temporary)
    with open(path, "rb") as handle:
        return handle.read()


class ActionModule(ActionBase):
    _supports_check_mode = True

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        task_vars = task_vars or {}
        result = super().run(tmp, task_vars)
        args = dict(self._task.args)
        state = args.get("state")
        if state == "probe":
            join = {key: args.pop(key, None) for key in ("group_prefix", "left_out", "guards")}
            if join["left_out"] is None:  # read here rather than templated in the task: a template costs each host
                join["left_out"] = [*(task_vars.get(ROLES_LEFT_OUT) or []), *(task_vars.get(HOST_ROLES_LEFT_OUT) or [])]
            if task_vars.get("gpuinfra_full"):
                return self._joined({**result, "changed": False, "fresh": [], "stale": {}}, join, task_vars)
            given = {
                key[len(INPUTS_PREFIX) :]: inputs_digest(value, task_vars)
                for key, value in task_vars.items()
                if key.startswith(INPUTS_PREFIX) and isinstance(value, str)
            }
            complete = self._values_digest(task_vars)
            args["inputs"] = {role: complete(role, digest) for role, digest in given.items()}
            folder = os.path.expanduser(str(args.pop("secrets_dir", None) or secrets_folder(task_vars)))
            args["secrets"] = self._secret_digests([folder], task_vars) if os.path.isdir(folder) else {}
        elif state == "record":
            role = str(args.get("role"))
            inputs = task_vars.get(INPUTS_PREFIX + role)
            if not isinstance(inputs, str):
                return {**result, "changed": False, "skipped": True, "msg": "no inputs digest in this inventory"}
            args["inputs"] = self._values_digest(task_vars)(role, inputs_digest(inputs, task_vars))
            args["secrets"] = self._secret_digests([str(path) for path in args.get("secrets") or []], task_vars)
        else:
            raise AnsibleActionFail("state must be record or probe")
        result.update(self._execute_module("gpuinfra.cluster.receipt", module_args=args, task_vars=task_vars))
        return self._joined(result, join, task_vars) if state == "probe" and not result.get("failed") else result

    def _joined(self, result: dict[str, Any], join: dict[str, Any], task_vars: dict[str, Any]) -> dict[str, Any]:
        """Put the host in the group of each role skipped on it (the module's group_prefix): one task per host,
        where a group_by would cost one per role."""
        prefix = join.get("group_prefix") or ""
        if not prefix:
            return result
        skipped = set(result.get("fresh") or []) | set(join.get("left_out") or [])
        skipped |= {role for role, guarded in (join.get("guards") or {}).items() if set(guarded) <= skipped}
        groups = [prefix + role for role in sorted(skipped)]
        host = str(task_vars.get("inventory_hostname"))
        if hasattr(ActionBase, "add_host"):  # ansible-core 2.21 and later ask the controller's inventory directly
            self.add_host(host, parent_group_names=groups)
        else:  # ansible-core 2.20 reads the result, as it does add_host's
            result["add_host"] = {"host_name": host, "groups": groups, "host_vars": {}}
        return result

    @staticmethod
    def _secret_digests(paths: list[str], task_vars: dict[str, Any]) -> dict[str, str]:
        if not paths:
            return {}
        hosts = list((task_vars.get("groups") or {}).get("all") or [])
        root = secrets_folder(task_vars)
        return secret_digests(paths, values_key(root), root, str(task_vars.get("inventory_hostname")), hosts)

    def _values_digest(self, task_vars: dict[str, Any]) -> Callable[[str, str], str]:
        """A function that completes the inventory's digest of a role's inputs with the values this run gives the
        variables the role reads. They are read from the host's variables (what the inventory, group_vars,
        host_vars, vault and -e give it, without any role's defaults), once for every role of the probe, so the
        probe before a role and the record inside it see the same; and templated, so that a vault value reached
        through `munge_key: "{{ vault_munge_key }}"` counts."""
        names: dict[str, list[str]] = task_vars.get(NAMES) or {}
        host = task_vars.get("hostvars", {}).raw_get(task_vars.get("inventory_hostname"))
        templar = self._templar.copy_with_new_env(available_variables=host)
        key: list[bytes] = []  # read, or made, on first use only

        def complete(role: str, digest: str) -> str:
            given = {name: host[name] for name in names.get(role) or [] if name in host}
            if not given:
                return digest
            values = {}
            for name, value in sorted(given.items()):
                try:
                    values[name] = templar.template(value)
                except AnsibleError as exc:  # a value that cannot be templated (an undefined name) counts as written
                    values[name] = f"untemplated {value!r}: {type(exc).__name__}"
            if not key:
                key.append(values_key(secrets_folder(task_vars)))
            text = json.dumps(values, sort_keys=True, default=str).encode()
            return f"{digest}:{hmac.new(key[0], text, hashlib.sha256).hexdigest()[:24]}"

        return complete
