#!/usr/bin/python3
"""Write how long a newer kernel has waited on this node, for the node exporter's textfile collector.

gpuinfra keeps kernels out of unattended-upgrades on GPU nodes, and never lets it reboot them: a new kernel is
booted only through `gpuinfra upgrade --kernel`. This says how long one has waited. For each installed kernel
metapackage (linux-image-amd64, linux-image-generic-hwe-24.04: a linux-image-NAME whose name carries no kernel
release), a kernel update is pending while either
- `available`: apt's candidate of the metapackage is not its installed version, so `gpuinfra upgrade --kernel`
  would install it (it checks that every kernel package is at its candidate); or
- `installed`: the metapackage is at its candidate, but the node runs an older kernel of the same flavour than the
  one the metapackage depends on (unattended-upgrades installed it, or an upgrade did not reboot).

Pending since: the time this node first had the update, remembered in a state file until a run finds the node
running its newest kernel, so that neither `apt update` nor a newer kernel that supersedes the waiting one starts
the count again. When a run first sees an update, that time is the earliest of: now; the modification time of each
package list that offers the version (when apt fetched it, or its server's Last-Modified time: the version was
offered to this node then at the latest); for an installed kernel, the time dpkg installed it. So the age is never
overstated: at most it is short by the time the lists went unread.

Everything read from dpkg and apt is data: names and versions reach the file as escaped label values only. The
file is replaced atomically. When dpkg or apt fails, the file says so (gpuinfra_kernel_update_check_success 0) and
keeps the updates the last good run found, which are still waiting as far as anyone knows.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

DPKG_FORMAT = "${Package}\t${Version}\t${db:Status-Abbrev}\t${Depends}\n"
INDEX_FORMAT = "$(DESCRIPTION)\t$(FILENAME)"
# A kernel release names a kernel (6.1.0-41-amd64, 6.12.57+deb12-rt-amd64, 6.8.0-45-generic): it starts with a
# digit. A metapackage's name carries none (amd64, cloud-amd64, generic-hwe-24.04); Ubuntu's unsigned images carry
# one after a word (unsigned-6.8.0-45-generic), and debug symbols are no kernel.
_RELEASE = re.compile(r"[0-9][A-Za-z0-9.+~_-]*")
_PACKAGE = re.compile(r"[a-z0-9][a-z0-9.+-]*")
_VERSION = re.compile(r"[0-9][A-Za-z0-9.+~:-]*")


@dataclass
class Policy:
    """One package of `apt-cache policy`: installed and candidate versions ("" for none), and the package lists
    (apt's descriptions of them) that offer each version."""

    installed: str = ""
    candidate: str = ""
    sources: dict[str, list[str]] = field(default_factory=dict)


@dataclass(frozen=True)
class Package:
    """One linux-image-* package dpkg has installed."""

    version: str
    depends: str


@dataclass(frozen=True)
class Pending:
    """A kernel update waiting on this node, and the earliest time the node is known to have had it."""

    package: str
    version: str
    state: str  # available | installed
    evidence: float


@dataclass(frozen=True)
class Entry:
    """What the state file remembers of a pending update, and the file writes."""

    version: str
    state: str
    since: float


def is_metapackage(name: str) -> bool:
    rest = name.removeprefix("linux-image-")
    return (
        rest != name
        and rest[:1].isalpha()
        and rest[:1].islower()
        and not re.search(r"(^|-)[0-9]+\.[0-9]+\.[0-9]+", rest)
        and not rest.endswith(("-dbg", "-dbgsym"))
    )


def flavour(release: str) -> str:
    """The flavour of a kernel release: its words after the version ones (6.1.0-41-amd64 -> amd64, 6.12.57+deb12-rt-
    amd64 -> rt-amd64, 6.8.0-45-generic -> generic)."""
    words = release.split("-")
    while words and words[0][:1].isdigit():
        words.pop(0)
    return "-".join(words)


def parse_dpkg(text: str) -> dict[str, Package]:
    """`dpkg-query --show` lines in DPKG_FORMAT -> the installed packages (status i, held or not)."""
    found: dict[str, Package] = {}
    for line in text.splitlines():
        parts = line.split("\t")
        if len(parts) != 4:
            continue
        name, version, status, depends = parts
        if len(status) >= 2 and status[1] == "i" and _PACKAGE.fullmatch(name) and _VERSION.fullmatch(version):
            found[name] = Package(version, depends)
    return found


def parse_policy(text: str) -> dict[str, Policy]:
    """`apt-cache policy NAME...` (in the C locale) -> each package's installed and candidate versions, and the
    package lists each version comes from. Lines that read otherwise are skipped."""
    found: dict[str, Policy] = {}
    current: Policy | None = None
    version: str | None = None
    for line in text.splitlines():
        if line and not line[0].isspace() and line.endswith(":"):
            name = line[:-1]
            current = found.setdefault(name, Policy()) if _PACKAGE.fullmatch(name) else None
            version = None
            continue
        if current is None:
            continue
        head = re.fullmatch(r"  (Installed|Candidate): (\S+)", line)
        if head:
            value = "" if head[2] == "(none)" else head[2]
            if head[1] == "Installed":
                current.installed = value
            else:
                current.candidate = value
            continue
        row = re.fullmatch(r" (?:\*\*\*|   ) (\S+) (-?[0-9]+)", line)
        if row:
            version = row[1]
            current.sources.setdefault(version, [])
            continue
        source = re.fullmatch(r" {8}(-?[0-9]+) (\S.*?)\s*", line)
        if source and version is not None:
            current.sources[version].append(source[2])
    return found


def parse_index_targets(text: str) -> dict[str, str]:
    """`apt-get indextargets --format INDEX_FORMAT` -> {description apt-cache policy prints: list file}."""
    found = {}
    for line in text.splitlines():
        description, _, filename = line.rpartition("\t")
        if description and filename.startswith("/"):
            found[description.rstrip()] = filename
    return found


def _depended_release(depends: str) -> str | None:
    """The kernel release a metapackage depends on: `linux-image-6.1.0-41-amd64 (= 6.1.158-1)` -> 6.1.0-41-amd64."""
    for alternatives in depends.split(","):
        for item in alternatives.split("|"):
            name = item.strip().split(" ")[0].split(":")[0]
            release = name.removeprefix("linux-image-")
            if release != name and _RELEASE.fullmatch(release):
                return release
    return None


def find_pending(
    installed: dict[str, Package],
    policy: dict[str, Policy],
    running: str,
    newer: dict[tuple[str, str], bool],
) -> list[tuple[str, str, str, list[str]]]:
    """(metapackage, version, state, sources of that version) for every update pending. `newer[(a, b)]` says whether
    package version a is newer than b (dpkg's order), for the pairs `comparisons` asks about."""
    out = []
    for name in sorted(installed):
        if not is_metapackage(name) or name not in policy:
            continue
        meta = policy[name]
        version = installed[name].version
        if meta.candidate and meta.candidate != version:
            out.append((name, meta.candidate, "available", meta.sources.get(meta.candidate, [])))
            continue
        pair = _boot_pair(name, installed, running)
        if pair is not None and newer.get(pair, False):
            out.append((name, version, "installed", meta.sources.get(version, [])))
    return out


def _boot_pair(name: str, installed: dict[str, Package], running: str) -> tuple[str, str] | None:
    """(version of the kernel the metapackage depends on, version of the running kernel) where both are installed
    packages of one flavour and different kernels; None where they cannot be compared."""
    release = _depended_release(installed[name].depends)
    if release is None or release == running or flavour(release) != flavour(running):
        return None
    target = installed.get(f"linux-image-{release}")
    booted = installed.get(f"linux-image-{running}")
    if target is None or booted is None:
        return None
    return (target.version, booted.version)


def comparisons(installed: dict[str, Package], policy: dict[str, Policy], running: str) -> list[tuple[str, str]]:
    """The version pairs find_pending needs compared."""
    pairs = []
    for name in sorted(installed):
        if is_metapackage(name) and name in policy:
            meta = policy[name]
            if not meta.candidate or meta.candidate == installed[name].version:
                pair = _boot_pair(name, installed, running)
                if pair is not None:
                    pairs.append(pair)
    return pairs


def remember(previous: dict[str, Entry], pending: list[Pending], now: float) -> dict[str, Entry]:
    """The entries to write and keep: each pending update since the earliest of what was remembered for its
    metapackage (a newer kernel superseding a waiting one does not start the count again), its evidence, and now.
    A metapackage with nothing pending is forgotten."""
    out = {}
    for item in pending:
        times = [now, item.evidence]
        if item.package in previous:
            times.append(previous[item.package].since)
        out[item.package] = Entry(item.version, item.state, max(0.0, min(times)))
    return out


def load_state(path: str) -> dict[str, Entry]:
    """The state file's entries; a missing or unreadable file, or an entry that does not read, is none."""
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, ValueError) as exc:
        if not isinstance(exc, FileNotFoundError):
            print(f"state file {path} not read, starting afresh: {exc}", file=sys.stderr)
        return {}
    out = {}
    for name, entry in data.items() if isinstance(data, dict) else []:
        if not isinstance(entry, dict):
            continue
        since, version, state = entry.get("since"), entry.get("version"), entry.get("state")
        if (
            isinstance(since, (int, float))
            and not isinstance(since, bool)
            and math.isfinite(since)
            and isinstance(version, str)
            and _VERSION.fullmatch(version)
            and state in ("available", "installed")
            and _PACKAGE.fullmatch(str(name))
        ):
            out[str(name)] = Entry(version, str(state), float(since))
    return out


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def render(entries: dict[str, Entry], success: bool) -> str:
    out = [
        "# HELP gpuinfra_kernel_update_check_success 1 when dpkg and apt answered, 0 when the check failed.",
        "# TYPE gpuinfra_kernel_update_check_success gauge",
        f"gpuinfra_kernel_update_check_success {int(success)}",
        "# HELP gpuinfra_kernel_update_pending_since_timestamp_seconds Since when (Unix time) a newer kernel has "
        "waited for gpuinfra upgrade --kernel on this node; no series when it runs its newest.",
        "# TYPE gpuinfra_kernel_update_pending_since_timestamp_seconds gauge",
    ]
    out += [
        f'gpuinfra_kernel_update_pending_since_timestamp_seconds{{package="{_label(name)}",'
        f'version="{_label(entry.version)}",state="{_label(entry.state)}"}} {int(entry.since)}'
        for name, entry in sorted(entries.items())
    ]
    return "\n".join(out) + "\n"


