"""What the tests of the health parser (plugins/module_utils: smi_report, xid_log, dkms, verdict) share: the
modules, loaded as the gpu_health module and the health program import them, and the recorded and hand-written
outputs under data/nvidia-smi."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from file_module import module_util

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "unit" / "data" / "nvidia-smi"


smi_report = module_util("smi_report")
xid_log = module_util("xid_log")
dkms = module_util("dkms")
verdicts = module_util("verdict")

H100 = "h100-hgx-8x-healthy.xml"
H100_BAD = "h100-hgx-8x-unhealthy.xml"
H100_NOPM = "h100-hgx-8x-persistence-off.xml"
A100_MIG = "a100-sxm4-4x-mig.xml"
V100 = "v100-sxm2-2x-r460-healthy.xml"
V100_PENDING = "v100-sxm2-2x-r460-retired-pages-pending.xml"


BUS = dict(enumerate(["18", "2A", "3A", "5D", "9A", "AB", "BA", "DB"]))  # the H100 fixtures' PCI buses
GPU3 = "GPU 3 (00000000:5D:00.0)"
GPU6 = "GPU 6 (00000000:BA:00.0)"


def data(name: str) -> bytes:
    return (DATA / name).read_bytes()


def report(name: str) -> Any:
    return smi_report.parse_smi_xml(data(name))


def verdict(name: str, kernel_log: str | None = None, **policy: Any) -> dict[str, Any]:
    events = xid_log.parse_xid_log((DATA / kernel_log).read_text()) if kernel_log else []
    result: dict[str, Any] = verdicts.assess(report(name), verdicts.Policy(**policy), events)
    return result
