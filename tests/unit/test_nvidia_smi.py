"""The health parser (plugins/module_utils/nvidia_smi.py) on nvidia-smi, kernel log and DKMS outputs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from file_module import nvidia_smi
from hypothesis import given, settings
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "unit" / "data" / "nvidia-smi"


nv = nvidia_smi()

H100 = "h100-hgx-8x-healthy.xml"
H100_BAD = "h100-hgx-8x-unhealthy.xml"
H100_NOPM = "h100-hgx-8x-persistence-off.xml"
A100_MIG = "a100-sxm4-4x-mig.xml"
V100 = "v100-sxm2-2x-r460-healthy.xml"
V100_PENDING = "v100-sxm2-2x-r460-retired-pages-pending.xml"


BUS = dict(enumerate(["18", "2A", "3A", "5D", "9A", "AB", "BA", "DB"]))  # the H100 fixtures' PCI buses


def data(name: str) -> bytes:
    return (DATA / name).read_bytes()


def report(name: str) -> Any:
    return nv.parse_smi_xml(data(name))


def verdict(name: str, xid_log: str | None = None, **policy: Any) -> dict[str, Any]:
    events = nv.parse_xid_log((DATA / xid_log).read_text()) if xid_log else []
    result: dict[str, Any] = nv.assess(report(name), nv.Policy(**policy), events)
    return result


# --- parsing ----------------------------------------------------------------------------------------------------


def test_h100_fields() -> None:
    r = report(H100)
    assert (r.driver_version, r.cuda_version, r.attached_gpus, r.dtd) == (
        "550.127.05",
        "12.4",
        8,
        "nvsmi_device_v12.dtd",
    )
    assert [g.pci_bus_id for g in r.gpus] == [f"00000000:{BUS[i]}:00.0" for i in range(8)]
    g = r.gpus[0]
    assert (g.index, g.name, g.uuid, g.minor_number) == (
        0,
        "NVIDIA H100 80GB HBM3",
        "GPU-5b1e0c4a-8f27-4d3b-9a61-2c7e3f9d0b14",
        0,
    )
    assert (g.persistence_mode, g.mig_current, g.mig_pending, g.mig_devices) == ("Enabled", "Disabled", "Disabled", 0)
    assert (g.ecc_mode, g.ecc_volatile_uncorrectable, g.ecc_aggregate_uncorrectable) == ("Enabled", 0, 0)
    assert g.remapped_rows == {"correctable": 0, "uncorrectable": 0, "pending": False, "failure": False}
    assert g.retired_pages is None  # every retired-pages field is N/A on Hopper
    assert (g.temperature_c, g.performance_state) == (31, "P0")
    assert (g.clock_reasons, g.clock_reasons_source) == (["gpu_idle"], "clocks_event_reasons")
    assert (g.pcie_gen_current, g.pcie_gen_max, g.pcie_width_current, g.pcie_width_max) == (5, 5, 16, 16)
    assert (g.lost, g.reset_required) == (False, False)
    assert r.gpus[2].pcie_gen_current == 1  # idle link power saving, not a fault


RECORDED = DATA / "h100-recorded"
NVML_FIELDS = (
    "name", "uuid", "pci_device_id", "temperature_c", "pcie_gen_max", "pcie_width_max", "pcie_width_current",
    "pcie_gen_current", "persistence_mode", "mig_current", "ecc_mode", "ecc_volatile_uncorrectable",
    "ecc_aggregate_uncorrectable",
)  # fmt: skip


def test_a_real_h100_recording_parses_to_what_nvml_read_from_the_same_gpu() -> None:
    """nvidia-smi -q -x recorded on a real H100 (DTD v13), against NVML's reading of the same GPU."""
    nvml = json.loads((RECORDED / "nvml-reference.json").read_text())
    r = nv.parse_smi_xml((RECORDED / "nvidia-smi-q-x.xml").read_bytes())
    assert (r.driver_version, r.attached_gpus, r.dtd) == (nvml["driver_version"], 1, "nvsmi_device_v13.dtd")
    [gpu] = r.gpus
    [expected] = nvml["gpus"]
    assert {f: getattr(gpu, f) for f in NVML_FIELDS} == {f: expected[f] for f in NVML_FIELDS}
    assert gpu.remapped_rows == expected["remapped"]
    assert gpu.uuid in (RECORDED / "nvidia-smi-L.txt").read_text()
    verdict = nv.assess(r, nv.Policy(expected_count=1, expected_pci_ids=("0x2330",), driver_version="580.159.04"), [])
    assert (verdict["healthy"], verdict["problems"]) == (True, [])


