"""`gpuinfra health`: the sweep's verdict per node from a real run of playbooks/health.yml on this machine.

nvidia-smi is a script that prints a recorded fixture (tests/unit/data/nvidia-smi), so the module and its parser are
the real ones; the checks that read this machine's kernel, module and DKMS state are switched off.
"""

from __future__ import annotations

import argparse
import io
import sys
from pathlib import Path

import pytest

from gpuinfra.cli.health import _print_sweep, print_table
from gpuinfra.health_sweep import HEALTH_PLAYBOOK, JUDGED_STAT, NodeHealth, Sweep, fleet_view, verdicts
from gpuinfra.progress import Failure, HostStats
from gpuinfra.run import Outcome, RunOptions, RunResult, run_playbook

DATA = Path(__file__).parent / "data" / "nvidia-smi"


def smi(tmp_path: Path, fixture: str) -> str:
    tool = tmp_path / f"smi-{fixture}"
    tool.write_text(f"#!/bin/sh\ncat {DATA / fixture}\n")
    tool.chmod(0o755)
    return str(tool)


@pytest.mark.tools
def test_sweep_gives_one_verdict_per_node(tmp_path: Path, run_root: Path) -> None:
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    gpu_nodes = {
        "gpu01": {**local, "gpuinfra_gpu_count": 8, "gpu_health_nvidia_smi": smi(tmp_path, "h100-hgx-8x-healthy.xml")},
        "gpu02": {
            **local,
            "gpuinfra_gpu_count": 8,
            "gpu_health_nvidia_smi": smi(tmp_path, "h100-hgx-8x-unhealthy.xml"),
        },
        # Nothing listens on port 1: the SSH connection is refused at once.
        "gpu03": {"ansible_host": "127.0.0.1", "ansible_port": 1, "ansible_connection": "ssh"},
    }
    inventory = {
        "all": {
            "vars": {
                "gpu_health_check_kernel_module": False,
                "gpu_health_check_dkms": False,
                "gpu_health_check_xid": False,
            },
            "children": {"gpu_nodes": {"hosts": gpu_nodes}},
        }
    }
    nodes = list(gpu_nodes)
    result = run_playbook(inventory, RunOptions(playbook=HEALTH_PLAYBOOK), hosts=nodes)
    found = {h.node: h for h in verdicts(result, nodes)}
    assert found["gpu01"] == NodeHealth("gpu01", "healthy")
    assert found["gpu02"].status == "unhealthy"
    assert len(found["gpu02"].problems) > 1
    assert all(p.startswith(("GPU ", "node: ")) for p in found["gpu02"].problems), found["gpu02"].problems
    assert found["gpu03"].status == "unreachable"
    assert found["gpu02"].drain_reason.startswith("gpuinfra health: GPU ")
    assert found["gpu02"].drain_reason.endswith(f"(+{len(found['gpu02'].problems) - 1} more)")


def test_the_sweep_shows_what_each_node_decided() -> None:
    """A node no check could fully look at is `unknown`, with what could not be seen; an emulated node is shown with
    the verdict its own health program gave, and only one without the program as `emulated`."""
    unknown = Failure("gpu01", "Check the health", "GPU node health unknown", action="gpuinfra.cluster.gpu_health",
                      unknown=("cannot read the kernel log",))  # fmt: skip
    result = RunResult(
        outcome=Outcome.FAILED, status="failed", rc=2, playbook=Path(HEALTH_PLAYBOOK), check=False,
        hosts={"gpu01": HostStats(failed=1), "gpu02": HostStats(ok=3), "gpu03": HostStats(ok=2)},
        failures=[unknown], changes=[], errors=[], warnings=[], duration_s=1.0,
        artifacts={JUDGED_STAT: {"gpu02": "healthy"}},
    )  # fmt: skip
    found = verdicts(result, ["gpu01", "gpu02", "gpu03"], emulated={"gpu02", "gpu03"})
    assert found == [
        NodeHealth("gpu01", "unknown", ["could not look: cannot read the kernel log"]),
        NodeHealth("gpu02", "healthy"),
        NodeHealth("gpu03", "emulated", ["GPU device nodes without hardware (gpu.emulated): not checked"]),
    ]
    out = io.StringIO()
    _print_sweep(out, Sweep(found))
    assert out.getvalue().splitlines()[-1] == (
        "1 of 3 GPU node(s) healthy, 1 unknown (a check could not look), 1 emulated (not checked)"
    )


