"""`gpuinfra report`: arguments, exit codes and output. What would need a cluster (the run of playbooks/report.yml)
is replaced by what that run hands back, so these tests stop at the CLI's wiring; the run itself is tested in
test_report_collect.py and test_report_prometheus.py, and end to end in tests/sandbox/test_reports.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpuinfra.cli import main
from gpuinfra.report import reports
from gpuinfra.report.collect import Answer, Collected, ReportError
from gpuinfra.report.sacct import SEPARATOR

ROOT = Path(__file__).resolve().parents[2]
SANDBOX = str(ROOT / "inventories" / "sandbox" / "cluster.yml")
WITH_DCGM = "components: [node_exporter, dcgm_exporter, prometheus, alertmanager]"


@pytest.fixture
def without_dcgm(tmp_path: Path) -> str:
    """The sandbox's cluster file without the DCGM exporter."""
    text = Path(SANDBOX).read_text()
    assert WITH_DCGM in text
    path = tmp_path / "cluster.yml"
    path.write_text(text.replace(WITH_DCGM, "components: [node_exporter, prometheus, alertmanager]"))
    return str(path)


SLURM_SMALL = str(ROOT / "inventories" / "slurm-small" / "cluster.yml")
K8S = str(ROOT / "inventories" / "k8s-mig" / "cluster.yml")

SACCT = (
    "11|11|alice|vision|vision|COMPLETED|{a}|{b}|00:30:00|billing=1,cpu=1,gres/gpu=1,mem=1G,node=1\n"
    "12|12|bob|nlp|nlp|COMPLETED|{a}|{b}|00:30:00|billing=2,cpu=2,gres/gpu=2,mem=1G,node=1\n"
).replace("|", SEPARATOR)


def _sacct_now() -> str:
    import time

    from gpuinfra.report.time_range import sacct_time

    now = int(time.time())
    return SACCT.format(a=sacct_time(now - 3600), b=sacct_time(now - 1800))


def test_report_is_a_verb_with_two_reports(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["report", "--help"])
    out = capsys.readouterr().out
    assert "usage" in out and "idle" in out


def test_idle_without_dcgm_metrics_says_so_and_exits_3(without_dcgm: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", "idle", without_dcgm]) == 3
    err = capsys.readouterr().err
    assert "does not collect GPU utilisation per job (monitoring.components has no dcgm_exporter)" in err


def test_a_cluster_without_slurm_exits_3(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", "usage", K8S, "--json"]) == 3
    doc = json.loads(capsys.readouterr().out)
    assert doc["exit_code"] == 3 and "has no Slurm" in doc["errors"][0]


def test_a_bad_window_exits_3(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", "usage", SANDBOX, "--since", "last week"]) == 3
    assert "neither a duration" in capsys.readouterr().err


def test_json_and_csv_exclude_each_other() -> None:
    with pytest.raises(SystemExit):
        main(["report", "usage", SANDBOX, "--json", "--csv"])


def test_usage_without_dcgm_reports_gpu_hours_and_no_utilisation(
    without_dcgm: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    asked: dict[str, Any] = {}

    def read(loaded: Any, slurm: str, queries: Any, window: Any, extra: Any) -> Collected:
        asked.update(slurm=slurm, queries=list(queries))
        return Collected(_sacct_now())

    monkeypatch.setattr(reports, "collect", read)
    assert main(["report", "usage", without_dcgm, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert asked == {"slurm": "sacct", "queries": []}
    reason = "not collected (monitoring.components has no dcgm_exporter)"
    assert doc["utilisation"] == {"collected": False, "reason": reason}
    assert {row["account"]: row["gpu_hours"] for row in doc["by_account"]} == {"nlp": 1.0, "vision": 0.5}
    assert {row["user"]: row["util_note"] for row in doc["by_user"]} == {"bob": reason, "alice": reason}
    assert doc["exit_code"] == 0


def test_a_failed_prometheus_query_still_reports_gpu_hours_and_exits_1(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def read(loaded: Any, slurm: str, queries: Any, window: Any, extra: Any) -> Collected:
        refused = {"status": "error", "errorType": "execution", "error": "query processing would load too many samples"}
        return Collected(_sacct_now(), [Answer(q, 422, refused, "") for q in queries])

    monkeypatch.setattr(reports, "collect", read)
    assert main(["report", "usage", SLURM_SMALL, "--since", "2h"]) == 1
    captured = capsys.readouterr()
    assert "GPU utilisation: n/a (the Prometheus query failed)" in captured.out
    assert "3 GPU-hours" not in captured.out and "2 job(s), 1.50 GPU-hours" in captured.out
    assert "HTTP 422: query processing would load too many samples" in captured.out


def test_a_cluster_that_cannot_be_read_exits_1(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def read(*args: Any, **kwargs: Any) -> Collected:
        raise ReportError("ctl01: List the job allocations of the window: sacct: error: slurmdbd: connection refused")

    monkeypatch.setattr(reports, "collect", read)
    assert main(["report", "idle", SLURM_SMALL]) == 1
    assert "slurmdbd: connection refused" in capsys.readouterr().err