@pytest.mark.parametrize(
    ("state", "status", "nvswitch", "problem"),
    [
        ("Completed", "Success", True, None),
        ("In Progress", "N/A", True, "NVSwitch fabric registration is In Progress (no status)"),
        ("Completed", "Failure", True, "NVSwitch fabric registration is Completed (Failure)"),
        ("Not Started", "N/A", False, None),  # a PCIe node: no fabric to join
        ("N/A", "N/A", True, None),  # a driver or board that reports no fabric (the recording's)
    ],
)
def test_the_fabric_check_on_the_recorded_h100(state: str, status: str, nvswitch: bool, problem: str | None) -> None:
    """The recorded H100's fabric element, with the registration state a fabric manager leaves it in."""
    text = (RECORDED / "nvidia-smi-q-x.xml").read_text()
    recorded = "<fabric>\n\t\t\t<state>N/A</state>\n\t\t\t<status>N/A</status>"
    assert recorded in text
    text = text.replace(recorded, f"<fabric>\n\t\t\t<state>{state}</state>\n\t\t\t<status>{status}</status>")
    policy = nv.Policy(expected_count=1, driver_version="580.159.04", fabric_manager=nvswitch)
    problems = nv.assess(nv.parse_smi_xml(text.encode()), policy, [])["problems"]
    assert problems == (
        []
        if problem is None
        else [f"GPU 0 (00000000:00:06.0): {problem}: is nvidia-fabricmanager running, at the driver's version?"]
    )


def test_h100_unhealthy_fields() -> None:
    g3, g6 = report(H100_BAD).gpus[3], report(H100_BAD).gpus[6]
    assert (g3.temperature_c, g3.ecc_volatile_uncorrectable, g3.ecc_aggregate_uncorrectable) == (92, 3, 3)
    assert g3.remapped_rows == {"correctable": 0, "uncorrectable": 1, "pending": True, "failure": False}
    assert g3.clock_reasons == ["hw_thermal_slowdown", "sw_thermal_slowdown"]
    assert (g6.pcie_gen_current, g6.pcie_width_current, g6.clock_reasons) == (3, 8, [])


def test_a100_mig_fields() -> None:
    r = report(A100_MIG)
    assert (r.driver_version, len(r.gpus)) == ("535.261.03", 4)
    assert [(g.mig_current, g.mig_pending, g.mig_devices) for g in r.gpus] == [
        ("Enabled", "Enabled", 2),
        ("Enabled", "Enabled", 3),
        ("Disabled", "Disabled", 0),
        ("Disabled", "Disabled", 0),
    ]
    assert {g.clock_reasons_source for g in r.gpus} == {"clocks_throttle_reasons"}
    assert r.gpus[0].clock_reasons == ["gpu_idle"]
    # R535 layout: sram_uncorrectable + dram_uncorrectable, not the later parity/SECDED split.
    assert [g.ecc_volatile_uncorrectable for g in r.gpus] == [0, 0, 0, 0]


def test_v100_older_driver_fields() -> None:
    r = report(V100_PENDING)
    assert (r.driver_version, r.dtd) == ("460.106.00", "nvsmi_device_v11.dtd")
    g0, g1 = r.gpus
    assert g0.remapped_rows is None
    assert g0.retired_pages == {"single_bit": 0, "double_bit": 0, "pending": False}
    assert g1.retired_pages == {"single_bit": 0, "double_bit": 1, "pending": True}
    assert (g1.ecc_volatile_uncorrectable, g1.ecc_aggregate_uncorrectable) == (2, 2)  # double_bit/total
    assert (g0.mig_current, g0.clock_reasons_source, g0.pcie_gen_max) == (None, "clocks_throttle_reasons", 3)


