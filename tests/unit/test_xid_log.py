"""plugins/module_utils/xid_log.py: NVRM XID lines in every kernel log format, and their GPUs in the verdict."""

from __future__ import annotations

import pytest
from smi_data import A100_MIG, DATA, GPU3, GPU6, H100, verdict, verdicts, xid_log

# --- kernel log XIDs ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        # journalctl -k -o short-iso, current drivers
        (
            "2025-03-11T09:02:45+0000 gpu07 kernel: NVRM: Xid (PCI:0000:ba:00): 79, pid='<unknown>', name=<unknown>, "
            "GPU has fallen off the bus.",
            (79, "0000:ba:00", None, "pid='<unknown>', name=<unknown>, GPU has fallen off the bus."),
        ),
        # dmesg with a kernel timestamp
        (
            "[ 8123.441901] NVRM: Xid (PCI:0000:3B:00): 48, pid=1, name=x, DBE",
            (48, "0000:3b:00", None, "pid=1, name=x, DBE"),
        ),
        # older drivers: no PCI: prefix; classic syslog line with the kernel timestamp inside
        (
            "May 10 22:25:01 host kernel: [176830.774761] NVRM: Xid (0000:03:00): 13, 0003 00000000 00008297",
            (13, "0000:03:00", None, "0003 00000000 00008297"),
        ),
        # MIG: the GPU instance follows the address
        (
            "NVRM: Xid (PCI:0000:01:00 GPU-I:05): 94, pid=7194, Contained: CE User Channel (0x9). RST: No, D-RST: No",
            (94, "0000:01:00", 5, "pid=7194, Contained: CE User Channel (0x9). RST: No, D-RST: No"),
        ),
        # an address with a function number, and an XID with no message
        ("kernel: NVRM: Xid (PCI:0000:10:00.0): 79", (79, "0000:10:00", None, "")),
        # a non-zero PCI domain
        (
            "NVRM: Xid (PCI:000f:01:00): 13, pid=4242, name=python3, Graphics Exception",
            (13, "000f:01:00", None, "pid=4242, name=python3, Graphics Exception"),
        ),
    ],
)
def test_xid_line_formats(line: str, expected: tuple[int, str, int | None, str]) -> None:
    events = xid_log.parse_xid_log(line)
    assert [(e.xid, e.pci, e.gpu_instance, e.message) for e in events] == [expected]


@pytest.mark.parametrize(
    ("message", "pid", "process"),
    [
        ("pid=30877, name=train.py, Graphics Exception", 30877, "train.py"),
        ("pid='<unknown>', name=<unknown>, GPU has fallen off the bus.", None, ""),
        ("pid=<unknown>, name=<unknown>, NVLink: fatal error", None, ""),
        ("pid=7194, Contained: CE User Channel (0x9).", 7194, ""),
        ("0003 00000000 00008297", None, ""),  # older drivers name no process
        ("pid=99999999999, name=x, too long for a pid", None, "x"),
        ("pid=\u0661\u0662, name=x, not ASCII digits", None, "x"),
    ],
)
def test_the_process_an_xid_names(message: str, pid: int | None, process: str) -> None:
    [event] = xid_log.parse_xid_log(f"NVRM: Xid (PCI:0000:3b:00): 13, {message}")
    assert (event.pid, event.process) == (pid, process)


@pytest.mark.parametrize(
    "line",
    [
        "NVRM: GPU 0000:ba:00.0: GPU has fallen off the bus.",
        "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.127.05",
        "nvidia-modeset: Xid is not mentioned here",
        "NVRM: Xid (PCI:zzzz:01:00): 13, bad address",
    ],
)
def test_non_xid_lines(line: str) -> None:
    assert xid_log.parse_xid_log(line) == []


