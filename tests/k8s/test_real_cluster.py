"""The Kubernetes end state after `gpuinfra apply`, checked against a real cluster with GPU nodes.

No Kubernetes API server can run on the development and CI machines, so these tests skip there, saying so. On a real
cluster, point them at it and at the cluster file it was applied from:

    GPUINFRA_K8S_KUBECONFIG=~/.kube/config GPUINFRA_K8S_CLUSTER=cluster.yml pytest tests/k8s

They only read, or ask the API server for a dry run: they create, change and delete nothing.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from skip_policy import K8S_ABSENT

from gpuinfra import k8s_resources
from gpuinfra.render.vars import kubernetes as k8s_vars
from gpuinfra.render.vars import mig as mig_vars
from gpuinfra.validate.load import LoadedCluster, load_cluster

KUBECONFIG = os.environ.get("GPUINFRA_K8S_KUBECONFIG", "")
CLUSTER = os.environ.get("GPUINFRA_K8S_CLUSTER", "")

pytestmark = pytest.mark.skipif(
    not (KUBECONFIG and CLUSTER and shutil.which("kubectl")),
    reason=f"{K8S_ABSENT} these tests need a real one with NVIDIA GPU nodes (set GPUINFRA_K8S_KUBECONFIG and "
    "GPUINFRA_K8S_CLUSTER, and put kubectl on PATH); no API server can run on this machine",
)


def kubectl(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["kubectl", f"--kubeconfig={Path(KUBECONFIG).expanduser()}", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def get(*args: str) -> Any:
    result = kubectl("get", *args, "-o", "json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@cache
def cluster() -> LoadedCluster:
    return load_cluster(CLUSTER)


@cache
def variables() -> dict[str, Any]:
    return k8s_vars.group_vars(cluster().resolved)


def test_cluster_policy_is_ready() -> None:
    policy = get("clusterpolicies.nvidia.com", "cluster-policy")
    k8s = cluster().model.kubernetes
    assert k8s is not None
    assert policy["status"]["state"] == "ready"
    assert policy["spec"]["mig"]["strategy"] == k8s.mig_strategy
    assert policy["spec"]["driver"]["enabled"] is (k8s.gpu_operator.driver == "operator")


def test_gpu_nodes_advertise_the_capacity_the_model_expects() -> None:
    """The device plugin's allocatable resources equal what gpuinfra computes for quotas and warnings."""
    k8s = cluster().model.kubernetes
    assert k8s is not None
    layouts = mig_vars.layouts(cluster().resolved)
    for host in cluster().resolved.with_role(k8s_resources.WORKER_ROLE):
        allocatable = get("node", host.name)["status"]["allocatable"]
        advertised = {k: int(v) for k, v in allocatable.items() if k.startswith("nvidia.com/")}
        assert advertised == dict(k8s_resources.host_capacity(host, k8s, layouts)), host.name


def test_gpu_nodes_carry_the_model_labels_taints_and_mig_config() -> None:
    mig_labels = variables()["gpu_operator_mig_node_configs"]
    for group in variables()["k8s_tenants_nodes"]:
        for name in group["nodes"]:
            node = get("node", name)
            labels = node["metadata"].get("labels", {})
            assert group["labels"].items() <= labels.items(), name
            taints = [
                {"key": t["key"], "value": t.get("value", ""), "effect": t["effect"]}
                for t in node["spec"].get("taints", [])
            ]
            assert all(t in taints for t in group["taints"]), name
            if name in mig_labels:
                assert labels.get("nvidia.com/mig.config") == mig_labels[name]
                assert labels.get("nvidia.com/mig.config.state") == "success", name


def test_tenant_namespaces_have_their_quota_limits_and_access() -> None:
    resources = variables()["k8s_tenants_gpu_resources"]
    for name, tenant in variables()["k8s_tenants_tenants"].items():
        namespace = tenant["namespace"]
        hard = get("resourcequota", "gpuinfra-gpu-quota", "-n", namespace)["spec"]["hard"]
        for resource in resources:
            assert hard[f"requests.{resource}"] == str(tenant["gpu_quota"]), name
        for subject in tenant["subjects"]:
            who = {"User": "--as", "Group": "--as-group", "ServiceAccount": "--as"}[subject["kind"]]
            user = subject["name"]
            if subject["kind"] == "ServiceAccount":
                user = f"system:serviceaccount:{subject.get('namespace', namespace)}:{user}"
            extra = ["--as=gpuinfra-test"] if subject["kind"] == "Group" else []
            verb = "list" if tenant["access"] == "view" else "create"
            result = kubectl("auth", "can-i", verb, "pods", "-n", namespace, f"{who}={user}", *extra)
            assert result.stdout.strip() == "yes", f"{name}: {subject}"


