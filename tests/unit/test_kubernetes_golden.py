"""Golden files of the Kubernetes artifacts `gpuinfra plan` shows: the role variables, the GPU Operator's Helm values
and manifests, and the tenant manifests. What the chart builds from the values is checked on the chart itself
(test_gpu_operator_chart.py).

Regenerate with `GPUINFRA_UPDATE_GOLDEN=1 pytest tests/unit/test_kubernetes_golden.py` and review the diff.
"""

from __future__ import annotations

import json

import pytest
from test_kubernetes_support import GOLDEN, check_golden, loaded, rendered, yaml_load

from gpuinfra.render.vars import kubernetes as k8s_vars

K8S_EXAMPLES = ["k8s-mig", "mig-mixed", "time-slicing"]
FILES = [
    "gpu-operator/values.yaml",
    "gpu-operator/namespace.yaml",
    "gpu-operator/mig-parted-configmap.yaml",
    "gpu-operator/device-plugin-configmap.yaml",
    "k8s-tenants/tenants.yaml",
]


@pytest.mark.parametrize("example", K8S_EXAMPLES)
def test_role_variables_match_golden(example: str) -> None:
    variables = k8s_vars.group_vars(loaded(example).resolved)
    check_golden(GOLDEN / "kubernetes" / example / "vars.json", json.dumps(variables, indent=2) + "\n")


@pytest.mark.parametrize("path", FILES)
@pytest.mark.parametrize("example", K8S_EXAMPLES)
def test_artifact_matches_golden(example: str, path: str) -> None:
    check_golden(GOLDEN / "kubernetes" / example / path, rendered(example)[path].content)


def test_slurm_cluster_has_no_kubernetes_artifacts() -> None:
    assert k8s_vars.group_vars(loaded("slurm-small").resolved) == {}
    assert not [path for path in rendered("slurm-small") if path.startswith(("gpu-operator/", "k8s-tenants/"))]


def test_example_values_say_what_the_model_says() -> None:
    """Spot checks that the golden files hold what the cluster files ask for, so a regenerated golden file cannot
    silently bless a wrong rendering."""
    mig = yaml_load(rendered("k8s-mig")["gpu-operator/values.yaml"].content)
    assert mig["mig"] == {"strategy": "mixed"}
    assert mig["driver"] == {"enabled": False} and mig["toolkit"] == {"enabled": False}
    assert mig["migManager"]["config"] == {"name": "gpuinfra-mig-parted", "default": "all-disabled"}
    assert mig["devicePlugin"]["config"] == {"name": "gpuinfra-device-plugin", "default": "time-slicing"}

    ts = yaml_load(rendered("time-slicing")["gpu-operator/values.yaml"].content)
    assert ts["driver"]["enabled"] is True
    assert ts["driver"]["version"] == "570.172.08"
    assert ts["driver"]["kernelModuleType"] == "open"
    assert ts["driver"]["repoConfig"] == {"configMapName": "local-apt-mirror"}
    policy = ts["driver"]["upgradePolicy"]
    assert (policy["maxParallelUpgrades"], policy["maxUnavailable"]) == (2, "1")
    assert policy["drain"] == {"enable": True, "timeoutSeconds": 600, "deleteEmptyDir": True}
    assert ts["cdi"] == {"enabled": False}
    assert {e["name"]: e["value"] for e in ts["toolkit"]["env"]}["CONTAINERD_RUNTIME_CLASS"] == "nvidia"
    assert ts["dcgmExporter"] == {"enabled": True, "serviceMonitor": {"enabled": False}}
    assert "migManager" not in ts

    plugin = yaml_load(rendered("time-slicing")["gpu-operator/device-plugin-configmap.yaml"].content)
    sharing = yaml_load(plugin["data"]["time-slicing"])["sharing"]["timeSlicing"]
    assert sharing["renameByDefault"] is True
    assert sharing["resources"] == [{"name": "nvidia.com/gpu", "replicas": 4}]


def test_mig_nodes_are_labelled_with_the_config_they_apply() -> None:
    variables = k8s_vars.group_vars(loaded("mig-mixed").resolved)
    labels = variables["gpu_operator_mig_node_configs"]
    # h100 GPUs 0-5 carry two layouts and 6-7 none: one config composed for the group; the A100 has one layout.
    assert labels == {"h100-01": "h100", "h100-02": "h100", "a100-01": "halves"}
    entries = variables["gpu_operator_mig_parted_config"]["mig-configs"]["h100"]
    assert [(e["devices"], e["mig-enabled"]) for e in entries] == [
        ([0, 1, 2, 3], True),
        ([4, 5], True),
        ([6, 7], False),
    ]


def test_tenants_and_gpu_nodes() -> None:
    variables = k8s_vars.group_vars(loaded("mig-mixed").resolved)
    tenants = variables["k8s_tenants_tenants"]
    assert tenants["nlp"]["namespace"] == "nlp-research"
    # Every profile of the workers, 0 where the tenant has no quota of it (a ResourceQuota leaves others unbounded).
    assert tenants["nlp"]["mig_quota"] == {"1g.10gb": 0, "2g.20gb": 4, "3g.20gb": 8, "3g.40gb": 0}
    assert tenants["nlp"]["subjects"][1] == {"kind": "ServiceAccount", "name": "pipeline", "namespace": "ci"}
    assert tenants["observers"] == {
        "namespace": "observers",
        "gpu_quota": 0,
        "mig_quota": {"1g.10gb": 0, "2g.20gb": 0, "3g.20gb": 0, "3g.40gb": 0},
        "gpus_per_container": None,
        "subjects": [{"kind": "User", "name": "auditor@example.org"}],
        "access": "view",
    }
    nodes = {tuple(n["nodes"]): n for n in variables["k8s_tenants_nodes"]}
    h100 = nodes[("h100-01", "h100-02")]
    assert h100["labels"] == {
        "gpuinfra.io/gpu": "true",
        "gpuinfra.io/pool": "training",
        "gpuinfra.io/gpu-model": "h100-sxm5-80gb",  # what the queues' flavors select
        "gpuinfra.io/node-group": "h100",  # the pool of the health checks' breaker
    }
    assert h100["taints"] == [
        {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},
        {"key": "gpuinfra.io/pool", "value": "training", "effect": "NoSchedule"},
    ]
    assert nodes[("a100-01",)]["taints"] == [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]
