"""The dashboards' queries through Prometheus's own PromQL parser and engine (promtool).

Grafana fills in its macros ($__range, $__interval, ...) and the dashboard's variables before Prometheus sees a
query, so each query is filled in the same way first, then checked by `promtool check rules` as the expression of a
recording rule. The "GPU usage per team" board's GPU-hours are evaluated by `promtool test rules` on the rendered
rules with input series whose answer is known. test_monitoring.py checks that every metric a query names exists.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
from ruamel.yaml import YAML
from test_monitoring import DASHBOARDS, PROMTOOL, dashboard_queries, needs_promtool
from test_monitoring_rules import _promtool_test, dcgm, job_series, recorded

pytestmark = pytest.mark.tools  # runs Ansible or a system tool (tests/unit/tool_guard.py)

# What Grafana puts in place of its macros (a 2 h dashboard range), as Prometheus receives it.
MACROS = {
    "__range": "2h",
    "__range_s": "7200",
    "__range_ms": "7200000",
    "__interval": "1m",
    "__interval_ms": "60000",
    "__rate_interval": "4m",
}
VARIABLE = re.compile(
    r"\$\{(?P<braced>[A-Za-z_]\w*)(?::\w+)?\}|\$(?P<plain>[A-Za-z_]\w*)|\[\[(?P<old>[A-Za-z_]\w*)\]\]"
)


def filled(expr: str, dashboard: dict[str, Any], **values: str) -> str:
    """`expr` as Prometheus receives it: macros and variables replaced (a variable by its "All" value unless given)."""
    known: dict[str, str] = {
        **MACROS,
        **{var["name"]: var.get("allValue", ".*") for var in dashboard["templating"]["list"]},
        **values,
    }

    def value(match: re.Match[str]) -> str:
        name = match["braced"] or match["plain"] or match["old"]
        assert name in known, f"{expr!r}: ${name} is neither a Grafana macro nor a variable of the dashboard"
        return known[name]

    return VARIABLE.sub(value, expr)


def test_filling_in_replaces_macros_and_variables() -> None:
    dashboard = {"templating": {"list": [{"name": "account", "allValue": ".*"}]}}
    expr = 'sum_over_time(x{account=~"$account", a="${account}"}[$__range:1m]) * $__range_s / 3600'
    assert filled(expr, dashboard) == 'sum_over_time(x{account=~".*", a=".*"}[2h:1m]) * 7200 / 3600'
    assert filled('x{account=~"$account"}', dashboard, account="physics") == 'x{account=~"physics"}'
    with pytest.raises(AssertionError, match="neither a Grafana macro"):
        filled("rate(x[$__unknown])", dashboard)


def _check_rules(tmp_path: Path, exprs: list[str]) -> subprocess.CompletedProcess[str]:
    rules = {
        "groups": [{"name": "queries", "rules": [{"record": f"query_{i}", "expr": e} for i, e in enumerate(exprs)]}]
    }
    with (tmp_path / "queries.yml").open("w") as handle:
        YAML(typ="safe").dump(rules, handle)
    return subprocess.run(
        [str(PROMTOOL), "check", "rules", "queries.yml"], cwd=tmp_path, capture_output=True, text=True, check=False
    )


@needs_promtool
@pytest.mark.parametrize("path", sorted(DASHBOARDS.glob("*.json")), ids=lambda p: p.stem)
def test_every_query_parses_as_promql(path: Path, tmp_path: Path) -> None:
    dashboard = json.loads(path.read_text())
    exprs = [filled(expr, dashboard) for expr in dashboard_queries(dashboard)]
    assert exprs and not any("$" in e for e in exprs)
    checked = _check_rules(tmp_path, exprs)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(exprs)} rules found" in checked.stdout


@needs_promtool
def test_a_query_prometheus_cannot_parse_fails_the_check(tmp_path: Path) -> None:
    """The check is not vacuous: a subquery without its range, as a missing macro would leave it, is refused."""
    checked = _check_rules(tmp_path, ["sum_over_time(x[:1m]) / 60"])
    assert checked.returncode != 0
    assert "parse error" in checked.stdout + checked.stderr


# --- the "GPU usage per team" board, evaluated --------------------------------------------------------------------


def _team_board() -> dict[str, Any]:
    board: dict[str, Any] = json.loads((DASHBOARDS / "gpu-teams.json").read_text())
    return board


def _panel_expr(title: str) -> str:
    [panel] = [p for p in _team_board()["panels"] if p["title"] == title]
    [target] = panel["targets"]
    assert target.get("instant") is True, f"{title}: a total over the range is one value, an instant query"
    return filled(target["expr"], _team_board())


def test_team_board_has_the_account_variable_and_the_panels() -> None:
    board = _team_board()
    [variable] = board["templating"]["list"]
    assert variable["name"] == "account"
    assert variable["definition"] == "label_values(gpuinfra_slurm_job_info, account)"
    titles = [panel["title"] for panel in board["panels"]]
    for title in (
        "Allocated GPU-hours per team",
        "Used GPU-hours per team",
        "Used / allocated per team",
        "GPUs allocated and used per team",
        "Idle GPUs per team now",
        "Jobs with idle GPUs",
    ):
        assert title in titles
    for panel in board["panels"]:
        for target in panel["targets"]:
            names_an_account_rule = re.search(r"gpuinfra:(account|job)_gpus:", target["expr"])
            assert not names_an_account_rule or 'account=~"$account"' in target["expr"], panel["title"]


# physics: alice's job holds 2 GPUs, each 50 % busy, for exactly one hour (10 min to 70 min), then ends.
# chemistry: carol's job holds 4 GPUs, fully busy, for the whole two hours. Samples every 30 s; each hour of one GPU
# is one GPU-hour. An average over the range would say 4 GPU-hours for physics: it would count only the hour in
# which the account held GPUs, as if it had held them for both.
TEAM_SERIES = {
    **{
        name: "_x20 " + values.replace("x100", "x119") + " stale"
        for name, values in job_series("ctl01", "101", "alice", "physics", "gpu", 2).items()
    },
    **{dcgm("DCGM_FI_DEV_GPU_UTIL", "gpu01", str(g), ', hpc_job="101"'): "_x20 50x119 stale" for g in (0, 1)},
    **{
        name: "_ " + values.replace("x100", "x239")
        for name, values in job_series("ctl01", "201", "carol", "chemistry", "l40s", 4).items()
    },
    **{dcgm("DCGM_FI_DEV_GPU_UTIL", "gpu02", str(g), ', hpc_job="201"'): "_ 100x239" for g in range(4)},
}


@needs_promtool
@pytest.mark.parametrize(
    ("title", "physics", "chemistry"),
    [
        ("Allocated GPU-hours per team", 2, 8),
        ("Used GPU-hours per team", 1, 8),
        ("Used / allocated per team", 0.5, 1),
    ],
)
def test_team_board_counts_gpu_hours_over_the_range(
    title: str, physics: float, chemistry: float, tmp_path: Path
) -> None:
    check = {
        "expr": _panel_expr(title),
        "eval_time": "2h",  # the end of a 2 h dashboard range
        "exp_samples": [
            recorded("", physics, account="physics"),
            recorded("", chemistry, account="chemistry"),
        ],
    }
    result = _promtool_test(tmp_path, TEAM_SERIES, promql_expr_test=[check])
    assert result.returncode == 0, result.stdout + result.stderr


@needs_promtool
def test_team_board_filters_by_account(tmp_path: Path) -> None:
    [panel] = [p for p in _team_board()["panels"] if p["title"] == "Allocated GPU-hours per team"]
    check = {
        "expr": filled(panel["targets"][0]["expr"], _team_board(), account="chemistry"),
        "eval_time": "2h",
        "exp_samples": [recorded("", 8, account="chemistry")],
    }
    result = _promtool_test(tmp_path, TEAM_SERIES, promql_expr_test=[check])
    assert result.returncode == 0, result.stdout + result.stderr
