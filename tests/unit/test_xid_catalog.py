"""NVIDIA's XID catalog as gpuinfra acts on it (plugins/module_utils/xid_catalog.py): the classes, the site's
overrides, the repetition rule of the verdict, and the one table that the model, the render, the host code and
docs/health.md all read."""

from __future__ import annotations

import json
import re
import typing
from pathlib import Path
from typing import Any

import pytest
from smi_data import H100, report, verdicts, xid_log

from gpuinfra import catalog
from gpuinfra.model.policy import XidClass
from gpuinfra.render.plan import render
from gpuinfra.render.vars import health
from gpuinfra.validate.load import load_cluster

ROOT = Path(__file__).resolve().parents[2]

# The XIDs the project's fixtures and docs name, as the catalog classes them.
EXPECTED = {
    "application": [13, 31, 32, 68, 69, 94],
    "ignore": [43, 45, 63, 92, 121],
    "reset": [48, 61, 62, 64, 74, 95, 109, 119, 120, 140, 143, *range(144, 151)],
    "reboot": [79],
    "hardware": [54, 142],
    "node": [78, 200],  # 200: not in the catalog
}


@pytest.mark.parametrize(("kind", "xids"), EXPECTED.items())
def test_the_xids_the_project_names_have_the_catalogs_class(kind: str, xids: list[int]) -> None:
    assert {xid: catalog.xid_class(xid) for xid in xids} == dict.fromkeys(xids, kind)


def test_each_class_follows_nvidias_immediate_action_or_says_why_not() -> None:
    buckets = {"RESTART_APP", "IGNORE", "UPDATE_SWFW", "RESET_GPU", "RESTART_BM", "RESTART_VM", "CONTACT_SUPPORT",
               "CHECK_MECHANICALS"}  # fmt: skip
    for entry in catalog.xid_entries():
        if entry.note:
            continue
        assert entry.bucket in buckets, entry
        expected = {"RESTART_APP": "application", "IGNORE": "ignore", "UPDATE_SWFW": "node", "RESET_GPU": "reset",
                    "RESTART_BM": "reboot", "RESTART_VM": "reboot"}.get(entry.bucket, "hardware")  # fmt: skip
        assert entry.xid_class == expected, entry
    noted = {e.xid for e in catalog.xid_entries() if e.note}
    assert noted == {45, 48, 61, 74, 154, *range(144, 151)}
    assert all(re.fullmatch(r"[A-Z0-9_]+", e.mnemonic) for e in catalog.xid_entries())


def test_the_source_and_version_are_recorded() -> None:
    assert catalog.XID_SOURCE == "https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html"
    assert "R610" in catalog.XID_VERSION and re.search(r"\d{4}-\d{2}-\d{2}", catalog.XID_VERSION)


@pytest.mark.parametrize(
    ("message", "kind"),
    [
        ("GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)", "reboot"),
        ("GPU recovery action changed from 0x0 (None) to 0x2 (OS Reboot)", "reboot"),
        ("GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)", "reset"),
        ("GPU recovery action changed from 0x0 (None) to 0x1 (PF FLR)", "reset"),
        ("GPU recovery action changed from 0x1 (GPU Reset Required) to 0x0 (None)", "ignore"),
        ("GPU recovery action changed from 0x0 (None) to 0x3 (Drain P2P)", "node"),
        ("something else", "node"),
    ],
)
def test_xid_154_follows_the_action_its_message_names(message: str, kind: str) -> None:
    assert catalog.xid_class(154, message) == kind


def test_the_sites_override_wins_over_the_catalog() -> None:
    assert catalog.xid_class(13, overrides={13: "node"}) == "node"
    assert catalog.xid_class(79, overrides={13: "node"}) == "reboot"


def test_the_models_classes_are_the_catalogs() -> None:
    assert typing.get_args(XidClass) == catalog.XID_CLASSES