# --- verdicts on every fixture ----------------------------------------------------------------------------------

GPU3 = "GPU 3 (00000000:5D:00.0)"
GPU6 = "GPU 6 (00000000:BA:00.0)"

UNHEALTHY_H100 = [
    f"{GPU3}: temperature 92 C is above the 85 C limit",
    f"{GPU3}: 3 uncorrectable ECC error(s) since the driver loaded (limit 0)",
    f"{GPU3}: row remapping is pending: reset the GPU (or reboot) to apply it",
    f"{GPU3}: clocks slowed down: hw_thermal_slowdown, sw_thermal_slowdown",
    f"{GPU6}: PCIe link width x8 is below its maximum x16",
    f"{GPU6}: PCIe link Gen3 is below its maximum Gen5",
]


@pytest.mark.parametrize(
    ("fixture", "policy", "problems"),
    [
        pytest.param(H100, {"expected_count": 8, "driver_version": "550.127.05"}, [], id="h100-healthy"),
        pytest.param(H100, {"expected_count": 8, "driver_version": "550"}, [], id="h100-branch-pin"),
        pytest.param(
            H100,
            {"expected_count": 4, "driver_version": "535.261.03"},
            [
                "node: nvidia-smi lists 8 GPU(s), the model expects 4",
                "node: the driver in use is 550.127.05, the pin is 535.261.03",
            ],
            id="h100-wrong-count-and-pin",
        ),
        pytest.param(H100_BAD, {"expected_count": 8}, UNHEALTHY_H100, id="h100-unhealthy"),
        pytest.param(
            H100_BAD,
            {"max_temperature_c": 95, "max_uncorrectable_ecc": 3, "check_pcie_link": False},
            UNHEALTHY_H100[2:4],
            id="h100-unhealthy-relaxed-policy",
        ),
        pytest.param(
            H100_NOPM,
            {},
            [
                f"GPU {i} (00000000:{BUS[i]}:00.0): persistence mode is Disabled (is nvidia-persistenced running?)"
                for i in range(8)
            ],
            id="h100-persistence-off",
        ),
        pytest.param(H100_NOPM, {"require_persistence": False}, [], id="h100-persistence-not-required"),
        pytest.param(
            A100_MIG, {"expected_count": 4, "mig_layouts": {"0": "halves", "1": "mixed"}}, [], id="a100-mig-as-modelled"
        ),
        pytest.param(
            A100_MIG,
            {},
            [
                "GPU 0 (00000000:07:00.0): MIG mode is Enabled, the model assigns no MIG layout to this GPU",
                "GPU 1 (00000000:0F:00.0): MIG mode is Enabled, the model assigns no MIG layout to this GPU",
            ],
            id="a100-mig-not-modelled",
        ),
        pytest.param(
            A100_MIG,
            {"mig_layouts": {"0": "halves", "1": "mixed", "3": "sevenths"}},
            ["GPU 3 (00000000:4E:00.0): MIG mode is Disabled, the model assigns layout 'sevenths' (MIG enabled)"],
            id="a100-mig-missing",
        ),
        pytest.param(A100_MIG, {"check_mig": False}, [], id="a100-mig-unchecked"),
        pytest.param(V100, {"expected_count": 2, "driver_version": "460.106.00"}, [], id="v100-healthy"),
        pytest.param(
            V100_PENDING,
            {},
            [
                "GPU 1 (00000000:07:00.0): 2 uncorrectable ECC error(s) since the driver loaded (limit 0)",
                "GPU 1 (00000000:07:00.0): retired pages are pending: reset the GPU (or reboot) to retire them",
            ],
            id="v100-retired-pages-pending",
        ),
    ],
)
def test_verdict(fixture: str, policy: dict[str, Any], problems: list[str]) -> None:
    result = verdict(fixture, **policy)
    assert result["problems"] == problems
    assert result["healthy"] is (not problems)
    per_gpu = [p for g in result["gpus"] for p in g["problems"]]
    assert len(per_gpu) + len(result["node_problems"]) == len(problems)


