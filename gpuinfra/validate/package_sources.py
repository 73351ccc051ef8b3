"""Package source rules: a source is signed and fetched over TLS unless the file says `insecure: true` on it, and
the active checks' tools come from a source that carries them.

A mirror needs its signing key and that key's fingerprint, so a key swapped on the way is refused; an http://
mirror or one without a key is allowed only with `insecure: true`, written on that source. NVIDIA's repository is
https with a key the roles pin by fingerprint; the distribution's archive is signed by the OS; a local folder of
packages comes from the controller over the authenticated SSH connection.
"""

from __future__ import annotations

from ..model import Cluster
from ..model.driver import DistributionSource, MirrorSource, NvidiaRepoSource
from ..model.policy import CHECK_TOOLS
from .diagnostics import Diagnostics
from .source import Loc


def _sources(model: Cluster) -> list[tuple[Loc, object]]:
    out: list[tuple[Loc, object]] = []
    if model.driver is not None:
        out.append((("driver", "source"), model.driver.source))
    out.append((("container_toolkit", "source"), model.container_toolkit.source))
    out.append((("monitoring", "dcgm_exporter", "package_source"), model.monitoring.dcgm_exporter.package_source))
    tools = model.health.admission.tools
    if tools.source is not None:
        out.append((("health", "admission", "tools", "source"), tools.source))
    return out


def _check_tools(model: Cluster, report: Diagnostics) -> None:
    """Installed tools need a source that has them and packages that carry them. Emulated GPUs answer with
    stand-ins (the sandbox), so a cluster of those alone installs nothing."""
    admission, loc = model.health.admission, ("health", "admission", "tools")
    tools = admission.tools
    real = any(g.gpu is not None and not g.gpu.emulated for g in model.node_groups.values())
    if not (tools.install and admission.checks and real):
        return
    driver_source = model.driver.source if model.driver is not None else None
    source = tools.source or driver_source
    if source is None or isinstance(source, DistributionSource):
        report.error(
            loc,
            "the checks' tools are packages no distribution carries (DCGM comes from NVIDIA's CUDA repository): "
            "give their `source` (a mirror or a local folder), or set `install: false` with the tools on the nodes",
        )
    elif isinstance(source, NvidiaRepoSource) and not isinstance(driver_source, NvidiaRepoSource):
        report.error(
            (*loc, "source"),
            "the nvidia source is the CUDA repository the driver's nvidia source adds, and the driver has another: "
            "give a mirror or a local folder",
        )
    built = [check for check in admission.checks if check != "dcgm_diag"]
    if built and not tools.packages:
        names = ", ".join(f"{check} ({CHECK_TOOLS[check]})" for check in built)
        report.error(
            (*loc, "packages"),
            f"{names}: NVIDIA ships no package of nccl-tests or nvbandwidth; name the site's packages, built from "
            "their sources against the nodes' CUDA (with DCGM's, when dcgm_diag is named), or set `install: false` "
            "with the tools on the nodes",
        )


def check(model: Cluster, report: Diagnostics) -> None:
    _check_tools(model, report)
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
