"""The GPU Operator chart gpuinfra pins, rendered offline by `helm template` from the values the gpu_operator role
writes (values.yaml, then the cluster file's extra values, as `helm install -f ... -f ...` takes them):

- the ClusterPolicy the chart creates carries what the cluster file says: the MIG strategy and the MIG manager's
  ConfigMap, the device plugin's time-slicing ConfigMap, the driver and toolkit switches, CDI, the DCGM exporter and
  its ServiceMonitor, the daemonsets' tolerations;
- it validates against the chart's own CRD (its openAPIV3Schema, with jsonschema) and holds no field the CRD would
  prune; every other object of the release validates against the Kubernetes schemas (kubernetes-validate, strict);
- every key gpuinfra gives the chart is one of its values (Helm ignores any other without a word), by the key tree
  gpuinfra ships for `validate`, which must equal the tree generated from the chart now.

Each example renders once per session. Without the chart beside the checkout, or without helm, the tests that need
them skip and say which is missing; the shipped key tree is still checked against gpuinfra's own values.

Regenerate the shipped key tree with `GPUINFRA_UPDATE_GOLDEN=1 pytest tests/unit/test_gpu_operator_chart.py`.
"""

from __future__ import annotations

import json
import time
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
from test_kubernetes_support import (
    CHART_VERSION,
    DATA,
    UPDATE,
    Chart,
    HelmError,
    chart,
    chart_key_tree_file,
    chart_path,
    cluster_policy_schema,
    loaded,
    rendered,
    yaml_load,
)

from gpuinfra.errors import InvalidInput
from gpuinfra.render.vars import kubernetes as k8s_vars
from gpuinfra.validate import chart_values
from gpuinfra.validate.load import load_cluster

pytestmark = pytest.mark.tools  # runs Ansible or a system tool (tests/unit/tool_guard.py)

K8S_EXAMPLES = ["k8s-mig", "mig-mixed", "time-slicing"]
# As for gpuinfra's own manifests (test_kubernetes_schemas.py): an older release, so that the release holds on older
# clusters too; the schemas of its kinds have not changed since.
KUBERNETES_VERSION = "1.29.0"
# Kinds of the release that are custom resources: the ClusterPolicy is checked against the chart's CRD instead.
CUSTOM_KINDS = {"ClusterPolicy"}
# Rendering only for the ClusterPolicy: the node-feature-discovery subchart adds nothing to it.
WITHOUT_NFD = ("--set", "nfd.enabled=false")


def _variables(example: str) -> dict[str, Any]:
    return k8s_vars.group_vars(loaded(example).resolved)


def _values_files(example: str) -> tuple[str, ...]:
    """The values files the role hands to Helm: values.yaml and, when the cluster file has any, the extra values
    (written here as JSON, which is YAML; the role writes the same data with to_nice_yaml)."""
    files = [rendered(example)["gpu-operator/values.yaml"].content]
    extra = _variables(example)["gpu_operator_extra_values"]
    if extra:
        files.append(json.dumps(extra))
    return tuple(files)


def _values(example: str) -> dict[str, Any]:
    data: dict[str, Any] = yaml_load(rendered(example)["gpu-operator/values.yaml"].content)
    return data


@pytest.fixture(scope="session")
def gpu_operator() -> Chart:
    return chart()


@pytest.fixture(scope="session")
def releases(gpu_operator: Chart) -> dict[str, list[dict[str, Any]]]:
    """Every object of the release, per example: rendered once per session, with the subchart, as installed."""
    out: dict[str, list[dict[str, Any]]] = {}
    timings: list[float] = []
    for example in K8S_EXAMPLES:
        start = time.perf_counter()
        namespace = _variables(example)["gpu_operator_namespace"]
        out[example] = gpu_operator.template(*_values_files(example), namespace=namespace)
        timings.append(time.perf_counter() - start)
    print(f"helm template: {', '.join(f'{t:.2f}s' for t in timings)} for {', '.join(K8S_EXAMPLES)}")
    return out


def _cluster_policy(objects: list[dict[str, Any]]) -> dict[str, Any]:
    (policy,) = [o for o in objects if o["kind"] == "ClusterPolicy"]
    return policy


def _operator_container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    (operator,) = [o for o in objects if o["kind"] == "Deployment" and o["metadata"]["name"] == "gpu-operator"]
    (container,) = operator["spec"]["template"]["spec"]["containers"]
    return {"namespace": operator["metadata"]["namespace"], **container}