def test_verdict_shape() -> None:
    result = verdict(H100_BAD, expected_count=8, driver_version="550.127.05")
    assert set(result) == {
        "healthy",
        "gpu_count",
        "expected_count",
        "driver_version",
        "driver_pin",
        "gpus",
        "node_problems",
        "problems",
    }
    gpu = result["gpus"][3]
    assert set(gpu) == {
        "index",
        "name",
        "uuid",
        "pci_bus_id",
        "pci_device_id",
        "minor_number",
        "persistence_mode",
        "temperature_c",
        "performance_state",
        "ecc",
        "remapped_rows",
        "retired_pages",
        "clock_reasons",
        "pcie",
        "mig",
        "xids",
        "problems",
    }
    assert gpu["uuid"] == "GPU-c4d81f37-6b2e-4a90-9f15-3d8e0b7a6c21"
    assert gpu["mig"] == {
        "current": "Disabled",
        "pending": "Disabled",
        "devices": 0,
        "layout": None,
        "expected": "Disabled",
    }
    assert gpu["ecc"] == {"mode": "Enabled", "volatile_uncorrectable": 3, "aggregate_uncorrectable": 3}
    assert (result["gpu_count"], result["driver_pin"]) == (8, "550.127.05")


def test_failure_message_names_each_gpu_and_reason() -> None:
    message = nv.failure_message(verdict(H100_BAD))
    assert message.startswith("GPU node unhealthy (6 problems): ")
    assert message.endswith("; ".join(UNHEALTHY_H100))


def test_mig_mode_change_pending() -> None:
    text = data(A100_MIG).replace(b"<pending_mig>Enabled</pending_mig>", b"<pending_mig>Disabled</pending_mig>", 1)
    result = nv.assess(nv.parse_smi_xml(text), nv.Policy(mig_layouts={"0": "halves", "1": "mixed"}))
    assert result["problems"] == ["GPU 0 (00000000:07:00.0): MIG mode change to Disabled is pending a GPU reset"]


def test_mig_enabled_without_devices() -> None:
    text = data(A100_MIG).replace(b"<current_mig>Disabled</current_mig>", b"<current_mig>Enabled</current_mig>", 1)
    text = text.replace(b"<pending_mig>Disabled</pending_mig>", b"<pending_mig>Enabled</pending_mig>", 1)
    result = nv.assess(nv.parse_smi_xml(text), nv.Policy(mig_layouts={"0": "a", "1": "b", "2": "c"}))
    assert result["problems"] == [
        "GPU 2 (00000000:47:00.0): MIG is enabled but no MIG devices exist: layout 'c' is not applied"
    ]


def test_mig_layout_on_a_gpu_without_mig() -> None:
    result = verdict(V100, mig_layouts={"1": "halves"})
    assert result["problems"] == [
        "GPU 1 (00000000:07:00.0): MIG layout 'halves' is assigned, but this GPU does not support MIG"
    ]


def test_row_remap_failure_and_lost_gpu() -> None:
    text = data(H100).replace(
        b"<remapped_row_failure>No</remapped_row_failure>", b"<remapped_row_failure>Yes</remapped_row_failure>", 1
    )
    text = text.replace(b"<gpu_temp>29 C</gpu_temp>", b"<gpu_temp>GPU is lost</gpu_temp>", 1)
    result = nv.assess(nv.parse_smi_xml(text), nv.Policy())
    assert result["problems"] == [
        "GPU 0 (00000000:18:00.0): row remapping failed: the GPU memory has no spare rows left (replace the GPU)",
        "GPU 1 (00000000:2A:00.0): nvidia-smi reports the GPU as lost or needing a reset: it has fallen off the bus",
    ]