def test_the_sweep_shows_what_the_controller_holds_the_admission_and_the_breaker() -> None:
    """The gpu_admission role's report: gpu01 drained by its health check (the partition at its limit of 1), gpu02
    unhealthy yet in service (spared), gpu03 waiting for its admission, gpu04 with its last scheduled check; what is
    not the report's shape is left out."""
    report = {
        "nodes": {
            "gpu01": {"state": ["IDLE", "DRAIN"], "reason": "gpuinfra-health: xid 79 on GPU 1: reboot",
                      "partitions": ["vision", "gpuinfra"], "admission": "", "last": None},
            "gpu02": {"state": ["MIXED"], "reason": "", "partitions": ["vision"], "admission": "", "last": None},
            "gpu03": {"state": ["IDLE", "DRAIN"], "reason": "gpuinfra: admission", "partitions": ["vision"],
                      "admission": "waiting", "last": None},
            "gpu04": {"state": ["IDLE"], "reason": "", "partitions": ["vision"], "admission": "", "last": {
                "time": 1796630400.0, "verdict": "fail", "reason": "dcgm diag failed", "kind": "scheduled"}},
        },
        "breaker": [{"partition": "vision", "nodes": 4, "held": ["gpu01"], "limit": 1}, "junk"],
    }  # fmt: skip
    judged = [NodeHealth("gpu01", "unhealthy", ["GPU 1: XID 79"]), NodeHealth("gpu02", "unhealthy", ["GPU 0: hot"]),
              NodeHealth("gpu03", "healthy"), NodeHealth("gpu04", "healthy"),
              NodeHealth("gpu05", "healthy")]  # fmt: skip
    found, breakers = fleet_view(report, judged)
    assert [h.slurm.state if h.slurm else None for h in found] == [
        "drained",
        "in service",
        "drained",
        "in service",
        None,
    ]
    assert [h.slurm.spared for h in found if h.slurm] == [False, True, False, False]
    assert [b.as_dict() for b in breakers] == [
        {"partition": "vision", "nodes": 4, "held": ["gpu01"], "limit": 1, "at_limit": True}
    ]
    out = io.StringIO()
    _print_sweep(out, Sweep(found, breakers))
    text = out.getvalue()
    assert "gpu01  drained (gpuinfra-health: xid 79 on GPU 1: reboot)\n" in text
    assert "gpu02  in service; spared by the breaker: unhealthy, left in service\n" in text
    assert "gpu03  drained (gpuinfra: admission); admission: waiting for its active checks\n" in text
    assert "gpu04  in service; last scheduled check: fail at 2026-12-07 08:00 UTC (dcgm diag failed)\n" in text
    assert "breaker of partition vision: 1 of 4 node(s) drained by health checks (gpu01); limit 1, at its limit" in text
    assert Sweep(found, breakers).as_dict()["nodes"][1]["slurm"]["spared"] is True
    assert fleet_view("not a report", judged) == (judged, [])


def test_table_lists_every_problem_under_its_node() -> None:
    out = io.StringIO()
    print_table(
        out,
        [NodeHealth("gpu01", "healthy"), NodeHealth("gpu02", "unhealthy", ["GPU 0 (x): hot", "node: XID 79"])],
    )
    assert out.getvalue().splitlines() == [
        "NODE   STATUS       PROBLEMS",
        "gpu01  healthy      -",
        "gpu02  unhealthy    GPU 0 (x): hot",
        "                    node: XID 79",
    ]


def test_health_verb_is_registered() -> None:
    from gpuinfra.cli import build_parser

    args = build_parser().parse_args(["health", "cluster.yml", "--json", "--drain-unhealthy", "-e", "a=1"])
    assert isinstance(args, argparse.Namespace)
    assert (args.verb, args.json, args.drain_unhealthy, args.extra_vars) == ("health", True, True, ["a=1"])
