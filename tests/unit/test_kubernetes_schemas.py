"""The Kubernetes artifacts against the real schemas, offline (the GPU Operator chart's values and the ClusterPolicy
it builds from them are in test_gpu_operator_chart.py):

- every manifest (Namespace, ResourceQuota, LimitRange, RoleBinding, ConfigMap) validates against the Kubernetes
  OpenAPI schemas that kubernetes-validate ships, in strict mode (unknown fields are errors);
- the MIG manager's ConfigMap holds a mig-parted v1 file that gpuinfra's own parser accepts, with every layout
  packing on the GPU models its device filter names.

Each validator is also shown a broken document, to prove it rejects what it should.
"""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest
from test_kubernetes_support import loaded, rendered, yaml_load, yaml_load_all

from gpuinfra import catalog
from gpuinfra import mig_layouts as mig

K8S_EXAMPLES = ["k8s-mig", "mig-mixed", "time-slicing"]
# An older Kubernetes release among those kubernetes-validate ships, so that the manifests hold on older clusters too;
# the schemas of these kinds have not changed since.
KUBERNETES_VERSION = "1.29.0"
MANIFESTS = [
    "gpu-operator/namespace.yaml",
    "gpu-operator/mig-parted-configmap.yaml",
    "gpu-operator/device-plugin-configmap.yaml",
    "k8s-tenants/tenants.yaml",
]


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
    # Every MIG profile the workers advertise is listed, 0 where mig_quota does not name it: a ResourceQuota leaves
    # a resource it does not list unbounded, and no queue stands in for it here.
    assert mixed[("ResourceQuota", "vision")]["spec"]["hard"] == {
        "requests.nvidia.com/gpu": "2",
        "requests.nvidia.com/mig-1g.10gb": "20",
        "requests.nvidia.com/mig-2g.20gb": "0",
        "requests.nvidia.com/mig-3g.20gb": "0",
        "requests.nvidia.com/mig-3g.40gb": "2",
    }
    assert set(mixed[("ResourceQuota", "observers")]["spec"]["hard"].values()) == {"0"}
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
