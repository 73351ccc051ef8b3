"""Package source rules: a source is signed and fetched over TLS unless the file says `insecure: true` on it.

A mirror needs its signing key and that key's fingerprint, so a key swapped on the way is refused; an http://
mirror or one without a key is allowed only with `insecure: true`, written on that source. NVIDIA's repository is
https with a key the roles pin by fingerprint; the distribution's archive is signed by the OS; a local folder of
packages comes from the controller over the authenticated SSH connection.
"""

from __future__ import annotations

from ..model import Cluster
from ..model.driver import MirrorSource
from .diagnostics import Diagnostics
from .source import Loc


def _sources(model: Cluster) -> list[tuple[Loc, object]]:
    out: list[tuple[Loc, object]] = []
    if model.driver is not None:
        out.append((("driver", "source"), model.driver.source))
    out.append((("container_toolkit", "source"), model.container_toolkit.source))
    out.append((("monitoring", "dcgm_exporter", "package_source"), model.monitoring.dcgm_exporter.package_source))
    return out


def check(model: Cluster, report: Diagnostics) -> None:
    for loc, source in _sources(model):
        if not isinstance(source, MirrorSource):
            continue
        if source.fingerprint and not source.keyring:
            report.error((*loc, "fingerprint"), "names the fingerprint of no key: add the mirror's `keyring`")
        if source.keyring and not source.fingerprint:
            report.error(
                (*loc, "keyring"),
                "pin the key by its `fingerprint` (40 hex digits, `gpg --show-keys --with-colons FILE`, fpr line)",
            )
        if source.insecure:
            continue
        if source.url.startswith("http://"):
            report.error(
                (*loc, "url"),
                "http:// fetches packages without TLS: use https://, or write `insecure: true` on this source",
            )
        if not source.keyring:
            report.error(
                loc,
                "a mirror needs its signing key: set `keyring` and `fingerprint`, or write `insecure: true` on "
                "this source to install unsigned packages",
            )