def write_atomically(path: str, content: str) -> None:
    folder = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".gpuinfra_kernel_updates.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(content)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def _mtime(path: str) -> float | None:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return None


class Host:
    """The programs this collector asks, in the C locale so that apt answers in the words parse_policy reads."""

    def __init__(self, admindir: str, timeout: float) -> None:
        self.admindir = admindir
        self.timeout = timeout
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("LC_", "LANG"))} | {"LC_ALL": "C"}

    def run(self, argv: list[str], ok: tuple[int, ...] = (0,)) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            argv, capture_output=True, text=True, errors="replace", timeout=self.timeout, env=self.env, check=False
        )
        if done.returncode not in ok:
            raise subprocess.CalledProcessError(done.returncode, argv, done.stdout, done.stderr)
        return done

    def apt(self) -> list[str]:
        return ["-o", f"Dir::State::status={self.admindir}/status"]

    def installed(self) -> dict[str, Package]:
        # 1: no package matches the pattern.
        text = self.run(
            ["dpkg-query", f"--admindir={self.admindir}", "--show", f"--showformat={DPKG_FORMAT}", "linux-image-*"],
            ok=(0, 1),
        ).stdout
        return parse_dpkg(text)

    def policy(self, names: list[str]) -> dict[str, Policy]:
        return parse_policy(self.run(["apt-cache", *self.apt(), "policy", *names]).stdout) if names else {}

    def lists(self) -> dict[str, str]:
        """Where apt keeps each package list; none when apt cannot say (the age then counts from now)."""
        try:
            done = self.run(["apt-get", *self.apt(), "indextargets", f"--format={INDEX_FORMAT}"])
            return parse_index_targets(done.stdout)
        except (OSError, subprocess.SubprocessError) as exc:
            print(f"apt-get indextargets failed, the age counts from now: {exc}", file=sys.stderr)
            return {}

    def newer(self, a: str, b: str) -> bool:
        """Whether version a is newer than b, in dpkg's order."""
        return self.run(["dpkg", "--compare-versions", a, "gt", b], ok=(0, 1)).returncode == 0

    def installed_at(self, package: str) -> float | None:
        """When dpkg unpacked this package: its file list's modification time."""
        return _mtime(os.path.join(self.admindir, "info", f"{package}.list"))


