"""plugins/module_utils/verdict.py: the verdict on every fixture, clock event reasons, and any field values."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from smi_data import (
    A100_MIG,
    BUS,
    GPU3,
    GPU6,
    H100,
    H100_BAD,
    H100_NOPM,
    V100,
    V100_PENDING,
    data,
    smi_report,
    verdict,
    verdicts,
)

# --- verdicts on every fixture ----------------------------------------------------------------------------------


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


def test_three_verdicts() -> None:
    """A check that could not look makes the verdict unknown only while nothing is found wrong."""
    blind = ["cannot read the kernel log, XIDs are unchecked (kern.log: No such file or directory)"]
    healthy = verdict(H100, expected_count=8)
    assert (healthy["verdict"], healthy["healthy"], healthy["unknown"]) == ("healthy", True, [])
    unknown = verdicts.assess(smi_report.parse_smi_xml(data(H100)), verdicts.Policy(expected_count=8), unknown=blind)
    assert (unknown["verdict"], unknown["healthy"], unknown["problems"], unknown["unknown"]) == (
        "unknown",
        False,
        [],
        blind,
    )
    assert verdicts.failure_message(unknown) == f"GPU node health unknown: a check could not look: {blind[0]}"
    found = verdicts.assess(smi_report.parse_smi_xml(data(H100_BAD)), verdicts.Policy(expected_count=8), unknown=blind)
    assert (found["verdict"], found["unknown"]) == ("unhealthy", blind) and found["problems"]


def test_verdict_shape() -> None:
    result = verdict(H100_BAD, expected_count=8, driver_version="550.127.05")
    assert set(result) == {
        "verdict",
        "healthy",
        "unknown",
        "gpu_count",
        "expected_count",
        "driver_version",
        "driver_pin",
        "gpus",
        "node_problems",
        "problems",
        "xid_reports",
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
    message = verdicts.failure_message(verdict(H100_BAD))
    assert message.startswith("GPU node unhealthy (6 problems): ")
    assert message.endswith("; ".join(UNHEALTHY_H100))


def test_mig_mode_change_pending() -> None:
    text = data(A100_MIG).replace(b"<pending_mig>Enabled</pending_mig>", b"<pending_mig>Disabled</pending_mig>", 1)
    result = verdicts.assess(smi_report.parse_smi_xml(text), verdicts.Policy(mig_layouts={"0": "halves", "1": "mixed"}))
    assert result["problems"] == ["GPU 0 (00000000:07:00.0): MIG mode change to Disabled is pending a GPU reset"]


def test_mig_enabled_without_devices() -> None:
    text = data(A100_MIG).replace(b"<current_mig>Disabled</current_mig>", b"<current_mig>Enabled</current_mig>", 1)
    text = text.replace(b"<pending_mig>Disabled</pending_mig>", b"<pending_mig>Enabled</pending_mig>", 1)
    result = verdicts.assess(
        smi_report.parse_smi_xml(text), verdicts.Policy(mig_layouts={"0": "a", "1": "b", "2": "c"})
    )
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
    result = verdicts.assess(smi_report.parse_smi_xml(text), verdicts.Policy())
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
    gpu = smi_report.parse_smi_xml(_one_gpu(f"<{prefix}s>{body}</{prefix}s>")).gpus[0]
    assert (gpu.clock_reasons, gpu.clock_reasons_source) == ([active], f"{prefix}s")
    expected = [f"GPU 0 (00000000:01:00.0): {problem}"] if problem else []
    report = smi_report.parse_smi_xml(_one_gpu(f"<{prefix}s>{body}</{prefix}s>"))
    assert verdicts.assess(report, verdicts.Policy())["problems"] == expected


def test_renaming_event_reasons_to_throttle_reasons_keeps_the_verdict() -> None:
    renamed = data(H100_BAD).replace(b"clocks_event_reason", b"clocks_throttle_reason")
    assert (
        verdicts.assess(smi_report.parse_smi_xml(renamed), verdicts.Policy(expected_count=8))["problems"]
        == UNHEALTHY_H100
    )


def test_idle_gpu_below_max_generation_is_healthy_but_narrow_link_is_not() -> None:
    text = data(H100).replace(
        b"<current_link_width>16x</current_link_width>", b"<current_link_width>4x</current_link_width>"
    )
    problems = verdicts.assess(smi_report.parse_smi_xml(text), verdicts.Policy())["problems"]
    assert len(problems) == 8  # width on every GPU; GPUs 2 and 7 sit at Gen1 but are idle
    assert all("PCIe link width x4 is below its maximum x16" in p for p in problems)


# --- never a traceback ------------------------------------------------------------------------------------------


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
    result = verdicts.assess(
        smi_report.parse_smi_xml(document),
        verdicts.Policy(expected_count=2, driver_version="535", mig_layouts={"0": "x"}),
    )
    assert result["gpu_count"] == len(gpus)
    assert isinstance(result["healthy"], bool)
