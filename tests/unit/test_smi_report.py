"""plugins/module_utils/smi_report.py: `nvidia-smi -q -x` on recorded and hand-written outputs, and its failures."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from smi_data import (
    A100_MIG,
    BUS,
    DATA,
    H100,
    H100_BAD,
    V100_PENDING,
    data,
    dkms,
    report,
    smi_report,
    verdicts,
    xid_log,
)

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
    r = smi_report.parse_smi_xml((RECORDED / "nvidia-smi-q-x.xml").read_bytes())
    assert (r.driver_version, r.attached_gpus, r.dtd) == (nvml["driver_version"], 1, "nvsmi_device_v13.dtd")
    [gpu] = r.gpus
    [expected] = nvml["gpus"]
    assert {f: getattr(gpu, f) for f in NVML_FIELDS} == {f: expected[f] for f in NVML_FIELDS}
    assert gpu.remapped_rows == expected["remapped"]
    assert gpu.uuid in (RECORDED / "nvidia-smi-L.txt").read_text()
    verdict = verdicts.assess(
        r, verdicts.Policy(expected_count=1, expected_pci_ids=("0x2330",), driver_version="580.159.04"), []
    )
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
    policy = verdicts.Policy(expected_count=1, driver_version="580.159.04", fabric_manager=nvswitch)
    problems = verdicts.assess(smi_report.parse_smi_xml(text.encode()), policy, [])["problems"]
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
    with pytest.raises(smi_report.SmiError):
        smi_report.parse_smi_xml(text)
    assert smi_report.smi_failure(rc, text, b"") == problem
    result = verdicts.assess(None, verdicts.Policy(expected_count=8), [], [problem])
    assert (result["healthy"], result["gpus"], result["problems"]) == (False, [], [f"node: {problem}"])


def test_other_failures() -> None:
    assert smi_report.smi_failure(124, "", "") == "nvidia-smi did not answer in time: a GPU or the driver is hung"
    assert smi_report.smi_failure(
        15, "Unable to determine the device handle for GPU0000:3B:00.0: GPU is lost.", ""
    ) == ("nvidia-smi reports a GPU that has fallen off the bus (GPU is lost): the node needs a power cycle")
    assert (
        smi_report.smi_failure(255, "", "Segmentation fault\n")
        == "nvidia-smi failed (exit code 255): Segmentation fault"
    )


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
    with pytest.raises(smi_report.SmiError, match=message.replace("(", r"\(").replace(")", r"\)")):
        smi_report.parse_smi_xml(text)


def test_pci_key() -> None:
    assert smi_report.pci_key("00000000:3B:00.0") == smi_report.pci_key("PCI:0000:3b:00") == "0000:3b:00"
    assert smi_report.pci_key("0001:03:00") == "0001:03:00"
    assert smi_report.pci_key("garbage") is None
    assert smi_report.pci_key(None) is None


# --- never a traceback ------------------------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=4096))
def test_arbitrary_bytes_give_a_report_or_an_smi_error(blob: bytes) -> None:
    try:
        result = smi_report.parse_smi_xml(blob)
    except smi_report.SmiError as exc:
        assert str(exc)
    else:
        verdicts.assess(result, verdicts.Policy(expected_count=8, driver_version="535"))
    assert smi_report.smi_failure(1, blob, blob)
    xid_log.parse_xid_log(blob.decode("utf-8", "replace"))
    dkms.parse_dkms_status(blob.decode("utf-8", "replace"))