# --- clock event (throttle) reasons, both names ------------------------------------------------------------------


def _one_gpu(reasons_xml: str) -> bytes:
    return (
        '<?xml version="1.0" ?>\n<nvidia_smi_log><driver_version>535.261.03</driver_version>'
        f'<gpu id="00000000:01:00.0"><pci><pci_bus_id>00000000:01:00.0</pci_bus_id></pci>{reasons_xml}</gpu>'
        "</nvidia_smi_log>"
    ).encode()


@pytest.mark.parametrize("prefix", ["clocks_event_reason", "clocks_throttle_reason"])
@pytest.mark.parametrize(
    ("active", "problem"),
    [
        ("gpu_idle", None),
        ("sw_power_cap", None),
        ("applications_clocks_setting", None),
        ("sync_boost", None),
        ("hw_slowdown", "clocks slowed down: hw_slowdown"),
        ("hw_thermal_slowdown", "clocks slowed down: hw_thermal_slowdown"),
        ("hw_power_brake_slowdown", "clocks slowed down: hw_power_brake_slowdown"),
        ("sw_thermal_slowdown", "clocks slowed down: sw_thermal_slowdown"),
    ],
)
def test_clock_reasons_old_and_new_names(prefix: str, active: str, problem: str | None) -> None:
    names = ["gpu_idle", "sw_power_cap", "hw_slowdown", "hw_thermal_slowdown", "sw_thermal_slowdown"]
    names += [active] if active not in names else []
    body = "".join(f"<{prefix}_{n}>{'Active' if n == active else 'Not Active'}</{prefix}_{n}>" for n in names)
    gpu = nv.parse_smi_xml(_one_gpu(f"<{prefix}s>{body}</{prefix}s>")).gpus[0]
    assert (gpu.clock_reasons, gpu.clock_reasons_source) == ([active], f"{prefix}s")
    expected = [f"GPU 0 (00000000:01:00.0): {problem}"] if problem else []
    assert nv.assess(nv.parse_smi_xml(_one_gpu(f"<{prefix}s>{body}</{prefix}s>")), nv.Policy())["problems"] == expected


def test_renaming_event_reasons_to_throttle_reasons_keeps_the_verdict() -> None:
    renamed = data(H100_BAD).replace(b"clocks_event_reason", b"clocks_throttle_reason")
    assert nv.assess(nv.parse_smi_xml(renamed), nv.Policy(expected_count=8))["problems"] == UNHEALTHY_H100


def test_idle_gpu_below_max_generation_is_healthy_but_narrow_link_is_not() -> None:
    text = data(H100).replace(
        b"<current_link_width>16x</current_link_width>", b"<current_link_width>4x</current_link_width>"
    )
    problems = nv.assess(nv.parse_smi_xml(text), nv.Policy())["problems"]
    assert len(problems) == 8  # width on every GPU; GPUs 2 and 7 sit at Gen1 but are idle
    assert all("PCIe link width x4 is below its maximum x16" in p for p in problems)


# --- errors instead of XML --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fixture", "rc", "problem"),
    [
        (
            "error-driver-library-mismatch.txt",
            18,
            "nvidia-smi: Driver/library version mismatch: the loaded nvidia kernel module is not the version of the "
            "installed driver libraries; reboot (or unload and reload the nvidia modules) to load the installed driver",
        ),
        (
            "error-no-driver.txt",
            9,
            "nvidia-smi cannot communicate with the NVIDIA driver: the nvidia kernel module is not loaded "
            "(not built for the running kernel, blacklisted, or failed to load; see dmesg)",
        ),
        (
            "error-no-devices.txt",
            6,
            "nvidia-smi finds no GPUs (No devices were found): the driver is loaded but sees no usable GPU",
        ),
    ],
)
def test_error_texts(fixture: str, rc: int, problem: str) -> None:
    text = data(fixture)
    with pytest.raises(nv.SmiError):
        nv.parse_smi_xml(text)
    assert nv.smi_failure(rc, text, b"") == problem
    result = nv.assess(None, nv.Policy(expected_count=8), [], [problem])
    assert (result["healthy"], result["gpus"], result["problems"]) == (False, [], [f"node: {problem}"])


