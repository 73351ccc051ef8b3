"""The sandbox's emulated GPUs answer with the H100 recording, changed only where an L4 in its own slot or the fault
differs (gpuinfra/sandbox/answers.py)."""

from __future__ import annotations

import dataclasses

import pytest
from smi_data import DATA, smi_report

from gpuinfra import catalog
from gpuinfra.sandbox import answers

RECORDED = smi_report.parse_smi_xml((DATA / "h100-recorded" / "nvidia-smi-q-x.xml").read_bytes()).gpus[0]
# What an emulated GPU may tell apart from the recorded one: its identity and its slot.
IDENTITY = {"index", "name", "uuid", "pci_bus_id", "pci_device_id", "minor_number"}


def test_the_committed_answers_are_made_from_the_recording() -> None:
    """Hand edits to gpus/*.xml fail here: `python -m gpuinfra.sandbox.answers` writes them from the recording."""
    made = answers.make(answers.RECORDING.read_text(encoding="utf-8"))
    assert made == {state: (answers.FOLDER / f"{state}.xml").read_text(encoding="utf-8") for state in answers.STATES}
    assert sorted(made) == sorted(path.stem for path in answers.FOLDER.glob("*.xml"))


def _differences(gpu: object) -> set[str]:
    fields = dataclasses.asdict(gpu)  # type: ignore[call-overload]
    recorded = dataclasses.asdict(RECORDED)
    return {name for name in fields if fields[name] != recorded[name]}


@pytest.mark.parametrize("state", list(answers.STATES))
def test_each_state_is_the_recorded_gpu_as_an_l4_with_only_its_fault_changed(state: str) -> None:
    report = smi_report.parse_smi_xml((answers.FOLDER / f"{state}.xml").read_bytes())
    assert report.dtd == "nvsmi_device_v13.dtd"
    ids = [gpu.pci_device_id for gpu in report.gpus]
    spec = catalog.lookup("L4")
    assert spec is not None and set(ids) <= set(spec.pci_ids)
    assert [gpu.pci_bus_id for gpu in report.gpus] == ["00000000:18:00.0", "00000000:2A:00.0"][: len(ids)]
    faults = {gpu.index: _differences(gpu) - IDENTITY for gpu in report.gpus}
    expected = {
        "healthy": {0: set(), 1: set()},
        "row-remap-pending": {0: {"remapped_rows"}, 1: set()},
        "gpu-missing": {0: set()},
        "xid79": {0: set()},
    }[state]
    assert faults == expected
