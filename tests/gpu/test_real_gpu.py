"""The health parser and the gpu_health module against this machine's real GPUs (read-only)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from file_module import module_util, node_program

from gpuinfra.model.policy import CHECK_TOOLS, DEFAULT_TOOL_PATHS

smi_report = module_util("smi_report")
verdicts = module_util("verdict")

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]


def smi(*args: str) -> subprocess.CompletedProcess[str]:
    """Read-only nvidia-smi queries."""
    return subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, timeout=120, check=False)


QUERY = [
    "index",
    "uuid",
    "pci.bus_id",
    "persistence_mode",
    "temperature.gpu",
    "pcie.link.gen.max",
    "pcie.link.width.max",
    "pcie.link.width.current",
    "mig.mode.current",
    "mig.mode.pending",
    "ecc.errors.uncorrected.volatile.total",
]


def _known(value: str) -> str | None:
    return None if value.strip().strip("[]") in {"N/A", "Not Supported", "Unknown Error"} else value.strip()


def test_parser_lists_every_gpu(smi_xml: str, gpu_listing: list[tuple[int, str, str]]) -> None:
    report = smi_report.parse_smi_xml(smi_xml)
    assert [(g.index, g.name, g.uuid) for g in report.gpus] == gpu_listing
    assert report.attached_gpus == len(gpu_listing)
    assert report.dtd and report.dtd.startswith("nvsmi_device")
    driver = smi("--query-gpu=driver_version", "--format=csv,noheader").stdout.split()
    assert report.driver_version == driver[0]


def test_parser_agrees_with_query_gpu(smi_xml: str, gpu_listing: list[tuple[int, str, str]]) -> None:
    out = smi(f"--query-gpu={','.join(QUERY)}", "--format=csv,noheader,nounits")
    assert out.returncode == 0, out.stderr
    rows = [dict(zip(QUERY, (c.strip() for c in line.split(",")), strict=True)) for line in out.stdout.splitlines()]
    report = smi_report.parse_smi_xml(smi_xml)
    for gpu, row in zip(report.gpus, rows, strict=True):
        assert (str(gpu.index), gpu.uuid) == (row["index"], row["uuid"])
        assert smi_report.pci_key(gpu.pci_bus_id) == smi_report.pci_key(row["pci.bus_id"])
        assert gpu.persistence_mode == row["persistence_mode"]
        if _known(row["temperature.gpu"]):
            assert gpu.temperature_c is not None
            assert abs(gpu.temperature_c - int(row["temperature.gpu"])) <= 3  # read a moment apart
        if _known(row["pcie.link.gen.max"]):
            assert gpu.pcie_gen_max == int(row["pcie.link.gen.max"])
            assert gpu.pcie_gen_current is not None and 1 <= gpu.pcie_gen_current <= gpu.pcie_gen_max
        if _known(row["pcie.link.width.max"]):
            assert (gpu.pcie_width_max, gpu.pcie_width_current) == (
                int(row["pcie.link.width.max"]),
                int(row["pcie.link.width.current"]),
            )
        assert (gpu.mig_current, gpu.mig_pending) == (_known(row["mig.mode.current"]), _known(row["mig.mode.pending"]))
        if _known(row["ecc.errors.uncorrected.volatile.total"]):
            assert gpu.ecc_volatile_uncorrectable == int(row["ecc.errors.uncorrected.volatile.total"])


def test_every_gpu_field_the_verdict_needs_is_read(smi_xml: str) -> None:
    report = smi_report.parse_smi_xml(smi_xml)
    for gpu in report.gpus:
        missing = [
            name
            for name in ("name", "uuid", "pci_bus_id", "persistence_mode", "temperature_c", "clock_reasons_source")
            if getattr(gpu, name) is None
        ]
        assert missing == [], f"GPU {gpu.index}: nvidia-smi {report.driver_version} output not understood: {missing}"
    verdict = verdicts.assess(report, verdicts.Policy(check_mig=False))
    print(json.dumps(verdict, indent=2))  # the verdict of this machine, for the log


def test_module_through_ansible(tmp_path: Path, gpu_listing: list[tuple[int, str, str]]) -> None:
    """The module as Ansible runs it, reporting only: its verdict depends on this machine's state."""
    collections = tmp_path / "collections" / "ansible_collections" / "gpuinfra"
    collections.mkdir(parents=True)
    (collections / "cluster").symlink_to(ROOT)
    env = {
        **os.environ,
        "ANSIBLE_COLLECTIONS_PATH": str(tmp_path / "collections"),
        "ANSIBLE_LOAD_CALLBACK_PLUGINS": "1",
        "ANSIBLE_STDOUT_CALLBACK": "json",
        "ANSIBLE_LOCAL_TEMP": str(tmp_path / "ansible-local"),
        "ANSIBLE_HOME": str(tmp_path / "ansible-home"),
    }
    args = {"fail_on_unhealthy": False, "check_mig": False, "check_dkms": False, "check_kernel_module": False}
    proc = subprocess.run(
        [
            str(Path(sys.executable).parent / "ansible"),
            "localhost",
            "-m",
            "gpuinfra.cluster.gpu_health",
            "-a",
            json.dumps(args),
        ],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(proc.stdout)["plays"][0]["tasks"][0]["hosts"]["localhost"]
    assert (result["changed"], result["nvidia_smi_rc"], result["gpu_count"]) == (False, 0, len(gpu_listing))
    assert [g["uuid"] for g in result["gpus"]] == [uuid for _, _, uuid in gpu_listing]
    print(json.dumps({k: result[k] for k in ("healthy", "problems", "dtd", "kernel_log_source")}, indent=2))


def test_the_admission_checks_read_the_real_tools(tmp_path: Path, gpu_listing: list[tuple[int, str, str]]) -> None:
    """The admission gate's program with the tools gpu_check_tools installs (DCGM's `dcgmi diag` at level 2, the
    gate's default, nccl-tests' `all_reduce_perf`, `nvbandwidth`), each on PATH or at its default path, every floor
    at zero: each installed tool's real output is read, and the checks pass with their figures. The diagnostic
    changes no GPU setting."""
    tools = {tool: shutil.which(tool) or path for tool, path in DEFAULT_TOOL_PATHS.items()}
    checks = [check for check, tool in CHECK_TOOLS.items() if os.access(tools[tool], os.X_OK)]
    assert checks, f"none of {', '.join(tools)} is installed here: converge the node first (gpu_check_tools)"
    anything = {"gbps": 0.0, "of": "any GPU"}
    config = {
        "gpus": len(gpu_listing),
        "textfile": str(tmp_path / "gpuinfra_health.prom"),
        "active": {"checks": checks, "dcgm_level": 2, "tools": tools, "timeout": 900,
                   "nccl_floor": anything, "host_floor": anything},
    }  # fmt: skip
    (tmp_path / "health.json").write_text(json.dumps(config))
    command = node_program(tmp_path, "roles/gpu_health/files/gpuinfra_active_checks.py", ["active_checks.py"])
    done = subprocess.run(
        [*command, "--config", str(tmp_path / "health.json"), "--result", str(tmp_path / "result.json"), "--json"],
        capture_output=True, text=True, timeout=3600, check=False,
    )  # fmt: skip
    result = json.loads(done.stdout)
    assert (done.returncode, result["verdict"]) == (0, "pass"), result
    for check in result["checks"]:
        assert check["verdict"] == "pass" and check["figures"], check