def fields_outside_schema(document: Any, schema: dict[str, Any], path: str = "") -> list[str]:
    """Fields a structural CRD schema does not declare, which the API server prunes without a word."""
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


# --- the ClusterPolicy -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("example", K8S_EXAMPLES)
def test_the_release_has_one_cluster_policy_of_the_pinned_chart(
    releases: dict[str, list[dict[str, Any]]], example: str
) -> None:
    policy = _cluster_policy(releases[example])
    assert policy["apiVersion"] == "nvidia.com/v1"
    assert policy["metadata"]["name"] == "cluster-policy"
    assert policy["metadata"]["labels"]["helm.sh/chart"] == f"gpu-operator-{CHART_VERSION}"
    container = _operator_container(releases[example])
    assert container["namespace"] == _variables(example)["gpu_operator_namespace"]
    assert container["image"] == f"nvcr.io/nvidia/gpu-operator:{CHART_VERSION}"


@pytest.mark.parametrize("example", K8S_EXAMPLES)
def test_cluster_policy_validates_against_the_crd(
    gpu_operator: Chart, releases: dict[str, list[dict[str, Any]]], example: str
) -> None:
    policy = _cluster_policy(releases[example])
    schema = cluster_policy_schema(gpu_operator.path)
    jsonschema.Draft7Validator(schema).validate(policy)
    assert fields_outside_schema(policy, schema) == []


@pytest.mark.parametrize("example", K8S_EXAMPLES)
def test_cluster_policy_carries_the_model(releases: dict[str, list[dict[str, Any]]], example: str) -> None:
    """The settings gpuinfra decides survive the chart's template into the spec the operator reads."""
    model = loaded(example).model
    k8s = model.kubernetes
    assert k8s is not None
    op = k8s.gpu_operator
    variables = _variables(example)
    spec = _cluster_policy(releases[example])["spec"]

    assert spec["mig"] == {"strategy": k8s.mig_strategy}
    assert spec["operator"]["runtimeClass"] == "nvidia"
    assert spec["cdi"]["enabled"] is model.container_toolkit.cdi
    # The host roles own the driver and the toolkit unless the cluster file hands them to the operator.
    assert spec["driver"]["enabled"] is (op.driver == "operator")
    assert spec["toolkit"]["enabled"] is (op.toolkit == "operator")
    assert spec["dcgmExporter"]["enabled"] is op.dcgm_exporter
    assert spec["dcgmExporter"]["serviceMonitor"]["enabled"] is (op.dcgm_exporter and op.service_monitor)
    # Helm replaces the chart's list of tolerations with gpuinfra's: one per taint of the GPU nodes.
    assert spec["daemonsets"]["tolerations"] == variables["gpu_operator_daemonset_tolerations"]
    tolerated = {(t["key"], t["operator"], t["effect"]) for t in spec["daemonsets"]["tolerations"]}
    taints = {(t.key, "Exists", t.effect) for t in k8s.gpu_node_taints}
    for group in model.node_groups.values():
        if "k8s_gpu_worker" in group.roles:
            taints |= {(t.key, "Exists", t.effect) for t in group.taints}
    assert taints <= tolerated

    plugin = rendered(example)["gpu-operator/device-plugin-configmap.yaml"].content
    if k8s.time_slicing is None:
        assert "config" not in spec["devicePlugin"] and yaml_load(plugin) is None
    else:
        configmap = yaml_load(plugin)
        assert spec["devicePlugin"]["config"] == {"name": configmap["metadata"]["name"], "default": "time-slicing"}
        assert configmap["metadata"]["namespace"] == op.namespace
        assert "time-slicing" in configmap["data"]

    mig_parted = yaml_load(rendered(example)["gpu-operator/mig-parted-configmap.yaml"].content)
    assert spec["migManager"]["enabled"] is True
    if variables["gpu_operator_mig_parted_config"]:
        assert spec["migManager"]["config"] == {"name": mig_parted["metadata"]["name"], "default": "all-disabled"}
        # The operator reads the key config.yaml of the ConfigMap; the default config must be in it.
        assert "all-disabled" in yaml_load(mig_parted["data"]["config.yaml"])["mig-configs"]
    else:  # the MIG manager generates its configuration from the hardware
        assert "name" not in spec["migManager"].get("config", {}) and mig_parted is None


