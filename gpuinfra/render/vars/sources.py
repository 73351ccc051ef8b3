"""A package source of the cluster file as a role's settings: `<prefix>_type`, `_url`, `_keyring`, `_fingerprint`,
`_insecure` and `_path`, each empty where the source's type has none."""

from __future__ import annotations

from typing import Any

from ...model.driver import LocalSource, MirrorSource, PackageSource


def source_vars(prefix: str, source: PackageSource) -> dict[str, Any]:
    mirror = source if isinstance(source, MirrorSource) else None
    return {
        f"{prefix}_type": source.type,
        f"{prefix}_url": mirror.url if mirror else "",
        f"{prefix}_keyring": (mirror.keyring or "") if mirror else "",
        f"{prefix}_fingerprint": (mirror.fingerprint or "") if mirror else "",
        f"{prefix}_insecure": mirror.insecure if mirror else False,
        f"{prefix}_path": source.path if isinstance(source, LocalSource) else "",
    }
