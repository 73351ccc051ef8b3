"""The Kubernetes artifacts against the real schemas, offline:

- every Helm value gpuinfra sets is a key of the GPU Operator chart's values.yaml (a misspelt key is silently ignored
  by Helm);
- the ClusterPolicy the chart builds from those values validates against the CRD's openAPIV3Schema, and holds no
  field the CRD lacks (the API server would prune it without a word);
- every manifest (Namespace, ResourceQuota, LimitRange, RoleBinding, ConfigMap) validates against the Kubernetes
  OpenAPI schemas that kubernetes-validate ships, in strict mode (unknown fields are errors);
- the MIG manager's ConfigMap holds a mig-parted v1 file that gpuinfra's own parser accepts, with every layout
  packing on the GPU models its device filter names.

Each validator is also shown a broken document, to prove it rejects what it should.
"""

from __future__ import annotations

from typing import Any

import jsonschema
import kubernetes_validate
import pytest
from test_kubernetes_support import (
    chart_values,
    cluster_policy,
    cluster_policy_schema,
    loaded,
    rendered,
    yaml_load,
    yaml_load_all,
)

from gpuinfra import catalog
from gpuinfra.validate import mig

K8S_EXAMPLES = ["k8s-mig", "mig-mixed", "time-slicing"]
# The oldest Kubernetes release kubernetes-validate ships that the GPU Operator v25.10 still supports; the schemas of
# these kinds have not changed since.
KUBERNETES_VERSION = "1.29.0"
MANIFESTS = [
    "gpu-operator/namespace.yaml",
    "gpu-operator/mig-parted-configmap.yaml",
    "gpu-operator/device-plugin-configmap.yaml",
    "k8s-tenants/tenants.yaml",
]


def unknown_keys(values: Any, chart: Any, path: str = "") -> list[str]:
    """Paths in `values` that the chart's values do not have. Lists and scalars are leaves; so are maps the chart
    leaves empty for the user to fill (labels, annotations, ConfigMap data)."""
    if not isinstance(values, dict) or not isinstance(chart, dict) or (path and chart == {}):
        return []
    out: list[str] = []
    for key, value in values.items():
        where = f"{path}.{key}" if path else str(key)
        if key not in chart:
            out.append(where)
        else:
            out.extend(unknown_keys(value, chart[key], where))
    return out


def fields_outside_schema(document: Any, schema: dict[str, Any], path: str = "") -> list[str]:
    """Fields a structural CRD schema does not declare, which the API server prunes."""
    if isinstance(document, dict):
        properties = schema.get("properties")
        extra = schema.get("additionalProperties")
        if properties is None:
            if isinstance(extra, dict):
                return [p for k, v in document.items() for p in fields_outside_schema(v, extra, f"{path}.{k}")]
            return []
        out: list[str] = []
        for key, value in document.items():
            if key in properties:
                out.extend(fields_outside_schema(value, properties[key], f"{path}.{key}"))
            else:
                out.append(f"{path}.{key}")
        return out
    if isinstance(document, list) and isinstance(schema.get("items"), dict):
        return [
            p for i, item in enumerate(document) for p in fields_outside_schema(item, schema["items"], f"{path}[{i}]")
        ]
    return []


def _values(example: str) -> dict[str, Any]:
    data: dict[str, Any] = yaml_load(rendered(example)["gpu-operator/values.yaml"].content)
    return data


def _policy(values: dict[str, Any]) -> dict[str, Any]:
    return cluster_policy(values, "v25.10.0")


def _validate_policy(policy: dict[str, Any]) -> None:
    jsonschema.Draft7Validator(cluster_policy_schema()).validate(policy)


# --- Helm values -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("example", K8S_EXAMPLES)
def test_every_value_is_a_key_of_the_chart(example: str) -> None:
    assert unknown_keys(_values(example), chart_values()) == []


def test_a_misspelt_value_is_caught() -> None:
    values = _values("time-slicing")
    values["driver"]["upgradePolicy"]["podDeletion"] = {"timeoutSeconds": 60}  # the CRD's name, not the chart's
    values["dcgmExporter"]["serviceMonitors"] = {}
    assert unknown_keys(values, chart_values()) == ["driver.upgradePolicy.podDeletion", "dcgmExporter.serviceMonitors"]


