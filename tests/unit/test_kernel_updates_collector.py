"""The kernel_updates role's collector (roles/kernel_updates/files/gpuinfra_kernel_updates.py): which kernel updates
wait on a node, since when, and the file the node exporter serves.

The recorded answers under data/kernel_updates/ are what Debian 12's dpkg-query 1.21 and apt-cache 2.6 printed, in
the C locale, for the dpkg databases beside them (status-held-back: bookworm's 6.1.176-1 kernel installed while
bookworm-security offers 6.1.192-3; status-not-booted: 6.1.192-3 installed and held, 6.1.176-1 still running), read
against bookworm's and bookworm-security's package lists; the database's path is written as a node's
(/var/lib/dpkg/status). The tests marked `tools` run the real dpkg-query, apt-cache, apt-get and dpkg against such
databases and this machine's own package lists, and promtool on the output.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import time
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
ROLE = ROOT / "roles" / "kernel_updates"
DATA = Path(__file__).parent / "data" / "kernel_updates"
PROMTOOL = shutil.which("promtool")
SECURITY = "http://deb.debian.org/debian-security bookworm-security/main amd64 Packages"
MAIN = "http://deb.debian.org/debian bookworm/main amd64 Packages"


@cache
def collector() -> ModuleType:
    path = ROLE / "files" / "gpuinfra_kernel_updates.py"
    spec = importlib.util.spec_from_file_location("gpuinfra_kernel_updates", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def recorded(name: str) -> str:
    return (DATA / name).read_text()


# --- reading dpkg and apt ---------------------------------------------------------------------------------------------


def test_policy_reads_installed_candidate_and_where_each_version_comes_from() -> None:
    policy = collector().parse_policy(recorded("policy-held-back.txt"))
    assert set(policy) == {"linux-image-amd64", "linux-image-rt-amd64"}
    meta = policy["linux-image-amd64"]
    assert (meta.installed, meta.candidate) == ("6.1.176-1", "6.1.192-3")
    # The dpkg database is no package list: it is kept, and never matches one.
    assert meta.sources == {"6.1.192-3": [SECURITY], "6.1.176-1": [MAIN, "/var/lib/dpkg/status"]}
    assert policy["linux-image-rt-amd64"].installed == ""  # "(none)": only its configuration files are left


def test_policy_of_an_installed_candidate() -> None:
    meta = collector().parse_policy(recorded("policy-not-booted.txt"))["linux-image-amd64"]
    assert meta.installed == meta.candidate == "6.1.192-3"
    assert meta.sources["6.1.192-3"] == [SECURITY, "/var/lib/dpkg/status"]


def test_policy_skips_what_it_cannot_read() -> None:
    text = (
        "linux-image-amd64:\n  Installiert: 1\n  Candidate: 6.1.192-3\n garbage\n"
        "Bad Name!:\n  Installed: 9\n  Candidate: 9\n"
        "linux-image-cloud-amd64:\n  Installed: (none)\n  Candidate: (none)\n  Version table:\n"
    )
    policy = collector().parse_policy(text)
    assert set(policy) == {"linux-image-amd64", "linux-image-cloud-amd64"}
    assert (policy["linux-image-amd64"].installed, policy["linux-image-amd64"].candidate) == ("", "6.1.192-3")
    assert policy["linux-image-cloud-amd64"].candidate == ""


def test_dpkg_lists_installed_packages_held_or_not() -> None:
    held_back = collector().parse_dpkg(recorded("dpkg-held-back.txt"))
    # "un" (only known by name) and "rc" (configuration files left) are not installed.
    assert sorted(held_back) == ["linux-image-6.1.0-50-amd64", "linux-image-amd64"]
    assert held_back["linux-image-amd64"].depends == "linux-image-6.1.0-50-amd64 (= 6.1.176-1)"
    not_booted = collector().parse_dpkg(recorded("dpkg-not-booted.txt"))
    assert not_booted["linux-image-amd64"].version == "6.1.192-3"  # "hi": held, and installed


def test_index_targets_name_each_list_file() -> None:
    lists = collector().parse_index_targets(recorded("indextargets.txt"))
    assert lists[SECURITY] == (
        "/var/lib/apt/lists/deb.debian.org_debian-security_dists_bookworm-security_main_binary-amd64_Packages.lz4"
    )
    assert len(lists) == 3


@pytest.mark.parametrize(
    ("name", "meta"),
    [
        ("linux-image-amd64", True),
        ("linux-image-cloud-amd64", True),
        ("linux-image-rt-amd64", True),
        ("linux-image-generic-hwe-24.04", True),
        ("linux-image-6.1.0-41-amd64", False),
        ("linux-image-6.12.57+deb12-rt-amd64", False),
        ("linux-image-unsigned-6.8.0-45-generic", False),
        ("linux-image-amd64-dbg", False),
        ("linux-headers-amd64", False),
    ],
)
def test_kernel_metapackages_carry_no_release(name: str, meta: bool) -> None:
    assert collector().is_metapackage(name) is meta


def test_flavour_of_a_release() -> None:
    flavour = collector().flavour
    assert flavour("6.1.0-41-amd64") == "amd64"
    assert flavour("6.12.57+deb12-rt-amd64") == "rt-amd64"
    assert flavour("6.8.0-45-generic") == "generic"


# --- what is pending ------------------------------------------------------------------------------------------------


def _pending(case: str, running: str, newer: bool = True) -> list[tuple[str, str, str, list[str]]]:
    module = collector()
    installed = module.parse_dpkg(recorded(f"dpkg-{case}.txt"))
    # The rt kernel of the last point release, installed beside them (its metapackage removed).
    installed["linux-image-6.1.0-50-rt-amd64"] = module.Package("6.1.176-1", "kmod")
    policy = module.parse_policy(recorded(f"policy-{case}.txt"))
    pairs = module.comparisons(installed, policy, running)
    result: list[tuple[str, str, str, list[str]]] = module.find_pending(
        installed, policy, running, dict.fromkeys(pairs, newer)
    )
    return result


def test_a_held_back_kernel_is_pending_whatever_runs() -> None:
    for running in ("6.1.0-50-amd64", "6.18.44-fc-v1272"):
        assert _pending("held-back", running) == [("linux-image-amd64", "6.1.192-3", "available", [SECURITY])]


def test_an_installed_kernel_not_booted_is_pending() -> None:
    assert _pending("not-booted", "6.1.0-50-amd64") == [
        ("linux-image-amd64", "6.1.192-3", "installed", [SECURITY, "/var/lib/dpkg/status"])
    ]


def test_nothing_is_pending_once_the_node_runs_its_newest_kernel() -> None:
    assert _pending("not-booted", "6.1.0-57-amd64") == []


@pytest.mark.parametrize(
    ("running", "newer"),
    [
        ("6.1.0-50-amd64", False),  # dpkg orders the running kernel after the metapackage's: a newer one runs
        ("6.1.0-50-rt-amd64", True),  # an older kernel of another flavour runs: not this metapackage's kernel
        ("6.18.44-fc-v1272", True),  # no package of the running kernel (a container's host): cannot compare
    ],
)
def test_an_installed_kernel_is_not_pending_when_it_cannot_be_newer(running: str, newer: bool) -> None:
    assert _pending("not-booted", running, newer) == []


# --- since when -----------------------------------------------------------------------------------------------------


def _pending_item(version: str, evidence: float, state: str = "available") -> Any:
    return collector().Pending("linux-image-amd64", version, state, evidence)


def test_the_wait_starts_at_the_earliest_evidence_and_survives_a_newer_kernel() -> None:
    module = collector()
    now = 1_800_000_000.0
    first = module.remember({}, [_pending_item("6.1.192-3", now - 3600)], now)
    assert first["linux-image-amd64"].since == now - 3600  # the list that offers it was fetched an hour ago
    # A day later, a newer kernel supersedes it, and its list is newer: the node has waited since the first.
    later = module.remember(first, [_pending_item("6.1.200-1", now + 86000)], now + 86400)
    assert later["linux-image-amd64"] == module.Entry("6.1.200-1", "available", now - 3600)
    # Installed by unattended-upgrades, not booted: still the same wait.
    installed = module.remember(later, [_pending_item("6.1.200-1", now + 86000, "installed")], now + 90000)
    assert installed["linux-image-amd64"].since == now - 3600
    # Booted: forgotten, so the next kernel starts a wait of its own.
    assert module.remember(installed, [], now + 100000) == {}


def test_the_wait_never_starts_in_the_future() -> None:
    module = collector()
    now = 1_800_000_000.0
    assert module.remember({}, [_pending_item("6.1.192-3", now + 500)], now)["linux-image-amd64"].since == now


@pytest.mark.parametrize(
    "text",
    [
        "not json",
        "[1, 2]",
        '{"linux-image-amd64": {"version": "6.1.192-3", "state": "available", "since": "yesterday"}}',
        '{"linux-image-amd64": {"version": "6.1.192-3\\"} 1\\nevil", "state": "available", "since": 1}}',
        '{"Bad Name": {"version": "6.1.192-3", "state": "available", "since": 1}}',
        '{"linux-image-amd64": {"version": "6.1.192-3", "state": "available", "since": NaN}}',
    ],
)
def test_a_state_file_that_does_not_read_is_no_memory(text: str, tmp_path: Path) -> None:
    (tmp_path / "pending.json").write_text(text)
    assert collector().load_state(str(tmp_path / "pending.json")) == {}


# --- the file the node exporter serves ------------------------------------------------------------------------------


def test_render_writes_since_when_per_metapackage() -> None:
    module = collector()
    text = module.render({"linux-image-amd64": module.Entry("6.1.192-3", "available", 1796557284.7)}, True)
    lines = text.splitlines()
    assert "gpuinfra_kernel_update_check_success 1" in lines
    assert (
        'gpuinfra_kernel_update_pending_since_timestamp_seconds{package="linux-image-amd64",version="6.1.192-3",'
        'state="available"} 1796557284'
    ) in lines
    assert "gpuinfra_kernel_update_pending_since_timestamp_seconds{" not in module.render({}, True)


@pytest.mark.tools
@pytest.mark.skipif(PROMTOOL is None, reason="promtool is missing (Debian package prometheus)")
@pytest.mark.parametrize("case", ["pending", "none", "failed"])
def test_output_passes_promtool(case: str) -> None:
    module = collector()
    entries = {"linux-image-amd64": module.Entry("6.1.192-3", "installed", 1.0)} if case != "none" else {}
    text = module.render(entries, case != "failed")
    checked = subprocess.run([str(PROMTOOL), "check", "metrics"], input=text, capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr


@pytest.mark.tools
@pytest.mark.skipif(PROMTOOL is None, reason="promtool is missing (Debian package prometheus)")
def test_labels_read_back_as_written(tmp_path: Path) -> None:
    """Whatever reaches a label is escaped: Prometheus's own parser reads back exactly what was written."""
    hostile = 'x"} 1\nevil{a="\\'
    module = collector()
    text = module.render({hostile: module.Entry(hostile, hostile, 7.0)}, True)
    stamped = [line if line.startswith("#") else f"{line} 1700000000" for line in text.splitlines()]
    (tmp_path / "in.om").write_text("\n".join([*stamped, "# EOF"]) + "\n")
    made = subprocess.run(
        [str(PROMTOOL), "tsdb", "create-blocks-from", "openmetrics", "in.om", "db"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert made.returncode == 0, made.stdout + made.stderr
    (tmp_path / "db" / "wal").mkdir()
    dumped = subprocess.run(
        [str(PROMTOOL), "tsdb", "dump", "--match", "gpuinfra_kernel_update_pending_since_timestamp_seconds", "db"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert dumped.returncode == 0, dumped.stderr
    [line] = dumped.stdout.splitlines()
    labels = {m[1]: json.loads(m[2]) for m in re.finditer(r'(\w+)=("(?:[^"\\]|\\.)*")', line)}
    assert labels == {
        "__name__": "gpuinfra_kernel_update_pending_since_timestamp_seconds",
        "package": hostile,
        "version": hostile,
        "state": hostile,
    }


# --- the whole collector against the real dpkg and apt --------------------------------------------------------------


def _apt(*argv: str) -> str:
    env = {**os.environ, "LC_ALL": "C"}
    return subprocess.run(["apt-cache", *argv], capture_output=True, text=True, env=env, check=True).stdout


@cache
def _candidate() -> tuple[str, str]:
    """bookworm's linux-image-amd64 as this machine's package lists offer it: (version, the kernel it depends on)."""
    policy = collector().parse_policy(_apt("policy", "linux-image-amd64")).get("linux-image-amd64")
    if policy is None or not policy.candidate.startswith("6.1."):
        pytest.skip("this machine's package lists offer no Debian 12 linux-image-amd64")
    shown = _apt("show", f"linux-image-amd64={policy.candidate}")
    release = re.search(r"^Depends: linux-image-(\S+) ", shown, re.M)
    assert release, shown
    return policy.candidate, release[1]


def _database(tmp_path: Path, status: str) -> Path:
    admindir = tmp_path / "dpkg"
    (admindir / "info").mkdir(parents=True)
    (admindir / "updates").mkdir()
    (admindir / "status").write_text(status)
    return admindir


def _package(name: str, version: str, depends: str = "kmod", status: str = "install ok installed") -> str:
    return (
        f"Package: {name}\nStatus: {status}\nPriority: optional\nSection: kernel\nInstalled-Size: 13\n"
        f"Maintainer: Debian Kernel Team <debian-kernel@lists.debian.org>\nArchitecture: amd64\n"
        f"Version: {version}\nDepends: {depends}\nDescription: Linux\n\n"
    )


def _collect(tmp_path: Path, admindir: Path, running: str) -> tuple[int, str, dict[str, Any]]:
    out, state = tmp_path / "gpuinfra_kernel_updates.prom", tmp_path / "pending.json"
    code = collector().main(
        ["--output", str(out), "--state", str(state), "--admindir", str(admindir), "--running", running]
    )
    assert oct(out.stat().st_mode & 0o777) == "0o644"
    return code, out.read_text(), json.loads(state.read_text()) if state.exists() else {}


@pytest.mark.tools
def test_a_held_back_kernel_waits_since_its_list_was_fetched(tmp_path: Path) -> None:
    candidate, _ = _candidate()
    before = time.time()
    code, text, state = _collect(tmp_path, _database(tmp_path, recorded("status-held-back")), "6.1.0-50-amd64")
    assert code == 0
    assert "gpuinfra_kernel_update_check_success 1" in text
    since = state["linux-image-amd64"]["since"]
    assert state["linux-image-amd64"]["version"] == candidate and state["linux-image-amd64"]["state"] == "available"
    # Since the time apt wrote one of the lists that offer it: never later than now.
    lists = {p.stat().st_mtime for p in Path("/var/lib/apt/lists").glob("*Packages*")}
    assert since in lists and since <= before
    assert (
        f'gpuinfra_kernel_update_pending_since_timestamp_seconds{{package="linux-image-amd64",version="{candidate}",'
        f'state="available"}} {int(since)}'
    ) in text.splitlines()
    # The next run remembers the wait, however recently apt fetched the lists since.
    remembered = {"linux-image-amd64": {**state["linux-image-amd64"], "since": 5}}
    (tmp_path / "pending.json").write_text(json.dumps(remembered))
    _, text, state = _collect(tmp_path, tmp_path / "dpkg", "6.1.0-50-amd64")
    assert state["linux-image-amd64"]["since"] == 5 and text.splitlines()[-1].endswith("} 5")


@pytest.mark.tools
def test_an_installed_kernel_waits_until_the_node_boots_it(tmp_path: Path) -> None:
    candidate, release = _candidate()
    status = (
        _package("linux-image-6.1.0-10-amd64", "6.1.38-1")
        + _package(f"linux-image-{release}", candidate)
        + _package("linux-image-amd64", candidate, f"linux-image-{release} (= {candidate})", "hold ok installed")
    )
    admindir = _database(tmp_path, status)
    installed_at = time.time() - 86400 * 20
    (admindir / "info" / f"linux-image-{release}.list").touch()
    os.utime(admindir / "info" / f"linux-image-{release}.list", (installed_at, installed_at))
    code, text, state = _collect(tmp_path, admindir, "6.1.0-10-amd64")
    assert code == 0
    # dpkg installed it 20 days ago, earlier than apt last fetched its list.
    assert state == {"linux-image-amd64": {"version": candidate, "state": "installed", "since": installed_at}}
    # The node boots it: nothing waits, and the memory is gone.
    code, text, state = _collect(tmp_path, admindir, release)
    assert (code, state) == (0, {})
    assert "gpuinfra_kernel_update_pending_since_timestamp_seconds{" not in text


@pytest.mark.tools
def test_an_older_kernel_than_the_running_one_is_not_pending(tmp_path: Path) -> None:
    candidate, release = _candidate()
    status = (
        _package("linux-image-6.1.0-999-amd64", "6.1.999-1")
        + _package(f"linux-image-{release}", candidate)
        + _package("linux-image-amd64", candidate, f"linux-image-{release} (= {candidate})")
    )
    # dpkg itself orders the versions: 6.1.999-1 runs, newer than the metapackage's kernel.
    assert _collect(tmp_path, _database(tmp_path, status), "6.1.0-999-amd64")[2] == {}


@pytest.mark.tools
def test_a_failing_check_says_so_and_keeps_what_waits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "pending.json").write_text(
        json.dumps({"linux-image-amd64": {"version": "6.1.192-3", "state": "available", "since": 1700000000}})
    )
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # no dpkg-query
    out = tmp_path / "gpuinfra_kernel_updates.prom"
    assert collector().main(["--output", str(out), "--state", str(tmp_path / "pending.json")]) == 1
    lines = out.read_text().splitlines()
    assert "gpuinfra_kernel_update_check_success 0" in lines
    assert lines[-1].endswith('version="6.1.192-3",state="available"} 1700000000')


# --- the role: the units that run it, and where it writes -----------------------------------------------------------


def _role_vars() -> dict[str, Any]:
    from ruamel.yaml import YAML

    yaml = YAML(typ="safe")
    return {
        **yaml.load((ROLE / "defaults" / "main.yml").read_text()),
        **yaml.load((ROLE / "vars" / "main.yml").read_text()),
    }


def test_the_timer_runs_the_installed_collector_into_the_textfile_folder(collections: Path, tmp_path: Path) -> None:
    from test_monitoring_security import SYSTEMD_ANALYZE, systemd_words
    from test_monitoring_security import render as render_template

    folder = "/srv/text files %h"  # a folder that systemd would split or expand, unquoted
    variables = {**_role_vars(), "kernel_updates_textfile_dir": folder}
    service, timer, hostile = render_template(
        collections,
        [
            ("kernel_updates/templates/gpuinfra-kernel-updates.service.j2", variables),
            ("kernel_updates/templates/gpuinfra-kernel-updates.timer.j2", variables),
            (
                "kernel_updates/templates/gpuinfra-kernel-updates.timer.j2",
                {**variables, "kernel_updates_report_interval": "1h\nOnCalendar=minutely"},
            ),
        ],
    )
    [start] = [line[len("ExecStart=") :] for line in service["text"].splitlines() if line.startswith("ExecStart=")]
    assert systemd_words(start) == [
        "/usr/local/sbin/gpuinfra-kernel-updates",
        "--output",
        f"{folder}/gpuinfra_kernel_updates.prom",
        "--state",
        "/var/lib/gpuinfra-kernel-updates/pending.json",
    ]
    assert "OnUnitActiveSec=1h" in timer["text"].splitlines()
    assert "cannot be one word" in hostile.get("error", ""), hostile
    # What the unit runs is what the role installs, where it installs it.
    tasks = (ROLE / "tasks" / "setup-Debian.yml").read_text()
    assert "src: gpuinfra_kernel_updates.py" in tasks and 'dest: "{{ __kernel_updates_collector }}"' in tasks
    assert (ROLE / "files" / "gpuinfra_kernel_updates.py").stat().st_mode & 0o111
    if SYSTEMD_ANALYZE:
        for name, out in (("gpuinfra-kernel-updates.service", service), ("gpuinfra-kernel-updates.timer", timer)):
            (tmp_path / name).write_text(out["text"])
        checked = subprocess.run(
            [SYSTEMD_ANALYZE, "verify", str(tmp_path / "gpuinfra-kernel-updates.timer")],
            capture_output=True,
            text=True,
            check=False,
        )
        assert "quoting" not in checked.stderr and "Invalid" not in checked.stderr, checked.stderr


def test_the_collector_writes_where_the_node_exporter_reads_and_the_alert_looks() -> None:
    from ruamel.yaml import YAML

    node_exporter = YAML(typ="safe").load((ROOT / "roles" / "node_exporter" / "defaults" / "main.yml").read_text())
    default = _role_vars()["kernel_updates_textfile_dir"]
    folder = node_exporter["node_exporter_textfile_dir"]
    assert default == "{{ node_exporter_textfile_dir | default('" + folder + "') }}"
    rules = (ROOT / "roles" / "prometheus" / "templates" / "gpuinfra.rules.yml.j2").read_text()
    pattern = re.search(r'file=~"([^"]*gpuinfra_kernel_updates[^"]*)"', rules)
    assert pattern and re.fullmatch(pattern[1], f"/var/lib/x/{_role_vars()['__kernel_updates_textfile']}")