def _expand(text: str) -> set[int]:
    text = re.sub(r"\([A-Z0-9_]+\)", "", text)
    out: set[int] = set()
    for start, end in re.findall(r"(\d+)(?:-(\d+))?", text):
        out.update(range(int(start), int(end or start) + 1))
    return out


def test_the_docs_table_is_the_catalog() -> None:
    """docs/health.md's XID policy table lists exactly the catalog's XIDs per class (154 is in its notes)."""
    page = (ROOT / "docs" / "health.md").read_text()
    documented = {
        kind: _expand(xids)
        for kind, xids in re.findall(r"^\| `(\w+)` \| [^|]+ \| ([^|]+) \|$", page, re.M)
        if kind in catalog.XID_CLASSES
    }
    actual: dict[str, set[int]] = {kind: set() for kind in catalog.XID_CLASSES}
    for entry in catalog.xid_entries():
        if entry.xid != 154:
            actual[entry.xid_class].add(entry.xid)
    assert documented == actual
    assert catalog.XID_SOURCE in page and "R610" in page


# --- the verdict: classes, reports, and the repetition rule -------------------------------------------------------


def _events(*lines: str) -> list[Any]:
    events: list[Any] = xid_log.parse_xid_log("\n".join(f"NVRM: Xid (PCI:0000:{line}" for line in lines))
    return events


def test_an_application_xid_leaves_the_node_healthy_and_is_reported() -> None:
    events = _events("2a:00): 13, pid=30877, name=train.py, Graphics Exception")
    result = verdicts.assess(report(H100), verdicts.Policy(), events)
    assert (result["healthy"], result["problems"]) == (True, [])
    assert result["xid_reports"] == [
        {"xid": 13, "class": "application", "gpu": 1, "pci": "0000:2a:00", "gpu_instance": None, "pid": 30877,
         "process": "train.py", "job": "", "user": "", "message": "pid=30877, name=train.py, Graphics Exception"}
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ("ba:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
         "GPU 6 (00000000:BA:00.0): XID 79 (reboot) in the kernel log since boot (1 time): GPU has fallen off the "
         "bus."),
        ("ba:00): 54, pid='<unknown>', name=<unknown>, power brake",
         "GPU 6 (00000000:BA:00.0): XID 54 (hardware fault: repair or replace the GPU) in the kernel log since boot "
         "(1 time): power brake"),
        ("ba:00): 119, pid=1712, name=nvidia-smi, Timeout",
         "GPU 6 (00000000:BA:00.0): XID 119 (reset the GPU) in the kernel log since boot (1 time): Timeout"),
        ("ba:00): 200, pid=1, name=a, new",
         "GPU 6 (00000000:BA:00.0): XID 200 in the kernel log since boot (1 time): new"),
    ],
)  # fmt: skip
def test_draining_xids_name_what_the_gpu_needs(line: str, problem: str) -> None:
    result = verdicts.assess(report(H100), verdicts.Policy(), _events(line))
    assert (result["healthy"], result["problems"], result["xid_reports"]) == (False, [problem], [])


def _fault(pci: str, time: float, job: str = "", pid: int | None = None, xid: int = 13) -> dict[str, Any]:
    return {"xid": xid, "pci": pci, "time": time, "job": job, "pid": pid}


def test_faults_from_several_jobs_on_one_gpu_within_the_window_repeat() -> None:
    now = 10_000.0
    faults = [
        _fault("0000:2a:00", now - 3000, job="101"),
        _fault("0000:2a:00", now - 2000, job="101"),  # the same job again
        _fault("0000:2a:00", now - 1000, job="102"),
        _fault("0000:18:00", now - 10, job="103"),  # another GPU
        _fault("0000:2a:00", now - 5000, job="104"),  # before the window
        _fault("0000:2a:00", now - 5, xid=31),  # no job, no process: cannot be told apart
    ]
    assert verdicts.repeated_faults(faults, now, 3600, 3) == []
    faults.append(_fault("0000:2a:00", now, job="105", xid=31))
    [fault] = verdicts.repeated_faults(faults, now, 3600, 3)
    assert (fault.pci, fault.xids, fault.sources) == ("0000:2a:00", [13, 31], ["job 101", "job 102", "job 105"])
    assert fault.text(" on GPU 1") == "XIDs 13, 31 from 3 different jobs on GPU 1 within 1h: treated as a GPU fault"