# --- ClusterPolicy ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("example", K8S_EXAMPLES)
def test_cluster_policy_validates_against_the_crd(example: str) -> None:
    policy = _policy(_values(example))
    _validate_policy(policy)
    assert fields_outside_schema(policy, cluster_policy_schema()) == []


@pytest.mark.parametrize("example", K8S_EXAMPLES)
def test_cluster_policy_carries_the_model(example: str) -> None:
    """The settings gpuinfra decides survive the chart's template into the spec the operator reads."""
    k8s = loaded(example).model.kubernetes
    assert k8s is not None
    spec = _policy(_values(example))["spec"]
    assert spec["mig"]["strategy"] == k8s.mig_strategy
    assert spec["driver"]["enabled"] is (k8s.gpu_operator.driver == "operator")
    assert spec["toolkit"]["enabled"] is (k8s.gpu_operator.toolkit == "operator")
    assert spec["dcgmExporter"]["serviceMonitor"]["enabled"] is k8s.gpu_operator.service_monitor
    policy = spec["driver"]["upgradePolicy"]
    assert policy["maxParallelUpgrades"] == k8s.gpu_operator.upgrade.max_parallel_upgrades
    assert str(policy["maxUnavailable"]) == k8s.gpu_operator.upgrade.max_unavailable
    assert policy["drain"]["enable"] is k8s.gpu_operator.upgrade.drain
    assert policy["podDeletion"]["deleteEmptyDir"] is k8s.gpu_operator.upgrade.drain_delete_emptydir_data
    tolerated = {(t["key"], t["effect"]) for t in spec["daemonsets"]["tolerations"]}
    taints = {(t.key, t.effect) for t in k8s.gpu_node_taints}
    for group in loaded(example).model.node_groups.values():
        taints |= {(t.key, t.effect) for t in group.taints}
    assert taints <= tolerated


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"mig": {"strategy": "mixd"}}, "'mixd' is not one of"),
        ({"driver": {"kernelModuleType": "closed"}}, "'closed' is not one of"),
        ({"driver": {"upgradePolicy": {"maxParallelUpgrades": "two"}}}, "'two' is not of type 'integer'"),
        ({"toolkit": {"env": [{"value": "x"}]}}, "'name' is a required property"),
    ],
)
def test_the_crd_schema_rejects_wrong_values(change: dict[str, Any], message: str) -> None:
    from test_kubernetes_support import merge

    with pytest.raises(jsonschema.ValidationError, match=message):
        _validate_policy(_policy(merge(_values("time-slicing"), change)))


def test_a_field_the_crd_lacks_is_caught() -> None:
    policy = _policy(_values("k8s-mig"))
    policy["spec"]["devicePlugin"]["timeSlicing"] = {"replicas": 4}
    assert fields_outside_schema(policy, cluster_policy_schema()) == [".spec.devicePlugin.timeSlicing"]


# --- Kubernetes manifests --------------------------------------------------------------------------------------


def _documents(example: str, path: str) -> list[dict[str, Any]]:
    return yaml_load_all(rendered(example)[path].content)


@pytest.mark.parametrize("path", MANIFESTS)
@pytest.mark.parametrize("example", K8S_EXAMPLES)
def test_manifests_validate_against_kubernetes_schemas(example: str, path: str) -> None:
    for document in _documents(example, path):
        kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)


def test_tenant_manifests_have_every_kind() -> None:
    kinds = {
        (d["kind"], d["metadata"]["namespace"])
        for d in _documents("mig-mixed", "k8s-tenants/tenants.yaml")
        if d["kind"] != "Namespace"
    }
    assert ("ResourceQuota", "nlp-research") in kinds
    assert ("LimitRange", "vision") in kinds
    assert ("RoleBinding", "observers") in kinds


