# Copyright: gpuinfra maintainers
# Apache License 2.0 (see LICENSE)
"""The controller's half of gpuinfra.cluster.receipt: the inputs digests from the inventory and the digests of
the secrets on the controller, handed to the module that reads and writes the receipts on the host."""

from __future__ import annotations

import hashlib
import os
from typing import Any

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase

# gpuinfra writes one variable per role into the inventory: gpuinfra_receipt_<role>, the digest of that role's
# inputs on that host. An inventory without them (a role applied by hand, Molecule) records and skips nothing.
INPUTS_PREFIX = "gpuinfra_receipt_"
# A role's digest that ends in HOST_MARK also covers the host's own variables, whose digest is HOST_INPUTS.
HOST_INPUTS = "gpuinfra_receipts_host"
HOST_MARK = "+host"


def _sha256(path: str) -> str | None:
    try:
        with open(path, "rb") as handle:
            return hashlib.sha256(handle.read()).hexdigest()
    except OSError:
        return None


def secret_digests(paths: list[str]) -> dict[str, str]:
    """Each file's digest, by its absolute path; a folder stands for every file under it."""
    out: dict[str, str] = {}
    for given in paths:
        path = os.path.abspath(os.path.expanduser(given))
        files = [path]
        if os.path.isdir(path):
            files = [os.path.join(top, name) for top, _, names in os.walk(path) for name in names]
        for name in files:
            digest = _sha256(name) if os.path.isfile(name) else None
            if digest is not None:
                out[name] = digest
    return out


def inputs_digest(digest: str, task_vars: dict[str, Any]) -> str:
    """A role's inputs digest on this host: the inventory's, completed with the host's own where it says so."""
    if digest.endswith(HOST_MARK):
        return f"{digest[: -len(HOST_MARK)]}:{task_vars.get(HOST_INPUTS, '')}"
    return str(digest)


class ActionModule(ActionBase):
    _supports_check_mode = True

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        task_vars = task_vars or {}
        result = super().run(tmp, task_vars)
        args = dict(self._task.args)
        state = args.get("state")
        if state == "probe":
            if task_vars.get("gpuinfra_full"):
                return {**result, "changed": False, "fresh": [], "stale": {}}
            args["inputs"] = {
                key[len(INPUTS_PREFIX) :]: inputs_digest(value, task_vars)
                for key, value in task_vars.items()
                if key.startswith(INPUTS_PREFIX) and isinstance(value, str)
            }
            folder = args.pop("secrets_dir", None)
            args["secrets"] = secret_digests([folder]) if folder and os.path.isdir(os.path.expanduser(folder)) else {}
        elif state == "record":
            inputs = task_vars.get(INPUTS_PREFIX + str(args.get("role")))
            if not isinstance(inputs, str):
                return {**result, "changed": False, "skipped": True, "msg": "no inputs digest in this inventory"}
            args["inputs"] = inputs_digest(inputs, task_vars)
            args["secrets"] = secret_digests([str(path) for path in args.get("secrets") or []])
        else:
            raise AnsibleActionFail("state must be record or probe")
        return {**result, **self._execute_module("gpuinfra.cluster.receipt", module_args=args, task_vars=task_vars)}
