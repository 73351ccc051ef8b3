"""The tenants' alert rules on Kubernetes (roles/k8s_tenants/templates/alert-rules.yaml.j2): a PrometheusRule for
the cluster's own Prometheus. No Prometheus operator runs here, so its `spec` goes through the real parser and rule
engine instead: `promtool check rules` (annotation templates included), and `promtool test rules` with
kube-state-metrics' series, where a tenant's container killed for memory fires the alert with the tenant's name, and
an old kill, another reason or another namespace does not."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
from ruamel.yaml import YAML
from test_kubernetes_support import DATA, rendered, yaml_load_all
from test_monitoring import PROMTOOL, needs_promtool

from gpuinfra.render.plan import render
from gpuinfra.validate.load import load_cluster

pytestmark = [pytest.mark.tools, needs_promtool]  # runs a system tool (tests/unit/tool_guard.py)
PATH = "k8s-tenants/alert-rules.yaml"
ALERT = "KubernetesContainerOOMKilled"


def _rule(example: str) -> dict[str, Any]:
    (document,) = yaml_load_all(rendered(example)[PATH].content)
    assert isinstance(document, dict)
    return document


def _series(metric: str, namespace: str, pod: str, **labels: str) -> str:
    shown = {"job": "kube-state-metrics", "namespace": namespace, "pod": pod, "container": "main", **labels}
    return metric + "{" + ", ".join(f'{key}="{value}"' for key, value in shown.items()) + "}"


def _labels(namespace: str, pod: str, tenant: str) -> dict[str, str]:
    where = {"job": "kube-state-metrics", "namespace": namespace, "pod": pod, "container": "main"}
    return {**where, "reason": "OOMKilled", "severity": "warning", "tenant": tenant}


LAST = "kube_pod_container_status_last_terminated_reason"
RESTARTS = "kube_pod_container_status_restarts_total"
ENDED = "kube_pod_container_status_terminated_reason"
# mig-mixed's tenants: nlp in nlp-research, vision in vision, observers. Samples every 30 s for 20 minutes.
SERIES = {
    # Restarted after an OOM kill at 5 m: fires until the restart leaves the 10-minute window.
    _series(LAST, "nlp-research", "train-0", reason="OOMKilled"): "1x40",
    _series(RESTARTS, "nlp-research", "train-0"): "0x10 1x30",
    # Killed for memory long ago, no restart since: nothing.
    _series(LAST, "vision", "serve-0", reason="OOMKilled"): "1x40",
    _series(RESTARTS, "vision", "serve-0"): "3x40",
    # Restarted for another reason: nothing.
    _series(LAST, "vision", "serve-1", reason="Error"): "1x40",
    _series(RESTARTS, "vision", "serve-1"): "0x10 1x30",
    # A Job's pod that ended killed for memory (restartPolicy Never): fires while the pod is there.
    _series(ENDED, "vision", "job-abc", reason="OOMKilled"): "0x10 1x30",
    _series(ENDED, "vision", "job-ok", reason="Completed"): "1x40",
    # Not a tenant's namespace.
    _series(ENDED, "kube-system", "coredns-0", reason="OOMKilled"): "1x40",
}
EVALS = {
    "4m": [],
    "6m": [_labels("nlp-research", "train-0", "nlp"), _labels("vision", "job-abc", "vision")],
    "18m": [_labels("vision", "job-abc", "vision")],
}


def _promtool_test(tmp_path: Path, evals: dict[str, list[dict[str, str]]]) -> subprocess.CompletedProcess[str]:
    spec = _rule("mig-mixed")["spec"]
    for group in spec["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations")  # checked by `promtool check rules`; each case states its labels
    yaml = YAML(typ="safe")
    with (tmp_path / "rules.yml").open("w") as handle:
        yaml.dump(spec, handle)
    test = {
        "rule_files": ["rules.yml"],
        "evaluation_interval": "30s",
        "tests": [
            {
                "interval": "30s",
                "input_series": [{"series": series, "values": values} for series, values in SERIES.items()],
                "alert_rule_test": [
                    {"eval_time": at, "alertname": ALERT, "exp_alerts": [{"exp_labels": labels} for labels in alerts]}
                    for at, alerts in evals.items()
                ],
            }
        ],
    }
    with (tmp_path / "test.yml").open("w") as handle:
        yaml.dump(test, handle)
    return subprocess.run(
        [str(PROMTOOL), "test", "rules", "test.yml"], cwd=tmp_path, capture_output=True, text=True, check=False
    )


def test_a_tenants_container_killed_for_memory_fires_with_the_tenants_name(tmp_path: Path) -> None:
    result = _promtool_test(tmp_path, EVALS)
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_missing_alert_would_fail(tmp_path: Path) -> None:
    """The harness is not vacuous: leaving out the kill of a Job's pod makes promtool fail."""
    result = _promtool_test(tmp_path, {**EVALS, "18m": []})
    assert result.returncode != 0 and ALERT in result.stdout + result.stderr


def test_the_rule_checks_and_sits_where_no_tenant_writes(tmp_path: Path) -> None:
    rule = _rule("mig-mixed")
    assert (rule["apiVersion"], rule["kind"]) == ("monitoring.coreos.com/v1", "PrometheusRule")
    assert rule["metadata"]["namespace"] == "gpu-operator"
    tenants = {r["labels"]["tenant"] for group in rule["spec"]["groups"] for r in group["rules"]}
    assert tenants == {"nlp", "observers", "vision"}
    with (tmp_path / "rules.yml").open("w") as handle:
        YAML(typ="safe").dump(rule["spec"], handle)
    checked = subprocess.run([str(PROMTOOL), "check", "rules", str(tmp_path / "rules.yml")],
                             capture_output=True, text=True, check=False)  # fmt: skip
    assert checked.returncode == 0, checked.stdout + checked.stderr


def _rendered_with(tmp_path: Path, **kubernetes: Any) -> list[dict[str, Any]]:
    """The alert rules of mig-mixed with these `kubernetes:` settings changed."""
    yaml = YAML()
    data = yaml.load((DATA / "mig-mixed.yml").read_text())
    data["kubernetes"].update(kubernetes)
    with (tmp_path / "cluster.yml").open("w") as handle:
        yaml.dump(data, handle)
    (item,) = [r for r in render(load_cluster(tmp_path / "cluster.yml").resolved) if r.artifact.path == PATH]
    return yaml_load_all(item.content)


def test_the_prometheus_selects_it_by_its_labels_and_it_can_be_turned_off(tmp_path: Path) -> None:
    (rule,) = _rendered_with(tmp_path, alert_rule_labels={"release": "kube-prometheus-stack"})
    assert rule["metadata"]["labels"] == {
        "release": "kube-prometheus-stack",
        "app.kubernetes.io/managed-by": "gpuinfra",
    }
    assert _rendered_with(tmp_path, alert_rules=False) == []
    assert _rendered_with(tmp_path, tenants={}) == []