def test_other_failures() -> None:
    assert nv.smi_failure(124, "", "") == "nvidia-smi did not answer in time: a GPU or the driver is hung"
    assert nv.smi_failure(15, "Unable to determine the device handle for GPU0000:3B:00.0: GPU is lost.", "") == (
        "nvidia-smi reports a GPU that has fallen off the bus (GPU is lost): the node needs a power cycle"
    )
    assert nv.smi_failure(255, "", "Segmentation fault\n") == "nvidia-smi failed (exit code 255): Segmentation fault"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (b"", "nvidia-smi printed nothing"),
        (b"<nvidia_smi_log><gpu>", "nvidia-smi output is not XML"),
        (b"<html></html>", "not an nvidia_smi_log document (root element <html>)"),
        (
            b'<?xml version="1.0"?><!DOCTYPE x [<!ENTITY a "aaaa"><!ENTITY b "&a;&a;&a;">]>'
            b"<nvidia_smi_log>&b;</nvidia_smi_log>",
            "declares XML entities",
        ),
    ],
)
def test_unusable_output(text: bytes, message: str) -> None:
    with pytest.raises(nv.SmiError, match=message.replace("(", r"\(").replace(")", r"\)")):
        nv.parse_smi_xml(text)


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
    events = nv.parse_xid_log(line)
    assert [(e.xid, e.pci, e.gpu_instance, e.message) for e in events] == [expected]


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
    assert nv.parse_xid_log(line) == []


def test_kernel_log_fixtures() -> None:
    journal = [(e.xid, e.pci) for e in nv.parse_xid_log((DATA / "kernel-log-journal.txt").read_text())]
    assert journal == [
        (48, "0000:5d:00"),
        (63, "0000:5d:00"),
        (13, "0000:2a:00"),
        (79, "0000:ba:00"),
        (79, "0000:ba:00"),
        (119, "0000:c1:00"),
    ]
    dmesg = [(e.xid, e.pci) for e in nv.parse_xid_log((DATA / "kernel-log-dmesg.txt").read_text())]
    assert dmesg == [(48, "0000:07:00"), (63, "0000:07:00"), (31, "0000:06:00")]


def test_xids_map_to_gpus_and_honour_allowed_xids() -> None:
    result = verdict(H100, "kernel-log-journal.txt", allowed_xids=[13])
    assert result["problems"] == [
        f"{GPU3}: XID 48 in the kernel log since boot (1 time): An uncorrectable double bit error (DBE) has been "
        "detected on GPU in the framebuffer at partition 6, subpartition 0.",
        f"{GPU3}: XID 63 in the kernel log since boot (1 time): Row Remapper: New row (0x00000000012c4d80) marked "
        "for remapping, reset gpu to activate.",
        f"{GPU6}: XID 79 in the kernel log since boot (2 times): GPU has fallen off the bus.",
        "node: XID 119 in the kernel log since boot for PCI 0000:c1:00, a GPU nvidia-smi does not list (1 time): "
        "Timeout after 6s of waiting for RPC response from GPU1 GSP! Expected function 76 (GSP_RM_CONTROL) "
        "(0x20800a4c 0x4).",
    ]
    assert [x["xid"] for x in result["gpus"][1]["xids"]] == [13]  # reported, not judged
    assert result["gpus"][1]["problems"] == []
    without_allowance = verdict(H100, "kernel-log-journal.txt")
    assert without_allowance["gpus"][1]["problems"] == [
        "XID 13 in the kernel log since boot (1 time): Graphics Exception: ESR 0x514648=0x1000a 0x514650=0x0 "
        "0x514644=0xd3eff2 0x51464c=0x17f"
    ]


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
    events = nv.parse_xid_log((DATA / "kernel-log-dmesg.txt").read_text())
    result = nv.assess(None, nv.Policy(allowed_xids=[31, 63]), events, ["nvidia-smi failed"])
    assert result["node_problems"] == [
        "nvidia-smi failed",
        "XID 48 in the kernel log since boot for PCI 0000:07:00 (1 time): Ch 00000008, intr 00000000. An "
        "uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 4, "
        "subpartition 1.",
    ]


