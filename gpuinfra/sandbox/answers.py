"""The sandbox's emulated GPUs' nvidia-smi answers (gpus/STATE.xml), made from the one output recorded on a real GPU.

RECORDING is `nvidia-smi -q -x` of an H100 (driver 580.159.04, DTD v13; tests/unit/data/nvidia-smi/README.md). Each
emulated GPU is its GPU element given an L4's identity (the sandbox clusters' model) and a PCI slot of its own; a
fault changes only what the fault changes. The stand-in nvidia-smi (gpus/nvidia_smi.py, run as gpus/nvidia-smi)
answers with the state a node is set to and the version of the driver installed on the node.

    python -m gpuinfra.sandbox.answers   # writes gpus/*.xml again; tests/unit/test_sandbox_answers.py checks them
"""

from __future__ import annotations

import copy
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RECORDING = ROOT / "tests" / "unit" / "data" / "nvidia-smi" / "h100-recorded" / "nvidia-smi-q-x.xml"
FOLDER = Path(__file__).resolve().parent / "gpus"

STATES = {
    "healthy": "Both GPUs healthy.",
    "row-remap-pending": "GPU 0: one uncorrectable error, its row remapping pending a GPU reset.",
    "gpu-missing": "GPU 1 (00000000:2A:00.0) is missing: the driver enumerates one GPU.",
    "xid79": "GPU 1 (00000000:2A:00.0) has fallen off the bus (xid79.kern.log): the driver enumerates one GPU.",
}
# The L4's identity in place of the H100's: the catalog knows PCI device 27B8 as the L4. Part numbers the
# recording has for the H100 are left unknown (N/A), as nvidia-smi writes what a board does not report.
L4 = {
    "product_name": "NVIDIA L4",
    "product_architecture": "Ada Lovelace",
    "pci/pci_device_id": "27B810DE",
    "board_part_number": "N/A",
    "gpu_part_number": "N/A",
    "pdi": "N/A",
}


@dataclass(frozen=True)
class Slot:
    """Where one emulated GPU sits, and what tells it apart from the other."""

    bus: str
    uuid: str
    serial: str


SLOTS = (
    Slot("18", "GPU-5b1e0c4a-8f27-4d3b-9a61-2c7e3f9d0b14", "1654023016421"),
    Slot("2A", "GPU-a93f6d20-1c85-47e2-b0d9-6e4f8a2c17b3", "1654023016458"),
)


def _set(element: ET.Element, path: str, value: str) -> None:
    found = element.find(path)
    if found is None:
        raise ValueError(f"the recording has no {path}")
    found.text = value


def _emulated(recorded: ET.Element, index: int, slot: Slot) -> ET.Element:
    gpu = copy.deepcopy(recorded)
    bus_id = f"00000000:{slot.bus}:00.0"
    gpu.set("id", bus_id)
    for path, value in {
        **L4,
        "uuid": slot.uuid,
        "serial": slot.serial,
        "minor_number": str(index),
        "board_id": f"0x{slot.bus.lower()}00",
        "platformInfo/module_id": str(index + 1),
        "pci/pci_bus": slot.bus,
        "pci/pci_device": "00",
        "pci/pci_bus_id": bus_id,
    }.items():
        _set(gpu, path, value)
    return gpu


def make(recording: str) -> dict[str, str]:
    """Each state's answer, as the text of gpus/STATE.xml."""
    root = ET.fromstring(recording)
    recorded = root.find("gpu")
    if recorded is None:
        raise ValueError("the recording lists no GPU")
    prolog = recording[: recording.index("<nvidia_smi_log>")]
    answers = {}
    for state, says in STATES.items():
        log = copy.deepcopy(root)
        log.remove(log.find("gpu"))  # type: ignore[arg-type]  # found above
        gpus = [_emulated(recorded, index, slot) for index, slot in enumerate(SLOTS)]
        if state == "row-remap-pending":
            _set(gpus[0], "remapped_rows/remapped_row_unc", "1")
            _set(gpus[0], "remapped_rows/remapped_row_pending", "Yes")
        if state in ("gpu-missing", "xid79"):
            gpus = gpus[:1]
        _set(log, "attached_gpus", str(len(gpus)))
        for gpu in gpus:
            gpu.tail = "\n\t"
        gpus[-1].tail = "\n"
        log.extend(gpus)
        comment = (
            "\n  The sandbox's emulated GPUs, made by gpuinfra/sandbox/answers.py from nvidia-smi -q -x recorded on an"
            "\n  H100 (tests/unit/data/nvidia-smi/h100-recorded/): each GPU is the recorded one with an L4's identity"
            f"\n  and a PCI slot of its own. The stand-in answers with the node's installed driver version.\n  {says}\n"
        )
        answers[state] = f"{prolog}<!--{comment}-->\n{ET.tostring(log, encoding='unicode')}\n"
    return answers


def main() -> None:
    for state, text in make(RECORDING.read_text(encoding="utf-8")).items():
        (FOLDER / f"{state}.xml").write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