def test_kernel_log_fixtures() -> None:
    journal = [(e.xid, e.pci) for e in xid_log.parse_xid_log((DATA / "kernel-log-journal.txt").read_text())]
    assert journal == [
        (48, "0000:5d:00"),
        (63, "0000:5d:00"),
        (13, "0000:2a:00"),
        (79, "0000:ba:00"),
        (79, "0000:ba:00"),
        (119, "0000:c1:00"),
    ]
    dmesg = [(e.xid, e.pci) for e in xid_log.parse_xid_log((DATA / "kernel-log-dmesg.txt").read_text())]
    assert dmesg == [(48, "0000:07:00"), (63, "0000:07:00"), (31, "0000:06:00")]


def test_xids_map_to_gpus_and_drain_by_their_class() -> None:
    """NVIDIA's catalog: 48 needs a GPU reset, 79 a reboot, 119 (of a GPU nvidia-smi no longer lists) a reset;
    63 (a row remap recorded: its pending remap is judged from nvidia-smi) and 13 (the application's) are reported."""
    result = verdict(H100, "kernel-log-journal.txt")
    assert result["problems"] == [
        f"{GPU3}: XID 48 (reset the GPU) in the kernel log since boot (1 time): An uncorrectable double bit error "
        "(DBE) has been detected on GPU in the framebuffer at partition 6, subpartition 0.",
        f"{GPU6}: XID 79 (reboot) in the kernel log since boot (2 times): GPU has fallen off the bus.",
        "node: XID 119 (reset the GPU) in the kernel log since boot for PCI 0000:c1:00, a GPU nvidia-smi does not "
        "list (1 time): Timeout after 6s of waiting for RPC response from GPU1 GSP! Expected function 76 "
        "(GSP_RM_CONTROL) (0x20800a4c 0x4).",
    ]
    assert [x["xid"] for x in result["gpus"][1]["xids"]] == [13]  # reported, not judged
    assert result["gpus"][1]["problems"] == []
    assert [(r["xid"], r["class"], r["gpu"], r["pid"], r["process"]) for r in result["xid_reports"]] == [
        (63, "ignore", 3, 24511, "python3"),
        (13, "application", 1, 30877, "train.py"),
    ]


def test_the_sites_classes_override_the_catalog() -> None:
    overridden = verdict(H100, "kernel-log-journal.txt", xid_classes={13: "node", 79: "hardware", 48: "ignore"})
    assert overridden["gpus"][1]["problems"] == [
        "XID 13 in the kernel log since boot (1 time): Graphics Exception: ESR 0x514648=0x1000a 0x514650=0x0 "
        "0x514644=0xd3eff2 0x51464c=0x17f"
    ]
    assert overridden["gpus"][6]["problems"] == [
        "XID 79 (hardware fault: repair or replace the GPU) in the kernel log since boot (2 times): GPU has fallen off "
        "the bus."
    ]
    assert overridden["gpus"][3]["problems"] == []
    # allowed_xids never drains, whatever the class says.
    allowed = verdict(H100, "kernel-log-journal.txt", allowed_xids=[79], xid_classes={79: "reboot"})
    assert allowed["gpus"][6]["problems"] == []
    assert {(r["xid"], r["class"]) for r in allowed["xid_reports"]} >= {(79, "ignore")}


def test_mig_xids_map_to_their_parent_gpu() -> None:
    result = verdict(A100_MIG, "kernel-log-mig-syslog.txt", mig_layouts={"0": "halves", "1": "mixed"})
    assert [[(x["xid"], x["gpu_instance"]) for x in g["xids"]] for g in result["gpus"]] == [
        [(94, 2)],
        [(43, None)],
        [(74, None)],
        [],
    ]
    assert result["node_problems"] == []


def test_xids_without_a_report_are_node_problems() -> None:
    events = xid_log.parse_xid_log((DATA / "kernel-log-dmesg.txt").read_text())
    result = verdicts.assess(None, verdicts.Policy(), events, ["nvidia-smi failed"])
    assert result["node_problems"] == [
        "nvidia-smi failed",
        "XID 48 (reset the GPU) in the kernel log since boot for PCI 0000:07:00 (1 time): Ch 00000008, intr "
        "00000000. An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition "
        "4, subpartition 1.",
    ]
    assert [(r["xid"], r["class"], r["gpu"]) for r in result["xid_reports"]] == [
        (63, "ignore", None),
        (31, "application", None),
    ]
