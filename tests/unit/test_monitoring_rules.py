"""`promtool test rules` on the rendered rules: for every alert, series past its threshold make it fire, and series
just inside it (or past it for less than its `for`) do not; for every per-account recording rule, input series give
the values it must record.

The rules come from the mon-full cluster of test_monitoring.py (a Slurm cluster; GPU temperature threshold 80 °C,
other thresholds at their defaults). Annotations are dropped from the copy promtool tests, so that each case
states the labels that matter; `promtool check rules` checks the annotation templates.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
from ruamel.yaml import YAML
from test_monitoring import PROMTOOL, needs_promtool, rendered, yaml_load

pytestmark = [pytest.mark.tools, needs_promtool]  # runs a system tool (tests/unit/tool_guard.py)

DCGM = 'job="dcgm_exporter"'
STATE_FILE = 'file="/var/lib/prometheus/node-exporter/gpuinfra_slurm.prom"'
KERNEL_FILE = 'file="/var/lib/prometheus/node-exporter/gpuinfra_kernel_updates.prom"'


def dcgm(metric: str, instance: str, gpu: str, extra: str = "") -> str:
    return f'{metric}{{{DCGM}, instance="{instance}", gpu="{gpu}"{extra}}}'


def alert(name: str, severity: str, **labels: str) -> dict[str, Any]:
    return {"exp_labels": {"severity": severity, **labels}}


def gpu_labels(instance: str, gpu: str, **extra: str) -> dict[str, str]:
    return {"job": "dcgm_exporter", "instance": instance, "gpu": gpu, **extra}


def kernel_labels(instance: str, state: str) -> dict[str, str]:
    return {"job": "node", "instance": instance, "package": "linux-image-amd64", "version": "6.1.192-3", "state": state}


def kernel_since(instance: str, package: str, version: str, state: str) -> str:
    """The series the kernel_updates collector writes for one pending update, through the node exporter."""
    where = f'job="node", instance="{instance}", package="{package}", version="{version}", state="{state}"'
    return f"gpuinfra_kernel_update_pending_since_timestamp_seconds{{{where}}}"


# Each case: input series, and for each evaluation time the alerts expected (an empty list: none fires).
CASES: dict[str, dict[str, Any]] = {
    "GpuTemperatureHigh": {
        "series": {
            dcgm("DCGM_FI_DEV_GPU_TEMP", "gpu01", "0"): "81x10",  # past 80 °C
            dcgm("DCGM_FI_DEV_GPU_TEMP", "gpu01", "1"): "80x10",  # at the threshold: inside
            dcgm("DCGM_FI_DEV_GPU_TEMP", "gpu01", "2"): "95x2 70x8",  # past it for 1 m only (for: 2m)
        },
        "evals": {
            "1m": [],
            "3m": [alert("GpuTemperatureHigh", "critical", **gpu_labels("gpu01", "0"))],
        },
    },
    # A GPU's own fault (79, 48): critical, with the job that held the GPU, its user and account; an application's
    # XID (13) and one the catalog ignores (45, a channel preempted) raise none here.
    "GpuXidError": {
        "series": {
            dcgm("DCGM_FI_DEV_XID_ERRORS", "gpu01", "0"): "0 0 79x8",
            dcgm("DCGM_FI_DEV_XID_ERRORS", "gpu01", "1"): "0x10",
            dcgm("DCGM_FI_DEV_XID_ERRORS", "gpu02", "0", ', hpc_job="7"'): "0 0 48x8",
            dcgm("DCGM_FI_DEV_XID_ERRORS", "gpu02", "1"): "13x10",
            dcgm("DCGM_FI_DEV_XID_ERRORS", "gpu03", "0"): "45x10",
            'gpuinfra_slurm_job_info{job="node", instance="ctl01", hpc_job="7", user="bob", account="nlp", '
            'partition="gpu"}': "1x10",
        },
        "evals": {
            "30s": [],
            "2m": [
                alert("GpuXidError", "critical", **gpu_labels("gpu01", "0")),
                alert("GpuXidError", "critical", **gpu_labels("gpu02", "0", hpc_job="7", user="bob", account="nlp")),
            ],
        },
    },
    # An application's fault: a warning naming the job, its user and account, for the team's receiver; on a GPU no
    # job holds, the GPU's own labels.
    "GpuApplicationXid": {
        "series": {
            dcgm("DCGM_FI_DEV_XID_ERRORS", "gpu01", "1", ', hpc_job="101"'): "0 13x9",
            dcgm("DCGM_FI_DEV_XID_ERRORS", "gpu01", "0"): "0 31x9",
            dcgm("DCGM_FI_DEV_XID_ERRORS", "gpu02", "0"): "0 79x9",
            'gpuinfra_slurm_job_info{job="node", instance="ctl01", hpc_job="101", user="alice", account="vision", '
            'partition="gpu"}': "1x10",
        },
        "evals": {
            "2m": [
                alert("GpuApplicationXid", "warning", **gpu_labels("gpu01", "0")),
                alert(
                    "GpuApplicationXid",
                    "warning",
                    **gpu_labels("gpu01", "1", hpc_job="101", user="alice", account="vision"),
                ),
            ],
        },
    },
    "GpuEccUncorrectable": {
        "series": {
            dcgm("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "gpu01", "0"): "0 1x9",
            dcgm("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "gpu01", "1"): "0x10",
        },
        "evals": {"0m": [], "1m": [alert("GpuEccUncorrectable", "critical", **gpu_labels("gpu01", "0"))]},
    },
    "GpuRowRemapPending": {
        "series": {
            dcgm("DCGM_FI_DEV_ROW_REMAP_PENDING", "gpu01", "0"): "1x10",
            dcgm("DCGM_FI_DEV_ROW_REMAP_PENDING", "gpu01", "1"): "0x10",
        },
        "evals": {"1m": [alert("GpuRowRemapPending", "critical", **gpu_labels("gpu01", "0"))]},
    },
    "GpuRowRemapFailed": {
        "series": {
            dcgm("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gpu01", "0"): "1x10",
            dcgm("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gpu01", "1"): "0x10",
        },
        "evals": {"1m": [alert("GpuRowRemapFailed", "critical", **gpu_labels("gpu01", "0"))]},
    },
    "GpuMemoryHigh": {
        "series": {
            dcgm("DCGM_FI_DEV_FB_USED", "gpu01", "0"): "91x20",  # 91 %
            dcgm("DCGM_FI_DEV_FB_FREE", "gpu01", "0"): "9x20",
            dcgm("DCGM_FI_DEV_FB_USED", "gpu01", "1"): "90x20",  # 90 %: inside
            dcgm("DCGM_FI_DEV_FB_FREE", "gpu01", "1"): "10x20",
        },
        "evals": {
            "4m": [],  # for: 5m
            "6m": [alert("GpuMemoryHigh", "warning", **gpu_labels("gpu01", "0"))],
        },
    },
    "GpuIdleWhileAllocated": {
        "series": {
            dcgm("DCGM_FI_DEV_GPU_UTIL", "gpu01", "0", ', hpc_job="42"'): "5x80",  # allocated, 5 %
            dcgm("DCGM_FI_DEV_GPU_UTIL", "gpu01", "1", ', hpc_job="43"'): "10x80",  # 10 %: inside
            dcgm("DCGM_FI_DEV_GPU_UTIL", "gpu01", "2"): "0x80",  # idle but not allocated
        },
        "evals": {
            "29m": [],  # for: 30m
            "35m": [alert("GpuIdleWhileAllocated", "info", **gpu_labels("gpu01", "0", hpc_job="42"))],
        },
    },
    "GpuMissing": {
        "series": {
            # gpu01: 7 of its 8 GPUs report; gpu02: all 8; gpu03: the exporter answers with no GPU (nvidia-smi
            # fails); gpu04: the exporter is down (GpuExporterDown, not this alert).
            **{f'up{{{DCGM}, instance="gpu0{i}", gpus_expected="8"}}': "1x10" for i in (1, 2, 3)},
            f'up{{{DCGM}, instance="gpu04", gpus_expected="8"}}': "0x10",
            **{dcgm("DCGM_FI_DEV_GPU_TEMP", "gpu01", str(g)): "40x10" for g in range(7)},
            **{dcgm("DCGM_FI_DEV_GPU_TEMP", "gpu02", str(g)): "40x10" for g in range(8)},
        },
        "evals": {
            "1m": [],  # for: 2m
            "3m": [
                alert("GpuMissing", "critical", instance="gpu01"),
                alert("GpuMissing", "critical", instance="gpu03"),
            ],
        },
    },
    "GpuExporterDown": {
        "series": {
            f'up{{{DCGM}, instance="gpu01", gpus_expected="8"}}': "0x10",
            f'up{{{DCGM}, instance="gpu02", gpus_expected="8"}}': "1x10",
        },
        "evals": {
            "1m": [],
            "3m": [alert("GpuExporterDown", "critical", job="dcgm_exporter", instance="gpu01", gpus_expected="8")],
        },
    },
    "NodeDown": {
        "series": {
            'up{job="node", instance="gpu01"}': "0x10",
            'up{job="node", instance="gpu02"}': "1x10",
            'up{job="node", instance="gpu03"}': "0 0 1x8",  # down for 1 m, then back
        },
        "evals": {"1m": [], "3m": [alert("NodeDown", "critical", job="node", instance="gpu01")]},
    },
    "SlurmNodeDown": {
        "series": {
            'gpuinfra_slurm_node_down{job="node", instance="ctl01", node="gpu01", reason="Not responding"}': "1x10",
            'gpuinfra_slurm_node_down{job="node", instance="ctl01", node="gpu02"}': "0x10",
        },
        "evals": {
            "1m": [],
            # instance names the Slurm node, so that a NodeDown of that host inhibits this alert.
            "3m": [
                alert("SlurmNodeDown", "critical", job="node", instance="gpu01", node="gpu01", reason="Not responding")
            ],
        },
    },
    "SlurmNodeDrained": {
        "series": {
            'gpuinfra_slurm_node_drained{job="node", instance="ctl01", node="gpu01", reason="XID 79"}': "1x10",
            'gpuinfra_slurm_node_drained{job="node", instance="ctl01", node="gpu02"}': "0x10",
        },
        "evals": {
            "1m": [],
            "3m": [alert("SlurmNodeDrained", "warning", job="node", instance="gpu01", node="gpu01", reason="XID 79")],
        },
    },
    "SlurmNodeStateUnknown (sinfo fails)": {
        "alertname": "SlurmNodeStateUnknown",
        "series": {
            'gpuinfra_slurm_sinfo_success{job="node", instance="ctl01"}': "0x10",
            'gpuinfra_slurm_sinfo_success{job="node", instance="ctl02"}': "1x10",
        },
        "evals": {"3m": [alert("SlurmNodeStateUnknown", "warning", job="node", instance="ctl01")]},
    },
    "SlurmNodeStateUnknown (stale file)": {
        "alertname": "SlurmNodeStateUnknown",
        "series": {
            # ctl01's file stopped changing at t=0; ctl02's is rewritten every 30 s (its mtime follows the clock).
            f'node_textfile_mtime_seconds{{job="node", instance="ctl01", {STATE_FILE}}}': "0x40",
            f'node_textfile_mtime_seconds{{job="node", instance="ctl02", {STATE_FILE}}}': "0+30x40",
        },
        "evals": {
            "5m": [],  # 300 s old: inside
            "10m": [
                alert(
                    "SlurmNodeStateUnknown",
                    "warning",
                    job="node",
                    instance="ctl01",
                    file="/var/lib/prometheus/node-exporter/gpuinfra_slurm.prom",
                )
            ],
        },
    },
    # promtool's clock starts at 0, so a kernel that began waiting before the test has a negative "since". The limit
    # is the default 14 days (1209600 s).
    "KernelUpdatePending": {
        "series": {
            kernel_since("gpu01", "linux-image-amd64", "6.1.192-3", "available"): "-1209600x10",  # 14 d at t=0
            kernel_since("gpu02", "linux-image-amd64", "6.1.192-3", "installed"): "-1209500x10",  # 100 s short of it
            'gpuinfra_kernel_update_check_success{job="node", instance="gpu03"}': "1x10",  # nothing waits there
        },
        "evals": {
            "0s": [],  # exactly 14 d: inside
            "1m": [alert("KernelUpdatePending", "warning", **kernel_labels("gpu01", "available"))],
            "3m": [
                alert("KernelUpdatePending", "warning", **kernel_labels("gpu01", "available")),
                alert("KernelUpdatePending", "warning", **kernel_labels("gpu02", "installed")),
            ],
        },
    },
    # DCGM's violation counters add microseconds held back: 9e6 per 30 s is 30% of the time, 6e6 is 20%.
    "GpuPowerThrottled": {
        "series": {
            dcgm("DCGM_FI_DEV_POWER_VIOLATION", "gpu01", "0"): "0+9000000x40",  # 30%: past 20%
            dcgm("DCGM_FI_DEV_POWER_VIOLATION", "gpu01", "1"): "0+6000000x40",  # 20%: inside
            dcgm("DCGM_FI_DEV_POWER_VIOLATION", "gpu01", "2"): "0+9000000x10 90000000x30",  # 5 minutes only
        },
        "evals": {"8m": [], "16m": [alert("GpuPowerThrottled", "warning", **gpu_labels("gpu01", "0"))]},
    },
    "GpuThermalThrottled": {
        "series": {
            dcgm("DCGM_FI_DEV_THERMAL_VIOLATION", "gpu01", "0"): "0+3000000x40",  # 10%: past 5%
            dcgm("DCGM_FI_DEV_THERMAL_VIOLATION", "gpu01", "1"): "0+1500000x40",  # 5%: inside
        },
        "evals": {"8m": [], "16m": [alert("GpuThermalThrottled", "warning", **gpu_labels("gpu01", "0"))]},
    },
    # Clock event reasons: 0x8 HW slowdown, 0x40 HW thermal (with 0x1 idle), 0x80 power brake fire; 0x4 (the
    # software power cap), 0x20 (software thermal) and 0x1 (idle) alone do not.
    "GpuHardwareSlowdown": {
        "series": {
            dcgm("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "gpu01", str(gpu)): f"{value}x10"
            for gpu, value in enumerate((8, 65, 4, 1, 128, 32))
        },
        "evals": {
            "1m": [],
            "3m": [
                alert("GpuHardwareSlowdown", "critical", **gpu_labels("gpu01", "0")),
                alert("GpuHardwareSlowdown", "critical", **gpu_labels("gpu01", "1")),
                alert("GpuHardwareSlowdown", "critical", **gpu_labels("gpu01", "4")),
            ],
        },
    },
    "SlurmJobOutOfMemory": {
        "series": {
            'gpuinfra_slurm_job_out_of_memory_end_timestamp_seconds{job="node", instance="ctl01", '
            'hpc_job="2101", user="alice", account="physics", partition="gpu"}': "1764990000x4",
        },
        "evals": {
            "0s": [
                alert(
                    "SlurmJobOutOfMemory",
                    "warning",
                    job="node",
                    instance="ctl01",
                    hpc_job="2101",
                    user="alice",
                    account="physics",
                    partition="gpu",
                )
            ],
            "8m": [],  # no longer listed (an hour has passed) and past the 5 minutes Prometheus looks back
        },
    },
    "GpuHealthUnknown": {
        "series": {
            'gpuinfra_health_verdict{job="node", instance="gpu01", verdict="unknown"}': "1x10",
            'gpuinfra_health_verdict{job="node", instance="gpu02", verdict="unknown"}': "0x10",
            'gpuinfra_health_verdict{job="node", instance="gpu02", verdict="unhealthy"}': "1x10",
            'gpuinfra_health_verdict{job="node", instance="gpu03", verdict="unknown"}': "1 0x9",  # one check only
        },
        "evals": {
            "1m": [],
            "3m": [alert("GpuHealthUnknown", "warning", job="node", instance="gpu01", verdict="unknown")],
        },
    },
    "GpuHealthSpared": {
        "series": {
            'gpuinfra_health_spared{job="node", instance="gpu01"}': "0 1x9",
            'gpuinfra_health_spared{job="node", instance="gpu02"}': "0x10",
        },
        "evals": {"0s": [], "1m": [alert("GpuHealthSpared", "critical", job="node", instance="gpu01")]},
    },
    "KernelUpdateStateUnknown (check fails)": {
        "alertname": "KernelUpdateStateUnknown",
        "series": {
            'gpuinfra_kernel_update_check_success{job="node", instance="gpu01"}': "0x10",
            'gpuinfra_kernel_update_check_success{job="node", instance="gpu02"}': "1x10",
        },
        "evals": {"1m": [], "3m": [alert("KernelUpdateStateUnknown", "warning", job="node", instance="gpu01")]},
    },
    "KernelUpdateStateUnknown (stale file)": {
        "alertname": "KernelUpdateStateUnknown",
        "series": {
            # gpu01's file stopped changing at t=0; gpu02's is rewritten all along; gpu03's is the Slurm state file.
            f'node_textfile_mtime_seconds{{job="node", instance="gpu01", {KERNEL_FILE}}}': "0x500",
            f'node_textfile_mtime_seconds{{job="node", instance="gpu02", {KERNEL_FILE}}}': "0+30x500",
            f'node_textfile_mtime_seconds{{job="node", instance="gpu03", {STATE_FILE}}}': "0+30x500",
        },
        "evals": {
            "3h": [],  # 10800 s old: inside
            "3h5m": [
                alert(
                    "KernelUpdateStateUnknown",
                    "warning",
                    job="node",
                    instance="gpu01",
                    file="/var/lib/prometheus/node-exporter/gpuinfra_kernel_updates.prom",
                )
            ],
        },
    },
}


# --- recording rules: GPUs per Slurm account ------------------------------------------------------------------------


def job_series(instance: str, job: str, user: str, account: str, partition: str, gpus: int) -> dict[str, str]:
    """The two series the Slurm job collector publishes for one running job, through the node exporter on `instance`."""
    where = f'job="node", instance="{instance}", hpc_job="{job}"'
    return {
        f'gpuinfra_slurm_job_info{{{where}, user="{user}", account="{account}", partition="{partition}"}}': "1x100",
        f"gpuinfra_slurm_job_gpus{{{where}}}": f"{gpus}x100",
    }


def recorded(name: str, value: float, **labels: str) -> dict[str, Any]:
    inner = ", ".join(f'{key}="{val}"' for key, val in labels.items())
    return {"labels": f"{name}{{{inner}}}", "value": value}


ALICE = {"hpc_job": "101", "user": "alice", "account": "physics", "partition": "gpu"}
BOB = {"hpc_job": "102", "user": "bob", "account": "physics", "partition": "gpu"}
CAROL = {"hpc_job": "201", "user": "carol", "account": "chemistry", "partition": "l40s"}

# Each case: input series, and for each evaluation time the samples each recording rule must give.
RECORDING_CASES: dict[str, dict[str, Any]] = {
    "allocated and used": {
        "series": {
            # Two controllers publish the same jobs: each job counts once.
            **job_series("ctl01", "101", "alice", "physics", "gpu", 2),
            **job_series("ctl02", "101", "alice", "physics", "gpu", 2),
            **job_series("ctl01", "102", "bob", "physics", "gpu", 1),
            **job_series("ctl02", "102", "bob", "physics", "gpu", 1),
            **job_series("ctl01", "201", "carol", "chemistry", "l40s", 4),
            **job_series("ctl01", "301", "dave", "biology", "cpu", 0),  # a CPU job: no GPU, so no series
            dcgm("DCGM_FI_DEV_GPU_UTIL", "gpu01", "0", ', hpc_job="101"'): "50x20",
            dcgm("DCGM_FI_DEV_GPU_UTIL", "gpu01", "1", ', hpc_job="101"'): "25x20",
            dcgm("DCGM_FI_DEV_GPU_UTIL", "gpu02", "0", ', hpc_job="102"'): "0x20",
            **{
                dcgm("DCGM_FI_DEV_GPU_UTIL", "gpu03", str(g), ', hpc_job="201"'): f"{u}x20"
                for g, u in enumerate([100, 100, 50, 50])
            },
            # Busy, but no job holds it; and a job mapping the epilog left behind for a job no longer running.
            dcgm("DCGM_FI_DEV_GPU_UTIL", "gpu04", "0"): "90x20",
            dcgm("DCGM_FI_DEV_GPU_UTIL", "gpu05", "0", ', hpc_job="999"'): "100x20",
        },
        "evals": {
            "5m": {
                "gpuinfra:job_gpus:allocated": [
                    recorded("gpuinfra:job_gpus:allocated", 2, **ALICE),
                    recorded("gpuinfra:job_gpus:allocated", 1, **BOB),
                    recorded("gpuinfra:job_gpus:allocated", 4, **CAROL),
                ],
                "gpuinfra:account_gpus:allocated": [
                    recorded("gpuinfra:account_gpus:allocated", 3, account="physics"),
                    recorded("gpuinfra:account_gpus:allocated", 4, account="chemistry"),
                ],
                # physics: 0.5 + 0.25 + 0 GPUs' worth of work; chemistry: 1 + 1 + 0.5 + 0.5.
                "gpuinfra:account_gpus:used": [
                    recorded("gpuinfra:account_gpus:used", 0.75, account="physics"),
                    recorded("gpuinfra:account_gpus:used", 3, account="chemistry"),
                ],
            },
        },
    },
    "idle, as GpuIdleWhileAllocated says": {
        "series": {
            **job_series("ctl01", "101", "alice", "physics", "gpu", 2),
            **job_series("ctl01", "201", "carol", "chemistry", "l40s", 1),
            dcgm("DCGM_FI_DEV_GPU_UTIL", "gpu01", "0", ', hpc_job="101"'): "5x100",  # idle
            dcgm("DCGM_FI_DEV_GPU_UTIL", "gpu01", "1", ', hpc_job="101"'): "10x100",  # at the threshold: busy enough
            dcgm("DCGM_FI_DEV_GPU_UTIL", "gpu02", "0", ', hpc_job="201"'): "50x100",
            dcgm("DCGM_FI_DEV_GPU_UTIL", "gpu03", "0"): "0x100",  # idle, but no job holds it
        },
        "evals": {
            "29m": {  # idle for less than the alert's 30m
                "gpuinfra:job_gpus:idle": [],
                "gpuinfra:account_gpus:idle": [
                    recorded("gpuinfra:account_gpus:idle", 0, account="physics"),
                    recorded("gpuinfra:account_gpus:idle", 0, account="chemistry"),
                ],
            },
            "35m": {
                "gpuinfra:job_gpus:idle": [recorded("gpuinfra:job_gpus:idle", 1, **ALICE)],
                "gpuinfra:account_gpus:idle": [
                    recorded("gpuinfra:account_gpus:idle", 1, account="physics"),
                    recorded("gpuinfra:account_gpus:idle", 0, account="chemistry"),
                ],
            },
        },
    },
}


def _account_rules() -> list[dict[str, Any]]:
    rules = yaml_load(rendered("mon-full")["monitoring/prometheus/rules/gpuinfra.yml"].content)
    [group] = [group for group in rules["groups"] if group["name"] == "gpuinfra-slurm-accounts"]
    return list(group["rules"])


def test_every_account_rule_has_a_case() -> None:
    records = {rule["record"] for rule in _account_rules()}
    tested = {record for case in RECORDING_CASES.values() for evals in case["evals"].values() for record in evals}
    assert records == tested
    assert "gpuinfra:account_gpus:idle" in records


def _promtool_test(tmp_path: Path, series: dict[str, str], **checks: Any) -> subprocess.CompletedProcess[str]:
    _rules_without_annotations(tmp_path / "rules.yml")
    test = {
        "rule_files": ["rules.yml"],
        "evaluation_interval": "30s",
        "tests": [
            {
                "interval": "30s",
                "input_series": [{"series": name, "values": values} for name, values in series.items()],
                **checks,
            }
        ],
    }
    with (tmp_path / "test.yml").open("w") as handle:
        YAML(typ="safe").dump(test, handle)
    return subprocess.run(
        [str(PROMTOOL), "test", "rules", "test.yml"], cwd=tmp_path, capture_output=True, text=True, check=False
    )


@pytest.mark.parametrize("name", list(RECORDING_CASES))
def test_account_rules_record_what_the_jobs_hold_and_use(name: str, tmp_path: Path) -> None:
    case = RECORDING_CASES[name]
    checks = [
        {"expr": record, "eval_time": at, "exp_samples": samples}
        for at, records in case["evals"].items()
        for record, samples in records.items()
    ]
    result = _promtool_test(tmp_path, case["series"], promql_expr_test=checks)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_age_of_a_waiting_kernel_is_recorded(tmp_path: Path) -> None:
    """The collector writes since when; the age keeps growing with Prometheus's clock, even when the collector
    stops. A node with nothing waiting has no age."""
    series = {
        kernel_since("gpu01", "linux-image-amd64", "6.1.192-3", "available"): "-100x20",
        'gpuinfra_kernel_update_check_success{job="node", instance="gpu02"}': "1x20",
    }
    checks = [
        {
            "expr": "gpuinfra:kernel_update_pending:seconds",
            "eval_time": at,
            "exp_samples": [
                recorded("gpuinfra:kernel_update_pending:seconds", age, **kernel_labels("gpu01", "available"))
            ],
        }
        for at, age in (("0s", 100), ("5m", 400))
    ]
    result = _promtool_test(tmp_path, series, promql_expr_test=checks)
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_wrong_recorded_value_would_fail(tmp_path: Path) -> None:
    """The harness is not vacuous: one GPU more than the job holds makes promtool fail."""
    check = {
        "expr": "gpuinfra:account_gpus:allocated",
        "eval_time": "1m",
        "exp_samples": [recorded("gpuinfra:account_gpus:allocated", 3, account="physics")],
    }
    result = _promtool_test(
        tmp_path, job_series("ctl01", "101", "alice", "physics", "gpu", 2), promql_expr_test=[check]
    )
    assert result.returncode != 0
    assert "gpuinfra:account_gpus:allocated" in result.stdout + result.stderr


def test_every_alert_has_a_case() -> None:
    rules = yaml_load(rendered("mon-full")["monitoring/prometheus/rules/gpuinfra.yml"].content)
    alerts = {rule["alert"] for group in rules["groups"] for rule in group["rules"] if "alert" in rule}
    tested = {case.get("alertname", name) for name, case in CASES.items()}
    assert alerts == tested


def _rules_without_annotations(path: Path) -> None:
    rules = yaml_load(rendered("mon-full")["monitoring/prometheus/rules/gpuinfra.yml"].content)
    for group in rules["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    with path.open("w") as handle:
        YAML(typ="safe").dump(rules, handle)


@pytest.mark.parametrize("name", list(CASES))
def test_alert_fires_past_its_threshold_and_not_inside_it(name: str, tmp_path: Path) -> None:
    case = CASES[name]
    alertname = case.get("alertname", name)
    _rules_without_annotations(tmp_path / "rules.yml")
    test = {
        "rule_files": ["rules.yml"],
        "evaluation_interval": "30s",
        "tests": [
            {
                "interval": "30s",
                "input_series": [{"series": series, "values": values} for series, values in case["series"].items()],
                "alert_rule_test": [
                    {"eval_time": at, "alertname": alertname, "exp_alerts": expected}
                    for at, expected in case["evals"].items()
                ],
            }
        ],
    }
    with (tmp_path / "test.yml").open("w") as handle:
        YAML(typ="safe").dump(test, handle)
    result = subprocess.run(
        [str(PROMTOOL), "test", "rules", "test.yml"], cwd=tmp_path, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_kernel_alert_names_the_command_that_boots_the_kernel() -> None:
    from gpuinfra.cli import build_parser

    rules = yaml_load(rendered("mon-full")["monitoring/prometheus/rules/gpuinfra.yml"].content)
    [rule] = [r for group in rules["groups"] for r in group["rules"] if r.get("alert") == "KernelUpdatePending"]
    assert "Run `gpuinfra upgrade --kernel`" in rule["annotations"]["description"]
    assert "longer than 14d " in rule["annotations"]["description"]  # the limit, as the cluster file says it
    args = build_parser().parse_args(["upgrade", "--kernel", "cluster.yml"])
    assert (args.verb, args.kernel) == ("upgrade", True)


def test_a_missing_case_would_fail(tmp_path: Path) -> None:
    """The harness is not vacuous: expecting no alert where one fires makes promtool fail."""
    _rules_without_annotations(tmp_path / "rules.yml")
    test = {
        "rule_files": ["rules.yml"],
        "evaluation_interval": "30s",
        "tests": [
            {
                "interval": "30s",
                "input_series": [{"series": 'up{job="node", instance="gpu01"}', "values": "0x10"}],
                "alert_rule_test": [{"eval_time": "3m", "alertname": "NodeDown", "exp_alerts": []}],
            }
        ],
    }
    with (tmp_path / "test.yml").open("w") as handle:
        YAML(typ="safe").dump(test, handle)
    result = subprocess.run(
        [str(PROMTOOL), "test", "rules", "test.yml"], cwd=tmp_path, capture_output=True, text=True, check=False
    )
    assert result.returncode != 0
