"""`promtool test rules` on the rendered alert rules: for every alert, series past its threshold make it fire, and
series just inside it (or past it for less than its `for`) do not.

The rules come from the mon-full cluster of test_monitoring.py (a Slurm cluster; GPU temperature threshold 80 °C,
other thresholds at their defaults). Annotations are dropped from the copy promtool tests, so that each case
states the labels that matter; `promtool check rules` checks the annotation templates.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from ruamel.yaml import YAML
from test_monitoring import rendered, yaml_load

PROMTOOL = shutil.which("promtool")
pytestmark = pytest.mark.skipif(PROMTOOL is None, reason="promtool is missing (Debian package prometheus)")

DCGM = 'job="dcgm_exporter"'
STATE_FILE = 'file="/var/lib/prometheus/node-exporter/gpuinfra_slurm.prom"'


def dcgm(metric: str, instance: str, gpu: str, extra: str = "") -> str:
    return f'{metric}{{{DCGM}, instance="{instance}", gpu="{gpu}"{extra}}}'


def alert(name: str, severity: str, **labels: str) -> dict[str, Any]:
    return {"exp_labels": {"severity": severity, **labels}}


def gpu_labels(instance: str, gpu: str, **extra: str) -> dict[str, str]:
    return {"job": "dcgm_exporter", "instance": instance, "gpu": gpu, **extra}


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
    "GpuXidError": {
        "series": {
            dcgm("DCGM_FI_DEV_XID_ERRORS", "gpu01", "0"): "0 0 79x8",
            dcgm("DCGM_FI_DEV_XID_ERRORS", "gpu01", "1"): "0x10",
        },
        "evals": {
            "30s": [],
            "2m": [alert("GpuXidError", "critical", **gpu_labels("gpu01", "0"))],
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
}


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
