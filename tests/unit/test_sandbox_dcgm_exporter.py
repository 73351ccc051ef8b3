"""The sandbox's stand-in DCGM exporter (gpuinfra/sandbox/gpus/dcgm_exporter.py): the exporter's format and labels,
made from the emulated GPUs' answers, the kernel log's XIDs since the GPU state was set, and the job mapping."""

from __future__ import annotations

import importlib.util
import os
import time
from pathlib import Path
from types import ModuleType

import pytest

from gpuinfra.sandbox.spec import EMULATED_GPUS

COUNTERS = """# comment
DCGM_FI_DEV_GPU_TEMP, gauge, GPU temperature (in C).
DCGM_FI_DEV_XID_ERRORS, gauge, Value of the last XID error encountered.
DCGM_FI_DEV_ROW_REMAP_PENDING, gauge, Whether remapping of rows is pending.
DCGM_FI_DEV_UNKNOWN_TO_IT, gauge, A field the stand-in cannot answer.
"""


@pytest.fixture
def exporter(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    spec = importlib.util.spec_from_file_location("dcgm_exporter", EMULATED_GPUS / "dcgm_exporter.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    library = tmp_path / "libnvidia-ml.so.1"
    library.touch()
    monkeypatch.setattr(module, "STATE", str(tmp_path / "gpu-state"))
    monkeypatch.setattr(module, "KERNEL_LOG", str(tmp_path / "kern.log"))
    monkeypatch.setattr(module, "NVML", (str(library),))
    (tmp_path / "counters.csv").write_text(COUNTERS)
    (tmp_path / "jobs").mkdir()
    return module


def series(text: str, name: str) -> dict[str, str]:
    """The samples of one counter: labels -> value."""
    out = {}
    for line in text.splitlines():
        if line.startswith(name + "{"):
            labels, _, value = line[len(name) :].rpartition(" ")
            out[labels] = value
    return out


def test_healthy_gpus_in_the_exporters_format(exporter: ModuleType, tmp_path: Path) -> None:
    text = exporter.metrics(exporter.counters(str(tmp_path / "counters.csv")), str(tmp_path / "jobs"))
    temps = series(text, "DCGM_FI_DEV_GPU_TEMP")
    assert len(temps) == 2 and set(temps.values()) == {"32"}, temps
    first = next(iter(temps))
    host = os.uname().nodename
    assert first == (
        '{gpu="0",UUID="GPU-5b1e0c4a-8f27-4d3b-9a61-2c7e3f9d0b14",pci_bus_id="00000000:18:00.0",device="nvidia0",'
        f'modelName="NVIDIA L4",Hostname="{host}"}}'
    )
    assert set(series(text, "DCGM_FI_DEV_XID_ERRORS").values()) == {"0"}
    assert set(series(text, "DCGM_FI_DEV_ROW_REMAP_PENDING").values()) == {"0"}
    assert "# TYPE DCGM_FI_DEV_GPU_TEMP gauge" in text and "UNKNOWN_TO_IT" not in text


def test_an_xid_since_the_state_was_set_on_its_gpu_with_the_jobs_that_hold_it(
    exporter: ModuleType, tmp_path: Path
) -> None:
    (tmp_path / "gpu-state").write_text("healthy\n")
    os.utime(tmp_path / "gpu-state", (time.time() - 60, time.time() - 60))
    old = time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(time.time() - 3600))
    now = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    (tmp_path / "kern.log").write_text(
        f"{old} gpu02 kernel: NVRM: Xid (PCI:0000:18:00): 79, pid=1, name=x, GPU has fallen off the bus.\n"
        f"{now} gpu02 kernel: NVRM: Xid (PCI:0000:2a:00): 31, pid=2, name=x, MMU Fault\n"
        f"{now} gpu02 kernel: NVRM: Xid (PCI:0000:2a:00): 13, pid=2, name=x, Graphics Exception\n"
    )
    (tmp_path / "jobs" / "1").write_text("41\n42\n")
    text = exporter.metrics(exporter.counters(str(tmp_path / "counters.csv")), str(tmp_path / "jobs"))
    xids = {labels.split(",")[0] + labels.rpartition(",")[2]: value
            for labels, value in series(text, "DCGM_FI_DEV_XID_ERRORS").items()}  # fmt: skip
    # GPU 0's XID 79 came before the state was set (the driver loaded since); GPU 1's last is 13, one series per job.
    assert xids == {'{gpu="0"Hostname="' + os.uname().nodename + '"}': "0",
                    '{gpu="1"hpc_job="41"}': "13", '{gpu="1"hpc_job="42"}': "13"}  # fmt: skip


def test_a_state_with_a_gpu_gone_and_no_driver(
    exporter: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "gpu-state").write_text("row-remap-pending\n")
    wanted = exporter.counters(str(tmp_path / "counters.csv"))
    assert list(series(exporter.metrics(wanted, ""), "DCGM_FI_DEV_ROW_REMAP_PENDING").values()) == ["1", "0"]
    (tmp_path / "gpu-state").write_text("gpu-missing\n")
    assert len(series(exporter.metrics(wanted, ""), "DCGM_FI_DEV_GPU_TEMP")) == 1
    monkeypatch.setattr(exporter, "NVML", (str(tmp_path / "none"),))
    assert exporter.metrics(wanted, "") == ""