# --- DKMS and the kernel module -------------------------------------------------------------------------------

DKMS3 = """\
nvidia-current/535.261.03, 6.1.0-31-amd64, x86_64: installed
nvidia-current/535.261.03, 6.1.0-32-amd64, x86_64: built
nvidia-current/535.216.03, 6.12.12+bpo-amd64, x86_64: installed (WARNING! Diff between built and installed module!)
nvidia-fs/2.20.5, 6.1.0-31-amd64, x86_64: installed
nvidia-current/535.261.03: added
Error! Could not locate dkms.conf file.
"""

DKMS2 = """\
nvidia, 470.256.02, 5.15.0-91-generic, x86_64: installed
nvidia, 470.256.02, 5.15.0-94-generic, x86_64: installed (original_module exists)
"""


def test_parse_dkms_status_both_formats() -> None:
    entries = nv.parse_dkms_status(DKMS3) + nv.parse_dkms_status(DKMS2)
    assert [(e.module, e.version, e.kernel, e.arch, e.state, e.note) for e in entries] == [
        ("nvidia-current", "535.261.03", "6.1.0-31-amd64", "x86_64", "installed", ""),
        ("nvidia-current", "535.261.03", "6.1.0-32-amd64", "x86_64", "built", ""),
        (
            "nvidia-current",
            "535.216.03",
            "6.12.12+bpo-amd64",
            "x86_64",
            "installed",
            "WARNING! Diff between built and installed module!",
        ),
        ("nvidia-fs", "2.20.5", "6.1.0-31-amd64", "x86_64", "installed", ""),
        ("nvidia-current", "535.261.03", "", "", "added", ""),
        ("nvidia", "470.256.02", "5.15.0-91-generic", "x86_64", "installed", ""),
        ("nvidia", "470.256.02", "5.15.0-94-generic", "x86_64", "installed", "original_module exists"),
    ]


def test_dkms_problems_per_kernel() -> None:
    entries = nv.parse_dkms_status(DKMS3)
    kernels = ["6.1.0-31-amd64", "6.1.0-32-amd64", "6.12.12+bpo-amd64", "6.1.0-99-amd64"]
    assert nv.dkms_problems(entries, "535.261.03", kernels) == [
        "DKMS: the nvidia module 535.261.03 is not installed for kernel 6.1.0-32-amd64 "
        "(nvidia-current/535.261.03: built)",
        "DKMS: no nvidia module 535.261.03 for kernel 6.12.12+bpo-amd64, only nvidia-current/535.216.03: installed",
        "DKMS: no nvidia module 535.261.03 for kernel 6.1.0-99-amd64",
    ]
    assert nv.dkms_problems(entries, "535", ["6.12.12+bpo-amd64"]) == []  # a branch pin accepts 535.216.03
    assert nv.dkms_problems(entries, "535.261.03", ["6.1.0-31-amd64"], module="nvidia") == [
        "DKMS: no nvidia module 535.261.03 for kernel 6.1.0-31-amd64"
    ]
    # nvidia-fs (GPUDirect Storage) is not the driver
    assert nv.dkms_problems(nv.parse_dkms_status(DKMS3.splitlines()[3]), "2.20.5", ["6.1.0-31-amd64"]) == [
        "DKMS: no nvidia module 2.20.5 for kernel 6.1.0-31-amd64"
    ]


