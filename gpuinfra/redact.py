"""Keep secrets out of what a run reports: diffs, failure messages, Ansible's errors and warnings.

The first line of defence is in the roles: tasks that touch a secret carry `no_log: true` (Ansible then replaces
their whole result with a `censored` note, diff included) and `diff: false`. This is the second line, for a task
that lacks them: every text a run reports goes through a `Redactor`, which replaces these with `<redacted>`:

- password hashes in crypt(3) formats (bcrypt `$2b$12$...`, SHA-crypt `$6$...`, yescrypt `$y$...`) and argon2 hashes,
  whatever they belong to;
- the contents of every file in the cluster's secrets folders on the controller (the munge key, the database and
  web passwords, their hashes), line by line.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

REDACTED = "<redacted>"

# Shorter file contents and lines are not taken as secrets: they would redact ordinary words.
MIN_SECRET_LENGTH = 8
# Bounds on what is read from the secrets folders: they hold a few small files.
_MAX_FILES = 256
_MAX_FILE_BYTES = 64 * 1024

_B64 = r"[./A-Za-z0-9]"
_CRYPT_HASH = re.compile(
    rf"\$2[abxy]?\$\d{{2}}\$({_B64}){{22,}}"  # bcrypt: cost, then 22 characters of salt and 31 of hash
    rf"|\$[56]\$(rounds=\d+\$)?{_B64}{{1,16}}\${_B64}{{22,}}"  # SHA-256/512-crypt
    rf"|\$g?y\${_B64}+\${_B64}+\${_B64}{{22,}}"  # yescrypt, gost-yescrypt
    r"|\$argon2(id|i|d)\$(v=\d+\$)?m=\d+,t=\d+,p=\d+\$[A-Za-z0-9+/]+\$[A-Za-z0-9+/]{16,}"
)

# Where gpuinfra keeps a cluster's files on the controller: `<root>/<cluster name>`. The roles generate secrets into
# its `secrets/` subfolder (`default_secrets_dir`) unless gpuinfra_secrets_dir or a `<role>_secrets_dir` moves them;
# redaction reads the whole cluster folder, which also holds the sandbox's SSH key.
DEFAULT_SECRETS_ROOT = "~/.local/share/gpuinfra"


def default_secrets_dir(cluster: str) -> str:
    """The folder every role generates its secrets into by default (`~/` unexpanded): the one spelling that each
    role's `<role>_secrets_dir` default is checked against (tests/unit/test_role_contracts.py)."""
    return f"{DEFAULT_SECRETS_ROOT}/{cluster}/secrets"


class Redactor:
    """Replaces password hashes and known secret values in text with `<redacted>`."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        found = {value for value in secrets if len(value) >= MIN_SECRET_LENGTH}
        # Longest first, so a secret that contains another is replaced whole.
        self._secrets = sorted(found, key=len, reverse=True)

    def __call__(self, text: str) -> str:
        for secret in self._secrets:
            if secret in text:
                text = text.replace(secret, REDACTED)
        return _CRYPT_HASH.sub(REDACTED, text)

    @classmethod
    def from_folders(cls, folders: Iterable[Path]) -> Redactor:
        """A redactor for the contents of every regular file under `folders` (missing folders are skipped)."""
        return cls(value for path in _files(folders) for value in _secret_values(path))


def _files(folders: Iterable[Path]) -> list[Path]:
    out: list[Path] = []
    seen: set[Path] = set()
    for folder in folders:
        if not folder.is_dir():
            continue
        for dirpath, _dirnames, filenames in os.walk(folder):  # symbolic links to folders are not followed
            for name in sorted(filenames):
                path = Path(dirpath) / name
                if path in seen or path.is_symlink() or not path.is_file():
                    continue
                seen.add(path)
                out.append(path)
                if len(out) >= _MAX_FILES:
                    return out
    return out


def _secret_values(path: Path) -> list[str]:
    """A file's whole text and each of its lines: a diff shows a multi-line secret line by line."""
    try:
        with path.open("rb") as source:
            data = source.read(_MAX_FILE_BYTES + 1)
    except OSError:
        return []
    if len(data) > _MAX_FILE_BYTES:
        return []
    text = data.decode("utf-8", errors="replace")
    return [text.strip(), *(line.strip() for line in text.splitlines())]


def secrets_folders(inventory: Mapping[str, Any], extra_vars: Mapping[str, Any] | None = None) -> list[Path]:
    """The controller folders a run's roles keep secrets in, from the inventory's and the run's variables.

    `gpuinfra_secrets_dir` or any `<role>_secrets_dir` set to a plain path (not a template), and always the
    default folder of the cluster, `~/.local/share/gpuinfra/<cluster name>` (the roles' own default).
    """
    all_group = inventory.get("all") if isinstance(inventory.get("all"), Mapping) else None
    variables: dict[str, Any] = {}
    if all_group is not None and isinstance(all_group.get("vars"), Mapping):
        variables.update(all_group["vars"])
    variables.update(extra_vars or {})
    variables = {key: _plain(value) for key, value in variables.items()}
    found: list[Path] = []
    name = variables.get("gpuinfra_cluster_name")
    if isinstance(name, str) and name and "/" not in name and name not in (".", ".."):
        found.append(Path(DEFAULT_SECRETS_ROOT, name).expanduser())
    for key, value in variables.items():
        if key.endswith("secrets_dir") and isinstance(value, str) and value.strip() and "{" not in value:
            found.append(Path(value.strip()).expanduser())
    return list(dict.fromkeys(path for path in found if path.is_absolute()))


def _plain(value: Any) -> Any:
    """A string the inventory marks unsafe (`{"__ansible_unsafe": "..."}`, the JSON form of `!unsafe`) as itself."""
    if isinstance(value, Mapping) and list(value) == ["__ansible_unsafe"]:
        return value["__ansible_unsafe"]
    return value