def test_the_tenants_alert_rule_is_given_to_the_clusters_prometheus() -> None:
    """The PrometheusRule the API server stored (its CRD's schema accepted it), one rule per tenant; no tenant may
    change it."""
    found = variables()
    if not (found["k8s_tenants_alert_rules"] and found["k8s_tenants_tenants"]):
        pytest.skip("the cluster file turns the tenants' alert rules off, or has no tenant")
    rule = get("prometheusrule", "gpuinfra-tenants", "-n", found["k8s_tenants_alert_rules_namespace"])
    tenants = {r["labels"]["tenant"] for group in rule["spec"]["groups"] for r in group["rules"]}
    assert tenants == set(found["k8s_tenants_tenants"])
    for tenant in found["k8s_tenants_tenants"].values():
        for subject in tenant["subjects"]:
            if subject["kind"] == "User":
                result = kubectl("auth", "can-i", "patch", "prometheusrules", "-n",
                                 found["k8s_tenants_alert_rules_namespace"], f"--as={subject['name']}")  # fmt: skip
                assert result.stdout.strip() == "no", subject


def test_a_pod_above_the_gpu_quota_is_refused() -> None:
    """Quota admission runs on a server-side dry run, so nothing is created."""
    for name, tenant in variables()["k8s_tenants_tenants"].items():
        too_many = tenant["gpu_quota"] + 1
        limits = tenant["gpus_per_container"]
        if limits and too_many > limits["max"]:
            continue  # the LimitRange would refuse it first
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "gpuinfra-quota-probe", "namespace": tenant["namespace"]},
            "spec": {
                "containers": [
                    {"name": "probe", "image": "busybox", "resources": {"limits": {"nvidia.com/gpu": str(too_many)}}}
                ]
            },
        }
        result = kubectl("create", "--dry-run=server", "-f", "-", stdin=json.dumps(pod))
        assert result.returncode != 0 and "exceeded quota" in result.stderr, f"{name}: {result.stderr}"


# --- the health program's identities (roles/k8s_node_health) ---------------------------------------------------

HEALTH_NAMESPACE = os.environ.get("GPUINFRA_K8S_HEALTH_NAMESPACE", "gpuinfra-system")
PROBE_TAINT = "gpuinfra.io/gpu-unhealthy=probe:NoSchedule"


def _health_account(node: str) -> str:
    return f"--as=system:serviceaccount:{HEALTH_NAMESPACE}:gpuinfra-health-{node}"


def _gpu_workers() -> list[str]:
    return sorted(h.name for h in cluster().resolved.with_role(k8s_resources.WORKER_ROLE))


def test_each_gpu_node_has_a_filled_in_health_token() -> None:
    """The token controller filled each node's token Secret in (the token itself is never read here)."""
    for node in _gpu_workers():
        result = kubectl(
            "get", "secret", f"gpuinfra-health-{node}", "-n", HEALTH_NAMESPACE,
            "-o", "go-template={{.type}} {{if .data.token}}filled{{end}}",
        )  # fmt: skip
        assert result.returncode == 0, f"{node}: {result.stderr}"
        assert result.stdout == "kubernetes.io/service-account-token filled", node


def test_a_gpu_nodes_health_identity_may_taint_its_own_node_and_no_other() -> None:
    """Server-side dry runs as each node's service account: authorization and admission run, nothing is stored.
    The same taint on any other node (a control-plane node or another GPU node) is Forbidden."""
    every_node = [n["metadata"]["name"] for n in get("nodes")["items"]]
    for node in _gpu_workers():
        as_node = _health_account(node)
        own = kubectl(as_node, "taint", "node", node, PROBE_TAINT, "--overwrite", "--dry-run=server")
        assert own.returncode == 0, f"{node}: {own.stderr}"
        note = kubectl(as_node, "annotate", "node", node, "gpuinfra.io/gpu-unhealthy-reason=probe", "--overwrite",
                       "--dry-run=server")  # fmt: skip
        assert note.returncode == 0, f"{node}: {note.stderr}"
        others = [n for n in every_node if n != node]
        if not others:
            pytest.skip("the cluster has a single node: there is no other node to be refused")
        for other in others:
            refused = kubectl(as_node, "taint", "node", other, PROBE_TAINT, "--overwrite", "--dry-run=server")
            assert refused.returncode != 0 and "forbidden" in refused.stderr.lower(), f"{node} on {other}"


def test_a_gpu_nodes_health_identity_can_do_nothing_else() -> None:
    """`kubectl auth can-i` asks the API server (a SelfSubjectAccessReview, which stores nothing)."""
    for node in _gpu_workers():
        as_node = _health_account(node)
        allowed = {
            ("get", f"node/{node}"): "yes",
            ("patch", f"node/{node}"): "yes",
            ("list", "nodes"): "yes",  # read-only: the breaker counts its node group's tainted nodes
            ("delete", f"node/{node}"): "no",
            ("patch", f"nodes/{node}", "--subresource=status"): "no",
            ("watch", "nodes"): "no",
            ("get", "secrets", f"-n={HEALTH_NAMESPACE}"): "no",
            ("create", "pods", "-n=default"): "no",
        }
        for question, answer in allowed.items():
            result = kubectl("auth", "can-i", *question, as_node)
            assert result.stdout.strip() == answer, f"{node}: can-i {' '.join(question)}: {result.stdout}"
