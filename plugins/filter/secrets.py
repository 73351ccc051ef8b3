# Copyright: gpuinfra maintainers
# Apache License 2.0 (see LICENSE)
"""`bcrypt_hash`: a basic-auth password's bcrypt hash, made on the controller.

The hash is made where the password is kept, never on a managed host: a host chosen to run a one-off step would
get the password in plain text and choose the hash every exporter then accepts.
"""

from __future__ import annotations

from typing import Any

from ansible.errors import AnsibleFilterError

try:
    import bcrypt
except ImportError as exc:  # the gpuinfra package depends on it; a bare ansible-core may lack it
    BCRYPT_IMPORT_ERROR: ImportError | None = exc
else:
    BCRYPT_IMPORT_ERROR = None

COST = 10


def bcrypt_hash(password: str, kept: str = "") -> str:
    """`kept` when it is a bcrypt hash of `password` (so a kept password changes nothing), else a new hash of cost
    10. Surrounding whitespace of both is ignored, as the secrets files end with a newline."""
    if BCRYPT_IMPORT_ERROR is not None:
        raise AnsibleFilterError(
            f"bcrypt_hash needs the bcrypt Python package on the controller (a dependency of gpuinfra): "
            f"{BCRYPT_IMPORT_ERROR}"
        )
    secret, old = str(password).strip().encode(), str(kept or "").strip()
    if not secret:
        raise AnsibleFilterError("bcrypt_hash: the password is empty")
    try:
        if old and bcrypt.checkpw(secret, old.encode()):
            return old
    except ValueError:  # not a bcrypt hash: make one
        pass
    return str(bcrypt.hashpw(secret, bcrypt.gensalt(COST)).decode())


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"bcrypt_hash": bcrypt_hash}