def check(host: Host, running: str, now: float) -> list[Pending]:
    installed = host.installed()
    metas = [name for name in sorted(installed) if is_metapackage(name)]
    policy = host.policy(metas)
    newer = {pair: host.newer(*pair) for pair in comparisons(installed, policy, running)}
    found = find_pending(installed, policy, running, newer)
    lists = host.lists() if found else {}
    pending = []
    for name, version, state, sources in found:
        times = [t for t in (_mtime(lists[s]) for s in sources if s in lists) if t is not None]
        if state == "installed":
            release = _depended_release(installed[name].depends) or ""
            times += [t for t in [host.installed_at(f"linux-image-{release}")] if t is not None]
        pending.append(Pending(name, version, state, min([now, *times])))
    return pending


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--output", required=True, help="the .prom file in the textfile collector's folder")
    parser.add_argument("--state", required=True, help="the file that remembers since when each update waits")
    parser.add_argument("--admindir", default="/var/lib/dpkg", help="dpkg's database")
    parser.add_argument("--running", default=os.uname().release, help="the running kernel's release")
    parser.add_argument("--timeout", type=float, default=120.0)
    args = parser.parse_args(argv)
    previous = load_state(args.state)
    now = time.time()
    try:
        pending = check(Host(args.admindir, args.timeout), args.running, now)
    except (OSError, subprocess.SubprocessError) as exc:
        print(f"kernel update check failed: {exc}", file=sys.stderr)
        write_atomically(args.output, render(previous, success=False))
        return 1
    entries = remember(previous, pending, now)
    state = {name: {"version": e.version, "state": e.state, "since": e.since} for name, e in sorted(entries.items())}
    write_atomically(args.state, json.dumps(state, indent=1) + "\n")
    write_atomically(args.output, render(entries, success=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
