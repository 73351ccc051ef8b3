"""gpuinfra-active-checks (roles/gpu_health/files/gpuinfra_active_checks.py) run as the admission job runs it: a real
process, with the collection's module_utils as its library and the sandbox's stand-in tools (gpuinfra/sandbox/gpus,
synthetic answers in each tool's format) or doubles that hang, are missing or print what no tool prints."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from file_module import node_program

ROOT = Path(__file__).resolve().parents[2]
PROGRAM = "roles/gpu_health/files/gpuinfra_active_checks.py"
GPUS = ROOT / "gpuinfra" / "sandbox" / "gpus"
CHECKS = GPUS / "checks"
ALL = ["dcgm_diag", "nccl_all_reduce", "host_bandwidth"]


class Node:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.bin = root / "bin"
        self.bin.mkdir()
        (root / "textfile").mkdir()
        self.tools = {tool: str(GPUS / tool) for tool in ("dcgmi", "all_reduce_perf", "nvbandwidth")}

    def tool(self, name: str, script: str) -> None:
        """Replace a tool with a shell script."""
        path = self.bin / name
        path.write_text(f"#!/bin/sh\n{script}\n")
        path.chmod(0o755)
        self.tools[name] = str(path)

    def answer(self, name: str, fixture: str, rc: int = 0) -> None:
        self.tool(name, f"cat '{CHECKS / fixture}'; exit {rc}")

    def run(self, checks: list[str] = ALL, gpus: int = 2, timeout: int = 30) -> tuple[int, dict[str, Any]]:
        config = {
            "gpus": gpus,
            "textfile": str(self.root / "textfile" / "gpuinfra_health.prom"),
            "active": {
                "checks": checks,
                "dcgm_level": 2,
                "tools": self.tools,
                "nccl_floor": {"gbps": 7.8, "of": "L4 at PCIe Gen4"},
                "host_floor": {"gbps": 18.9, "of": "L4 at PCIe Gen4"},
                "timeout": timeout,
            },
        }
        (self.root / "health.json").write_text(json.dumps(config))
        command = node_program(self.root, PROGRAM, ["active_checks.py"])
        command += ["--config", str(self.root / "health.json"), "--result", str(self.root / "result.json"), "--json"]
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=120, env={**os.environ, "PATH": "/usr/bin:/bin"}
        )
        assert done.returncode in (0, 1, 3), done.stderr
        result: dict[str, Any] = json.loads(done.stdout)
        assert json.loads((self.root / "result.json").read_text()) == result
        return done.returncode, result

    @property
    def metrics(self) -> list[str]:
        return (self.root / "textfile" / "gpuinfra_active_checks.prom").read_text().splitlines()


@pytest.fixture
def node(tmp_path: Path) -> Node:
    return Node(tmp_path)


def test_the_sandbox_stand_ins_pass_every_check(node: Node) -> None:
    code, result = node.run()
    assert (code, result["verdict"]) == (0, "pass"), result
    assert [c["check"] for c in result["checks"]] == ["dcgm_diag", "nccl_all_reduce", "nvbandwidth"]
    assert result["reason"].startswith("gpuinfra admission: passed dcgm diag -r 2 passed"), result["reason"]
    assert 'gpuinfra_active_check_passed{check="nccl_all_reduce"} 1' in node.metrics


@pytest.mark.parametrize(
    ("tool", "fixture", "rc", "reason"),
    [
        ("dcgmi", "dcgm-diag-r2-fail.json", 1, "gpuinfra admission: dcgm diag -r 2 failed memory on GPU 1"),
        (
            "all_reduce_perf",
            "nccl-all-reduce-fail.txt",
            0,
            "gpuinfra admission: nccl all_reduce busbw 4.6 GB/s below the 7.8 GB/s floor of L4 at PCIe Gen4",
        ),
        ("nvbandwidth", "nvbandwidth-fail.txt", 0, "gpuinfra admission: nvbandwidth GPU 1"),
    ],
)
def test_a_failing_check_names_itself_and_its_figure(node: Node, tool: str, fixture: str, rc: int, reason: str) -> None:
    node.answer(tool, fixture, rc)
    code, result = node.run()
    assert (code, result["verdict"]) == (1, "fail"), result
    assert result["reason"].startswith(reason), result["reason"]
    assert len(result["reason"]) <= 240


def test_a_failure_outweighs_a_check_that_could_not_judge(node: Node) -> None:
    node.tools["dcgmi"] = str(node.bin / "absent")
    node.answer("nvbandwidth", "nvbandwidth-fail.txt")
    code, result = node.run()
    assert (code, result["verdict"]) == (1, "fail")
    assert [c["verdict"] for c in result["checks"]] == ["unknown", "pass", "fail"]


@pytest.mark.parametrize(
    ("script", "why"),
    [
        (None, "is not installed"),
        ("sleep 30", "dcgmi did not finish within 2 s"),
        ("echo 'Error: unable to connect to host engine'; exit 255", "could not be judged (exit status 255)"),
    ],
)
def test_a_tool_that_cannot_answer_is_unknown_never_a_pass(node: Node, script: str | None, why: str) -> None:
    if script is None:
        node.tools["dcgmi"] = str(node.bin / "dcgmi")
    else:
        node.tool("dcgmi", script)
    code, result = node.run(["dcgm_diag"], timeout=2)
    assert (code, result["verdict"]) == (3, "unknown"), result
    assert why in result["reason"], result["reason"]
    assert 'gpuinfra_active_check_unknown{check="dcgm_diag"} 1' in node.metrics


def test_one_gpu_has_no_all_reduce_to_judge(node: Node) -> None:
    node.answer("all_reduce_perf", "nccl-all-reduce-fail.txt")  # never run
    node.tools["nvbandwidth"] = str(node.bin / "absent")
    code, result = node.run(["nccl_all_reduce"], gpus=1)
    assert (code, result["checks"]) == (0, [])


def test_a_tool_printing_without_end_is_cut_and_unknown(node: Node) -> None:
    node.tool("all_reduce_perf", "yes '# nThread 1 nGpus 2' | head -c 6000000")
    code, result = node.run(["nccl_all_reduce"])
    assert (code, result["verdict"]) == (3, "unknown")
    assert "more than the 4194304 a real run prints" in result["reason"], result["reason"]


def test_settings_it_cannot_read_stop_it_with_exit_2(node: Node, tmp_path: Path) -> None:
    (tmp_path / "health.json").write_text(json.dumps({"gpus": 2, "active": {"checks": ["gpu_burn"]}}))
    command = node_program(tmp_path, PROGRAM, ["active_checks.py"])
    done = subprocess.run([*command, "--config", str(tmp_path / "health.json")], capture_output=True, text=True)
    assert done.returncode == 2, done.stderr
    assert "names checks this program does not know: gpu_burn" in done.stderr
