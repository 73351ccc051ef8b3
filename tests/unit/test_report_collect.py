"""What playbooks/report.yml is given and what comes back: extra vars marked unsafe, the run's set_stats data
(`RunResult.artifacts`) from a real run, and the checks on what the playbook published."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from gpuinfra.render.inventory import inventory_yaml
from gpuinfra.report import sacct, squeue
from gpuinfra.report.collect import ReportError, from_artifacts, hosts_for, playbook_vars
from gpuinfra.report.prometheus import usage_queries
from gpuinfra.report.time_range import TimeRange
from gpuinfra.run import RunOptions, run_playbook
from gpuinfra.validate.load import load_cluster

ROOT = Path(__file__).resolve().parents[2]
PLAYBOOKS = Path(__file__).parent / "data" / "playbooks"
SANDBOX = ROOT / "inventories" / "sandbox" / "cluster.yml"


@pytest.mark.tools
def test_set_stats_data_comes_back_as_artifacts_without_templating(run_root: Path) -> None:
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    inventory = {"all": {"hosts": {"n1": local}}}
    text = "{{ lookup('pipe', 'id') }} literal"
    options = RunOptions(playbook=PLAYBOOKS / "stats.yml", extra_vars={"probe_text": {"__ansible_unsafe": text}})
    result = run_playbook(inventory, options, hosts=["n1"])
    assert result.rc == 0, result.failures
    assert result.artifacts == {"probe": {"stdout": text, "numbers": [1, 2]}}


def test_every_string_of_the_playbook_vars_is_unsafe() -> None:
    window = TimeRange(1714521600, 1714525200)
    found = playbook_vars("sacct", usage_queries(window), window)
    assert found["slurm_report_sacct_format"] == {"__ansible_unsafe": sacct.FORMAT}
    assert found["slurm_report_start"] == {"__ansible_unsafe": "2024-05-01T00:00:00"}
    assert found["slurm_report_end"] == {"__ansible_unsafe": "2024-05-01T01:00:00"}
    first = found["prometheus_query_queries"][0]
    assert first["path"] == {"__ansible_unsafe": "query_range"}
    assert set(first["params"]) == {"query", "start", "end", "step"}
    assert all(list(value) == ["__ansible_unsafe"] for value in first["params"].values())
    idle = playbook_vars("squeue", [])
    assert idle["slurm_report_squeue_format"] == {"__ansible_unsafe": squeue.FORMAT}
    with pytest.raises(ValueError, match="window"):
        playbook_vars("sacct", [])


def test_the_run_targets_the_first_controller_and_monitoring_host() -> None:
    inventory = inventory_yaml(load_cluster(SANDBOX).resolved)
    window = TimeRange(0, 3600)
    assert hosts_for(inventory, "sacct", usage_queries(window)) == ["ctl01"]
    assert hosts_for(inventory, "squeue", []) == ["ctl01"]
    inventory["all"]["children"]["monitoring"]["hosts"] = {}
    with pytest.raises(ReportError, match="no host in the group monitoring"):
        hosts_for(inventory, "sacct", usage_queries(window))


def test_what_the_playbook_published_is_checked() -> None:
    queries = usage_queries(TimeRange(0, 3600))
    with pytest.raises(ReportError, match="no sacct output"):
        from_artifacts({}, "sacct", [])
    with pytest.raises(ReportError, match="0 Prometheus answers for 4 queries"):
        from_artifacts({"gpuinfra_report_slurm": ""}, "sacct", queries)
    published = {
        "status": [200, 200, 400, -1],
        "answers": [
            {"status": "success", "data": {"resultType": "matrix", "result": []}},
            {"status": "error", "errorType": "bad_data", "error": "parse error"},
            {"status": "error", "errorType": "bad_data", "error": "1:5: parse error: unexpected"},
            {},
        ],
        "messages": ["OK", "", "HTTP Error 400: Bad Request", "Request failed: <urlopen error [Errno 111]>"],
    }
    collected = from_artifacts(
        {"gpuinfra_report_slurm": "x", "gpuinfra_report_prometheus": published}, "sacct", queries
    )
    assert collected.slurm == "x"
    errors = [answer.error for answer in collected.answers]
    assert errors[0] is None
    assert errors[1] is not None and "HTTP 200: parse error" in errors[1]
    assert errors[2] is not None and "HTTP 400: 1:5: parse error: unexpected" in errors[2]
    assert errors[3] is not None and "HTTP -1: Request failed" in errors[3]