def test_an_operator_driver_and_toolkit_get_gpuinfra_settings(releases: dict[str, list[dict[str, Any]]]) -> None:
    """time-slicing hands the driver and the toolkit to the operator: version, modules, mirror, upgrades, runtime."""
    k8s = loaded("time-slicing").model.kubernetes
    assert k8s is not None
    upgrade = k8s.gpu_operator.upgrade
    spec = _cluster_policy(releases["time-slicing"])["spec"]
    driver = spec["driver"]
    assert (driver["version"], driver["kernelModuleType"], driver["usePrecompiled"]) == ("570.172.08", "open", False)
    assert driver["repoConfig"] == {"configMapName": "local-apt-mirror"}
    policy = driver["upgradePolicy"]
    assert policy["autoUpgrade"] is upgrade.auto_upgrade
    assert policy["maxParallelUpgrades"] == upgrade.max_parallel_upgrades
    assert str(policy["maxUnavailable"]) == upgrade.max_unavailable
    # The chart's gpuPodDeletion is the CRD's podDeletion.
    assert policy["podDeletion"]["timeoutSeconds"] == upgrade.drain_timeout_seconds
    assert policy["podDeletion"]["deleteEmptyDir"] is upgrade.drain_delete_emptydir_data
    assert policy["drain"]["enable"] is upgrade.drain
    assert policy["drain"]["timeoutSeconds"] == upgrade.drain_timeout_seconds
    env = {e["name"]: e["value"] for e in spec["toolkit"]["env"]}
    assert env == {
        "CONTAINERD_CONFIG": "/etc/containerd/config.toml",
        "CONTAINERD_SOCKET": "/run/containerd/containerd.sock",
        "CONTAINERD_RUNTIME_CLASS": "nvidia",
        "CONTAINERD_SET_AS_DEFAULT": "false",
    }


def test_extra_values_reach_the_release(releases: dict[str, list[dict[str, Any]]]) -> None:
    """The cluster file's extra values come after gpuinfra's, merged key by key as Helm merges values files."""
    objects = releases["time-slicing"]
    spec = _cluster_policy(objects)["spec"]
    assert spec["validator"]["driver"]["env"] == [{"name": "DISABLE_DEV_CHAR_SYMLINK_CREATION", "value": "true"}]
    container = _operator_container(objects)
    # memory from the cluster file, cpu still the chart's default
    assert container["resources"]["limits"] == {"cpu": "500m", "memory": "512Mi"}


@pytest.mark.parametrize("example", K8S_EXAMPLES)
def test_the_release_validates_against_kubernetes_schemas(
    releases: dict[str, list[dict[str, Any]]], example: str
) -> None:
    checked = 0
    for document in releases[example]:
        if document["kind"] not in CUSTOM_KINDS:
            kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)
            checked += 1
    # the operator's and the node-feature-discovery subchart's objects
    assert checked > 20


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"mig": {"strategy": "mixd"}}, "'mixd' is not one of"),
        ({"driver": {"kernelModuleType": "closed"}}, "'closed' is not one of"),
        ({"driver": {"upgradePolicy": {"maxParallelUpgrades": "two"}}}, "'two' is not of type 'integer'"),
        ({"toolkit": {"env": [{"value": "x"}]}}, "'name' is a required property"),
    ],
)
def test_the_crd_rejects_wrong_values(gpu_operator: Chart, change: dict[str, Any], message: str) -> None:
    """The CRD check has teeth: a wrong value in gpuinfra's values would fail it."""
    objects = gpu_operator.template(*_values_files("time-slicing"), json.dumps(change), flags=WITHOUT_NFD)
    with pytest.raises(jsonschema.ValidationError, match=message):
        jsonschema.Draft7Validator(cluster_policy_schema(gpu_operator.path)).validate(_cluster_policy(objects))


def test_a_field_the_crd_lacks_is_caught(gpu_operator: Chart, releases: dict[str, list[dict[str, Any]]]) -> None:
    policy = json.loads(json.dumps(_cluster_policy(releases["k8s-mig"])))
    policy["spec"]["devicePlugin"]["timeSlicing"] = {"replicas": 4}
    assert fields_outside_schema(policy, cluster_policy_schema(gpu_operator.path)) == [".spec.devicePlugin.timeSlicing"]


def test_helm_reports_what_the_chart_refuses(gpu_operator: Chart) -> None:
    with pytest.raises(HelmError, match=r"devicePlugin\.config\.data cannot be empty"):
        gpu_operator.template("devicePlugin: {config: {create: true, name: x}}\n", flags=WITHOUT_NFD)


# --- the value keys --------------------------------------------------------------------------------------------


def _shipped_tree() -> chart_values.KeyTree:
    tree = chart_values.key_tree(CHART_VERSION)
    assert tree is not None, f"gpuinfra/data has no key tree for the pinned chart {CHART_VERSION}"
    return tree