def test_quota_limits_and_access_say_what_the_model_says() -> None:
    docs = {
        (d["kind"], d["metadata"].get("namespace", d["metadata"]["name"])): d
        for d in _documents("time-slicing", "k8s-tenants/tenants.yaml")
    }
    # Time-sliced GPUs renamed to nvidia.com/gpu.shared: the quota and the limits cover both names.
    assert docs[("ResourceQuota", "inference")]["spec"]["hard"] == {
        "requests.nvidia.com/gpu": "24",
        "requests.nvidia.com/gpu.shared": "24",
    }
    (limit,) = docs[("LimitRange", "inference")]["spec"]["limits"]
    assert (
        limit["min"]
        == limit["max"]
        == limit["default"]
        == limit["defaultRequest"]
        == {
            "nvidia.com/gpu": "1",
            "nvidia.com/gpu.shared": "1",
        }
    )
    binding = docs[("RoleBinding", "inference")]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "admin"}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "serving", "namespace": "inference"}]

    mixed = {
        (d["kind"], d["metadata"].get("namespace", d["metadata"]["name"])): d
        for d in _documents("mig-mixed", "k8s-tenants/tenants.yaml")
    }
    assert mixed[("ResourceQuota", "vision")]["spec"]["hard"] == {
        "requests.nvidia.com/gpu": "2",
        "requests.nvidia.com/mig-1g.10gb": "20",
        "requests.nvidia.com/mig-3g.40gb": "2",
    }
    # Only a max: the default request stays 0, or every container of the namespace would get 2 GPUs.
    (limit,) = mixed[("LimitRange", "vision")]["spec"]["limits"]
    assert limit == {
        "type": "Container",
        "max": {"nvidia.com/gpu": "2"},
        "default": {"nvidia.com/gpu": "0"},
        "defaultRequest": {"nvidia.com/gpu": "0"},
    }


@pytest.mark.parametrize(
    ("document", "message"),
    [
        (
            {
                "apiVersion": "v1",
                "kind": "ResourceQuota",
                "metadata": {"name": "q", "namespace": "n"},
                "spec": {"hard": {"requests.nvidia.com/gpu": ["2"]}},
            },
            "is not valid under any of the given schemas",
        ),
        (
            {
                "apiVersion": "v1",
                "kind": "LimitRange",
                "metadata": {"name": "l", "namespace": "n"},
                "spec": {"limits": [{"max": {"nvidia.com/gpu": "1"}, "maximum": {}}]},
            },
            "maximum",
        ),
        (
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "RoleBinding",
                "metadata": {"name": "b"},
                "roleRef": {"kind": "ClusterRole", "name": "edit"},
                "subjects": [],
            },
            "apiGroup",
        ),
    ],
)
def test_kubernetes_validate_rejects_broken_manifests(document: dict[str, Any], message: str) -> None:
    with pytest.raises(kubernetes_validate.ValidationError, match=message):
        kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)


# --- the MIG manager's and the device plugin's configuration ---------------------------------------------------


@pytest.mark.parametrize("example", ["k8s-mig", "mig-mixed"])
def test_mig_manager_config_is_valid_mig_parted(example: str) -> None:
    (configmap,) = _documents(example, "gpu-operator/mig-parted-configmap.yaml")
    configs, problems = mig.parse_parted(yaml_load(configmap["data"]["config.yaml"]))
    assert [p for p in problems if p.severity == "error"] == []
    checked = 0
    for name, entries in configs.items():
        for entry in entries:
            if not entry.get("mig-enabled"):
                continue
            for pci_id in entry["device-filter"]:
                spec = catalog.by_pci_id(pci_id)
                assert spec is not None, f"{name}: {pci_id} is no catalogued GPU"
                assert mig.check_layout(spec, entry["mig-devices"]) == [], f"{name} on {spec.name}"
                checked += 1
    assert checked > 0


def test_device_plugin_config_matches_the_mig_strategy() -> None:
    for example in ("k8s-mig", "time-slicing"):
        k8s = loaded(example).model.kubernetes
        assert k8s is not None and k8s.time_slicing is not None
        (configmap,) = _documents(example, "gpu-operator/device-plugin-configmap.yaml")
        config = yaml_load(configmap["data"]["time-slicing"])
        assert config["version"] == "v1"
        assert config["flags"] == {"migStrategy": k8s.mig_strategy}
        assert config["sharing"]["timeSlicing"]["resources"] == [
            {"name": "nvidia.com/gpu", "replicas": k8s.time_slicing.replicas}
        ]
    assert _documents("mig-mixed", "gpu-operator/device-plugin-configmap.yaml") == []