def test_kernel_module_problems() -> None:
    assert nv.kernel_module_problems("535.261.03", "535.261.03", "535.261.03") == []
    assert nv.kernel_module_problems("", None, None) == []
    assert nv.kernel_module_problems("535.261.03", None, None) == [
        "modinfo finds no nvidia kernel module for the running kernel (the pin is 535.261.03)"
    ]
    assert nv.kernel_module_problems("535.261.03", "535.216.03", "535.216.03") == [
        "modinfo: the nvidia kernel module is 535.216.03, the pin is 535.261.03",
        "the loaded nvidia kernel module is 535.216.03, the pin is 535.261.03: reboot to load the pinned driver",
    ]
    # installed for the running kernel but the old one still loaded: the state a driver upgrade leaves
    assert nv.kernel_module_problems("535.261.03", "535.261.03", "535.216.03") == [
        "the loaded nvidia kernel module is 535.216.03, the pin is 535.261.03: reboot to load the pinned driver"
    ]


@pytest.mark.parametrize(
    ("actual", "pin", "ok"),
    [
        ("535.261.03", "535.261.03", True),
        ("535.261.03", "535.261.3", False),
        ("535.261.03", "535", True),
        ("550.127.05", "535", False),
        (None, "535", False),
        (None, "", True),
        ("5350.1", "535", False),
    ],
)
def test_version_matches(actual: str | None, pin: str, ok: bool) -> None:
    assert nv.version_matches(actual, pin) is ok


def test_pci_key() -> None:
    assert nv.pci_key("00000000:3B:00.0") == nv.pci_key("PCI:0000:3b:00") == "0000:3b:00"
    assert nv.pci_key("0001:03:00") == "0001:03:00"
    assert nv.pci_key("garbage") is None
    assert nv.pci_key(None) is None


# --- never a traceback ------------------------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=4096))
def test_arbitrary_bytes_give_a_report_or_an_smi_error(blob: bytes) -> None:
    try:
        result = nv.parse_smi_xml(blob)
    except nv.SmiError as exc:
        assert str(exc)
    else:
        nv.assess(result, nv.Policy(expected_count=8, driver_version="535"))
    assert nv.smi_failure(1, blob, blob)
    nv.parse_xid_log(blob.decode("utf-8", "replace"))
    nv.parse_dkms_status(blob.decode("utf-8", "replace"))


_TAGS = [
    "product_name",
    "uuid",
    "minor_number",
    "persistence_mode",
    "pci/pci_bus_id",
    "mig_mode/current_mig",
    "mig_mode/pending_mig",
    "ecc_errors/volatile/dram_uncorrectable",
    "ecc_errors/volatile/double_bit/total",
    "remapped_rows/remapped_row_pending",
    "retired_pages/pending_retirement",
    "temperature/gpu_temp",
    "clocks_event_reasons/clocks_event_reason_hw_slowdown",
    "clocks_throttle_reasons/clocks_throttle_reason_gpu_idle",
    "pci/pci_gpu_link_info/pcie_gen/current_link_gen",
    "pci/pci_gpu_link_info/link_widths/max_link_width",
    "gpu_reset_status/reset_required",
]
_TEXT = st.one_of(
    st.sampled_from(["", "N/A", "Yes", "No", "Enabled", "Disabled", "Active", "16x", "92 C", "-3", "GPU is lost"]),
    st.text(alphabet=st.characters(blacklist_categories=("Cs", "Cc")), max_size=20),
)


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _nest(path: str, text: str) -> str:
    parts = path.split("/")
    return "".join(f"<{p}>" for p in parts) + _escape(text) + "".join(f"</{p}>" for p in reversed(parts))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.dictionaries(st.sampled_from(_TAGS), _TEXT, max_size=len(_TAGS)), max_size=4), _TEXT)
def test_any_field_values_give_a_verdict(gpus: list[dict[str, str]], driver: str) -> None:
    body = "".join("<gpu>" + "".join(_nest(k, v) for k, v in fields.items()) + "</gpu>" for fields in gpus)
    document = f"<nvidia_smi_log><driver_version>{_escape(driver)}</driver_version>{body}</nvidia_smi_log>"
    result = nv.assess(
        nv.parse_smi_xml(document), nv.Policy(expected_count=2, driver_version="535", mig_layouts={"0": "x"})
    )
    assert result["gpu_count"] == len(gpus)
    assert isinstance(result["healthy"], bool)