def test_the_shipped_key_tree_is_the_charts() -> None:
    """Needs the chart, not helm."""
    path = resources.files("gpuinfra") / "data" / chart_values.tree_file(CHART_VERSION)
    text = chart_key_tree_file(chart_path())
    if UPDATE:
        with resources.as_file(path) as real:
            real.write_text(text)
        return
    assert path.read_text() == text, (
        f"gpuinfra/data/{chart_values.tree_file(CHART_VERSION)} is stale against the chart; regenerate it with "
        "GPUINFRA_UPDATE_GOLDEN=1 and review the diff"
    )
    assert chart_values.shipped_versions() == [CHART_VERSION], "ship the key tree of the pinned chart only"


@pytest.mark.parametrize("example", K8S_EXAMPLES)
def test_every_value_gpuinfra_sets_is_a_key_of_the_chart(example: str) -> None:
    """By the shipped tree: runs without the chart (the test above keeps the tree true to it)."""
    values = _values(example)
    assert chart_values.check(values, _shipped_tree(), CHART_VERSION) == []
    extra = _variables(example)["gpu_operator_extra_values"]
    assert chart_values.check(extra, _shipped_tree(), CHART_VERSION) == []


def test_a_misspelt_value_is_caught() -> None:
    values = _values("time-slicing")
    values["driver"]["upgradePolicy"]["podDeletion"] = {"timeoutSeconds": 60}  # the CRD's name, not the chart's
    values["dcgmExporter"]["serviceMonitors"] = {}
    found = chart_values.check(values, _shipped_tree(), CHART_VERSION)
    assert [(loc, message.split(";")[1].strip()) for loc, message in found] == [
        (("driver", "upgradePolicy", "podDeletion"), "did you mean 'gpuPodDeletion'?"),
        (("dcgmExporter", "serviceMonitors"), "did you mean 'serviceMonitor'?"),
    ]
    assert found[0][1].startswith(f"unknown key of the chart gpu-operator {CHART_VERSION} (Helm would ignore it)")


def test_free_maps_take_any_key_and_known_ones_only_their_kind() -> None:
    tree = _shipped_tree()
    free = {
        "operator": {
            "nodeSelector": {"node-role.kubernetes.io/control-plane": ""},
            "resources": {"limits": {"ephemeral-storage": "1Gi"}},
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {}}},
        },
        "daemonsets": {"labels": {"team": "gpu"}},
        # keys the CRD has where the chart copies a section verbatim, and the chart's default does not show
        "dcgmExporter": {"service": {"type": "NodePort"}, "hpcJobMapping": {"enabled": True}},
        "node-feature-discovery": {"worker": {"config": {"core": {"sleepInterval": "60s"}}}},
        "driver": {"version": None},  # null removes a default
    }
    assert chart_values.check(free, tree, CHART_VERSION) == []
    wrong = {"driver": {"version": {"branch": 570}, "upgradePolicy": 1}, "daemonsets": {"tolerations": {}}}
    assert [loc for loc, _ in chart_values.check(wrong, tree, CHART_VERSION)] == [
        ("driver", "version"),
        ("driver", "upgradePolicy"),
        ("daemonsets", "tolerations"),
    ]


def test_extra_values_for_another_chart_version_are_a_warning(tmp_path: Path) -> None:
    """gpuinfra knows the keys of the chart it pins only: for another version it says so, and still refuses what no
    chart can take safely."""
    text = (DATA / "time-slicing.yml").read_text().replace(f"chart_version: {CHART_VERSION}", "chart_version: v25.10.0")
    cluster = tmp_path / "cluster.yml"
    cluster.write_text(text.replace("memory: 512Mi", "memory: 512Mi, unknownKey: 1"))
    found = [(d.path, d.severity, d.message) for d in load_cluster(cluster).warnings]
    assert found == [
        (
            "kubernetes.gpu_operator.extra_values",
            "warning",
            f"keys not checked: gpuinfra knows the values of the chart gpu-operator {CHART_VERSION}, not v25.10.0, so "
            "a misspelt key is ignored by Helm without a word",
        )
    ]
    cluster.write_text(text.replace('value: "true"', "value: \"{{ lookup('env', 'HOME') }}\""))
    with pytest.raises(InvalidInput) as caught:
        load_cluster(cluster)
    assert [d.path for d in caught.value.diagnostics if d.severity == "error"] == [
        "kubernetes.gpu_operator.extra_values.validator.driver.env[0].value"
    ]