@pytest.mark.parametrize(
    ("sources", "text"),
    [
        ([{"pid": 1}, {"pid": 2}], "XID 13 from 2 different processes within 30m: treated as a GPU fault"),
        ([{"job": "7"}, {"pid": 2}], "XID 13 from 2 different jobs or processes within 30m: treated as a GPU fault"),
    ],
)
def test_without_jobs_processes_tell_the_faults_apart(sources: list[dict[str, Any]], text: str) -> None:
    faults = [{**_fault("0000:2a:00", 100.0), **source} for source in sources]
    [fault] = verdicts.repeated_faults(faults, 100.0, 1800, 2)
    assert fault.text() == text


def test_a_repeated_fault_fails_its_gpu_in_the_verdict() -> None:
    fault = verdicts.RepeatedFault(pci="0000:2a:00", xids=[13], sources=["job 1", "job 2", "job 3"], window=3600)
    result = verdicts.assess(report(H100), verdicts.Policy(), [], [], [fault])
    assert result["problems"] == [
        "GPU 1 (00000000:2A:00.0): XID 13 from 3 different jobs within 1h: treated as a GPU fault"
    ]


# --- the cluster file and the render ------------------------------------------------------------------------------

GOOD = """
name: xids
node_groups:
  head: {hosts: ctl01, roles: [slurm_controller, slurm_dbd, slurm_login]}
  gpu: {hosts: gpu01, roles: [slurm_compute], gpu: {model: H100-SXM5-80GB, count: 8}}
driver: {version: "535.261.03"}
slurm:
  partitions:
    gpu: {node_groups: [gpu]}
health:
  allowed_xids: [43]
  xid_classes: {94: reset, 13: node, 43: ignore}
  xid_repetition: {jobs: 4, window: 30m}
"""


def test_a_good_xid_policy_reaches_the_programs_settings(tmp_path: Path) -> None:
    (tmp_path / "cluster.yml").write_text(GOOD)
    rc = load_cluster(tmp_path / "cluster.yml").resolved
    assert rc.model.health.xid_classes == {94: "reset", 13: "node", 43: "ignore"}
    [settings] = [r for r in render(rc, list(health.ARTIFACTS)) if r.artifact.template == "health.json.j2"]
    policy = json.loads(settings.content)["policy"]
    assert {k: policy[k] for k in ("allowed_xids", "xid_classes", "xid_repeat_jobs", "xid_repeat_window")} == {
        "allowed_xids": [43],
        "xid_classes": {"13": "node", "43": "ignore", "94": "reset"},
        "xid_repeat_jobs": 4,
        "xid_repeat_window": 1800,
    }


def test_the_check_settings_reach_the_programs_settings(tmp_path: Path) -> None:
    """health.check's unknown_limit (in seconds), max_drained and mode, and the node exporter's textfile the program
    shows its verdict in."""
    (tmp_path / "cluster.yml").write_text(GOOD + "  check: {unknown_limit: 45m, max_drained: 3, mode: observe}\n")
    rc = load_cluster(tmp_path / "cluster.yml").resolved
    [settings] = [r for r in render(rc, list(health.ARTIFACTS)) if r.artifact.template == "health.json.j2"]
    program = json.loads(settings.content)
    assert (program["unknown_limit"], program["max_drained"], program["mode"]) == (2700, "3", "observe")
    assert program["textfile"] == "/var/lib/prometheus/node-exporter/gpuinfra_health.prom"
