"""The teams' queues on Kubernetes (the kueue role), checked against Kueue itself without an API server:

- every object of `kueue/queues.yaml` validates against Kueue's own CRDs (v1beta2, the storage version of the pinned
  release): their openAPIV3Schema with jsonschema, no field the API server would prune, and every CEL rule
  (x-kubernetes-validations) evaluated with a CEL interpreter, as the API server evaluates them on create;
- the objects carry the cluster file: a flavor per GPU model that selects its nodes, each team's quota per flavor,
  its borrowing and lending limits (borrowing always bounded), the priority classes, a LocalQueue `default` per
  namespace, and a ResourceQuota that allows exactly what the team's queue may admit, no more, since it is what
  bounds the team wherever Kueue does not admit its pods;
- the pinned chart, rendered by `helm template` with gpuinfra's values, runs the released controller image with a
  configuration that keeps every setting of the chart's own and manages the tenants' namespaces.

The chart and the CRDs come from the reference archive beside the checkout (../shared/reference/kueue).
"""

from __future__ import annotations

import hashlib
import tarfile
from collections import Counter
from functools import cache
from pathlib import Path
from typing import Any

import celpy
import jsonschema
import kubernetes_validate
import pytest
from celpy.adapter import json_to_cel
from celpy.evaluation import CELEvalError
from test_gpu_operator_chart import KUBERNETES_VERSION, fields_outside_schema
from test_kubernetes_support import REFERENCE_ABSENT, ROOT, Chart, find_helm, loaded, rendered, yaml_load, yaml_load_all

from gpuinfra.model.kubernetes import Queues
from gpuinfra.render.plan import render
from gpuinfra.render.vars import kubernetes as k8s_vars
from gpuinfra.validate.load import load_cluster

pytestmark = pytest.mark.tools  # runs Ansible or a system tool (tests/unit/tool_guard.py)

VERSION = Queues().chart_version
ARCHIVE = ROOT.parent / "shared" / "reference" / "kueue" / f"kueue-v{VERSION}-chart-and-crds.tar.gz"
ARCHIVE_SHA256 = "505d6dac8fe722cd61a88f915ea5822d5fafbb9c9c6300121664ba3ced9de353"  # its README
API_VERSION = "kueue.x-k8s.io/v1beta2"
EXAMPLE = "k8s-mig"
# What gpuinfra adds to the chart's controller configuration; everything else is the chart's own.
ADDED = {"manageJobsWithoutQueueName", "managedJobsNamespaceSelector", "waitForPodsReady", "resources"}


@pytest.fixture(scope="session")
def kueue(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The release's chart and CRDs, unpacked from the reference archive after its checksum is checked."""
    if not ARCHIVE.is_file():
        pytest.skip(
            f"{REFERENCE_ABSENT} {ARCHIVE} is missing: Kueue {VERSION}'s chart and CRDs are not beside the checkout"
        )
    assert hashlib.sha256(ARCHIVE.read_bytes()).hexdigest() == ARCHIVE_SHA256
    folder = tmp_path_factory.mktemp("kueue")
    with tarfile.open(ARCHIVE) as archive:
        archive.extractall(folder, filter="data")
    return folder / f"kueue-v{VERSION}"


@cache
def _schemas(root: Path) -> dict[str, dict[str, Any]]:
    """Kind -> the v1beta2 openAPIV3Schema of each Kueue CRD."""
    out = {}
    for path in (root / "config" / "components" / "crd" / "bases").glob("*.yaml"):
        crd = yaml_load(path.read_text())
        (version,) = [v for v in crd["spec"]["versions"] if v["name"] == API_VERSION.split("/")[1]]
        out[crd["spec"]["names"]["kind"]] = version["schema"]["openAPIV3Schema"]
    return out


def _queue_objects(example: str = EXAMPLE) -> list[dict[str, Any]]:
    objects: list[dict[str, Any]] = [o for o in yaml_load_all(rendered(example)["kueue/queues.yaml"].content) if o]
    return objects


def broken_rules(document: Any, schema: dict[str, Any], path: str = "") -> list[str]:
    """The CEL rules of the schema (x-kubernetes-validations) the document breaks, as the API server checks them on
    create (rules about the old object, `oldSelf`, only apply to updates)."""
    out = []
    for rule in schema.get("x-kubernetes-validations", []):
        if "oldSelf" in rule["rule"]:
            continue
        environment = celpy.Environment()
        program = environment.program(environment.compile(rule["rule"]))
        result = program.evaluate({"self": json_to_cel(document)})
        if isinstance(result, CELEvalError) or not result:
            out.append(f"{path or '.'}: {rule.get('message', rule['rule'])}")
    if isinstance(document, dict):
        properties = schema.get("properties", {})
        for key, value in document.items():
            child = properties.get(key) or schema.get("additionalProperties")
            if isinstance(child, dict):
                out += broken_rules(value, child, f"{path}.{key}")
    elif isinstance(document, list) and isinstance(schema.get("items"), dict):
        for index, item in enumerate(document):
            out += broken_rules(item, schema["items"], f"{path}[{index}]")
    return out


# --- the queue objects against Kueue's CRDs --------------------------------------------------------------------


def test_every_queue_object_validates_against_kueues_crds(kueue: Path) -> None:
    schemas = _schemas(kueue)
    objects = _queue_objects()
    assert {o["kind"] for o in objects} == {"ResourceFlavor", "WorkloadPriorityClass", "ClusterQueue", "LocalQueue"}
    for document in objects:
        schema = schemas[document["kind"]]
        assert document["apiVersion"] == API_VERSION
        jsonschema.Draft7Validator(schema).validate(document)
        assert fields_outside_schema(document, schema) == [], document["metadata"]["name"]
        assert broken_rules(document, schema) == [], document["metadata"]["name"]


def test_the_cel_rules_are_evaluated(kueue: Path) -> None:
    """A ClusterQueue whose borrowers may evict while nobody may reclaim breaks one of the CRD's rules."""
    schema = _schemas(kueue)["ClusterQueue"]
    (queue,) = [o for o in _queue_objects() if o["kind"] == "ClusterQueue" and o["metadata"]["name"] == "vision"]
    queue["spec"]["preemption"] = {"reclaimWithinCohort": "Never", "borrowWithinCohort": {"policy": "LowerPriority"}}
    assert len(broken_rules(queue, schema)) == 1
    queue["spec"]["resourceGroups"][0]["coveredResources"].append("nvidia.com/gpu.shared")
    assert len(broken_rules(queue, schema)) == 2  # a flavor now covers fewer resources than its group


# --- the objects carry the cluster file -------------------------------------------------------------------------


def _by_kind(kind: str) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in _queue_objects() if o["kind"] == kind}


def _quota(queue: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    """(flavor, resource) -> its quota and limits."""
    return {
        (flavor["name"], resource["name"]): {k: v for k, v in resource.items() if k != "name"}
        for group in queue["spec"]["resourceGroups"]
        for flavor in group["flavors"]
        for resource in flavor["resources"]
    }


def test_a_flavor_per_gpu_model_selects_the_nodes_labelled_with_it() -> None:
    flavors = _by_kind("ResourceFlavor")
    assert set(flavors) == {"h100-sxm5-80gb", "l4", "mig"}
    labels = {
        node: group["labels"][k8s_vars.MODEL_LABEL]
        for group in k8s_vars.group_vars(loaded(EXAMPLE).resolved)["k8s_tenants_nodes"]
        for node in group["nodes"]
    }
    assert labels["l4-01"] == "l4" and labels["h100-01"] == "h100-sxm5-80gb"
    assert flavors["l4"]["spec"]["nodeLabels"] == {k8s_vars.MODEL_LABEL: "l4"}
    assert "nodeLabels" not in flavors["mig"]["spec"]  # MIG resources exist only on the nodes that have them
    for flavor in flavors.values():  # admitted pods get the GPU nodes' tolerations
        assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in flavor["spec"]["tolerations"]


def test_each_team_queues_within_its_quota_and_limits() -> None:
    queues = _by_kind("ClusterQueue")
    assert set(queues) == {"vision", "nlp", "platform"}
    assert {q["spec"]["cohortName"] for q in queues.values()} == {"gpuinfra"}
    vision, nlp = _quota(queues["vision"]), _quota(queues["nlp"])
    assert vision[("l4", "nvidia.com/gpu")] == {"nominalQuota": 8, "borrowingLimit": 8}
    assert vision[("h100-sxm5-80gb", "nvidia.com/gpu")] == {"nominalQuota": 0, "borrowingLimit": 8}
    assert vision[("mig", "nvidia.com/mig-1g.10gb")] == {"nominalQuota": 14, "borrowingLimit": 8}
    # No borrowing limit in the file: 0, never unbounded; a team lends at most what it has.
    assert nlp[("l4", "nvidia.com/gpu")] == {"nominalQuota": 16, "borrowingLimit": 0, "lendingLimit": 8}
    assert nlp[("mig", "nvidia.com/mig-1g.10gb")] == {"nominalQuota": 0, "borrowingLimit": 0, "lendingLimit": 0}
    assert queues["nlp"]["spec"]["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": "nlp"}}
    assert queues["nlp"]["spec"]["preemption"] == {
        "withinClusterQueue": "LowerPriority",
        "reclaimWithinCohort": "Any",
        "borrowWithinCohort": {"policy": "Never"},
    }
    local = {
        (o["metadata"]["namespace"], o["metadata"]["name"]): o["spec"]["clusterQueue"]
        for o in _queue_objects()
        if o["kind"] == "LocalQueue"
    }
    assert local == {("nlp", "default"): "nlp", ("platform", "default"): "platform", ("vision", "default"): "vision"}
    assert {n: o["value"] for n, o in _by_kind("WorkloadPriorityClass").items()} == {
        "production": 1000,
        "research": 100,
        "preemptible": 10,
    }


def _resource_quotas(text: str) -> dict[str, dict[str, str]]:
    """Namespace -> the hard limits of its ResourceQuota, from tenants.yaml."""
    return {o["metadata"]["namespace"]: o["spec"]["hard"] for o in yaml_load_all(text) if o["kind"] == "ResourceQuota"}


def _most_kueue_admits(queues: list[dict[str, Any]]) -> dict[str, Counter[str]]:
    """Namespace -> the most of each resource its ClusterQueue can ever hold, read from the rendered ClusterQueues as
    Kueue reads them: per flavor its nominalQuota plus its borrowingLimit, at most what the cohort's other queues
    lend (their lendingLimit, or all of their nominalQuota). A queue without a borrowingLimit fails: it is unbounded."""
    quotas = {q["metadata"]["name"]: _quota(q) for q in queues}
    out: dict[str, Counter[str]] = {}
    for queue in queues:
        name = queue["metadata"]["name"]
        namespace = queue["spec"]["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"]
        most: Counter[str] = Counter()
        for (flavor, resource), limits in quotas[name].items():
            assert "borrowingLimit" in limits, f"{name}: {flavor}/{resource} may borrow without bound"
            lent = sum(
                other.get((flavor, resource), {}).get(
                    "lendingLimit", other.get((flavor, resource), {}).get("nominalQuota", 0)
                )
                for other_name, other in quotas.items()
                if other_name != name
            )
            most[resource] += limits["nominalQuota"] + min(limits["borrowingLimit"], lent)
        out[namespace] = most
    return out


def _check_quotas_follow_the_queues(tenants: str, queues: list[dict[str, Any]]) -> dict[str, dict[str, str]]:
    """Each namespace's ResourceQuota allows exactly what its queue may admit: no more, or a pod Kueue does not admit
    takes GPUs the queue would not give it; no less, or the ResourceQuota refuses a pod of an admitted job. GPU
    resources no queue covers are 0 (Kueue admits none)."""
    quotas, admits = _resource_quotas(tenants), _most_kueue_admits(queues)
    assert set(quotas) == set(admits)
    for namespace, hard in quotas.items():
        limited = {key.removeprefix("requests."): int(value) for key, value in hard.items()}
        assert set(admits[namespace]) <= set(limited), namespace
        assert limited == {r: admits[namespace][r] for r in limited}, namespace
    return quotas


def test_a_teams_resource_quota_is_its_quota_plus_what_it_may_borrow() -> None:
    """A team without a borrowing limit (nlp, and platform with no quota) must not get the cohort's every GPU (24)
    as its ResourceQuota, or wherever Kueue does not admit its pods (before the kueue role runs, or without Kueue)
    it could take every team's GPUs. Borrowing is always bounded, 0 unless the file says more, and the
    ResourceQuota allows the team's quota plus what it may borrow, which is what its queue admits."""
    quotas = _check_quotas_follow_the_queues(
        rendered(EXAMPLE)["k8s-tenants/tenants.yaml"].content, list(_by_kind("ClusterQueue").values())
    )
    assert quotas["nlp"]["requests.nvidia.com/gpu"] == "16"  # its quota: it has no borrowing limit
    assert quotas["platform"]["requests.nvidia.com/gpu"] == "0"  # no quota, no borrowing: nothing
    assert quotas["vision"]["requests.nvidia.com/gpu"] == "16"  # 8 + a borrowing limit of 8, which nlp lends
    assert quotas["vision"]["requests.nvidia.com/mig-1g.10gb"] == "14"  # nobody else has any to lend
    assert quotas["vision"]["requests.nvidia.com/mig-2g.20gb"] == "4"  # nlp's 4, within the borrowing limit of 8
    # A ResourceQuota leaves what it does not list unbounded: every profile the workers advertise is listed.
    assert quotas["platform"]["requests.nvidia.com/mig-7g.80gb"] == "0"


# Two GPU models, each its own flavor with its own borrowing limit; nlp lends one L4, ops lends nothing.
BORROWING = """\
name: k8s-borrowing
os: ubuntu24.04
node_groups:
  control: {hosts: cp1, roles: [k8s_control]}
  h100: {hosts: h100-01, roles: [k8s_gpu_worker], gpu: {model: H100-SXM5-80GB, count: 8}}
  l4: {hosts: l4-01, roles: [k8s_gpu_worker], gpu: {model: L4, count: 4}}
driver: {version: "570.172.08", source: {type: nvidia}}
container_toolkit: {runtimes: [containerd]}
kubernetes:
  queues: {}
  tenants:
    vision: {gpu_quota: 4, queue: {gpus: {H100-SXM5-80GB: 3, L4: 1}, borrowing_limit: 3}}
    nlp: {gpu_quota: 6, queue: {gpus: {H100-SXM5-80GB: 4, L4: 2}, borrowing_limit: 2, lending_limit: 1}}
    ops: {gpu_quota: 2, queue: {gpus: {H100-SXM5-80GB: 1, L4: 1}, lending_limit: 0}}
"""


def test_the_resource_quota_adds_what_a_team_may_borrow_of_each_model(tmp_path: Path, kueue: Path) -> None:
    """Kueue's borrowing limit is per flavor, one per GPU model, and a team borrows only what the others lend; the
    ResourceQuota counts every model's GPUs together, so it adds what may be borrowed of each model."""
    cluster = tmp_path / "cluster.yml"
    cluster.write_text(BORROWING)
    files = {item.artifact.path: item.content for item in render(load_cluster(cluster).resolved)}
    tenants = [o for o in yaml_load_all(files["k8s-tenants/tenants.yaml"]) if o]
    for document in tenants:
        kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)
    queues = [o for o in yaml_load_all(files["kueue/queues.yaml"]) if o]
    schemas = _schemas(kueue)
    for document in queues:
        jsonschema.Draft7Validator(schemas[document["kind"]]).validate(document)
        assert broken_rules(document, schemas[document["kind"]]) == []
    quotas = _check_quotas_follow_the_queues(
        files["k8s-tenants/tenants.yaml"], [q for q in queues if q["kind"] == "ClusterQueue"]
    )
    # vision: 4, plus 1 H100 and 1 L4 (its limit is 3 of each, but nlp lends 1 of each and ops none).
    assert quotas["vision"] == {"requests.nvidia.com/gpu": "6"}
    # nlp: 6 + what vision lends of each model, within its limit of 2: 2 H100s and 1 L4.
    assert quotas["nlp"] == {"requests.nvidia.com/gpu": "9"}
    assert quotas["ops"] == {"requests.nvidia.com/gpu": "2"}  # no borrowing limit: its quota alone


# --- the chart ----------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def chart(kueue: Path) -> Chart:
    helm = find_helm()
    if helm is None:
        pytest.fail("helm is missing: run scripts/get-helm (or set GPUINFRA_HELM)")
    return Chart(kueue / "charts" / "kueue", helm, release="kueue")


def _objects(chart: Chart, *values: str) -> list[dict[str, Any]]:
    return [o for o in chart.template(*values, namespace="kueue-system") if o]


@pytest.fixture(scope="module")
def release(chart: Chart) -> list[dict[str, Any]]:
    return _objects(chart, rendered(EXAMPLE)["kueue/values.yaml"].content)


def _config(objects: list[dict[str, Any]]) -> dict[str, Any]:
    (config_map,) = [o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "kueue-manager-config"]
    config: dict[str, Any] = yaml_load(config_map["data"]["controller_manager_config.yaml"])
    return config


def test_the_chart_runs_the_released_controller(release: list[dict[str, Any]]) -> None:
    (deployment,) = [o for o in release if o["kind"] == "Deployment"]
    (manager,) = [c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "manager"]
    assert manager["image"] == f"registry.k8s.io/kueue/kueue:v{VERSION}"
    assert manager["imagePullPolicy"] == "IfNotPresent"


def test_the_controller_keeps_the_charts_settings_and_manages_the_tenants(chart: Chart, release: Any) -> None:
    config = _config(release)
    assert {k: v for k, v in config.items() if k not in ADDED} == _config(_objects(chart))
    assert config["manageJobsWithoutQueueName"] is True
    assert config["managedJobsNamespaceSelector"]["matchExpressions"] == [
        {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["nlp", "platform", "vision"]}
    ]
    assert config["waitForPodsReady"] == {"timeout": "600s", "blockAdmission": False}
    assert "nvidia.com/" not in " ".join(config["resources"]["excludeResourcePrefixes"])


def test_every_other_object_of_the_release_validates_against_kubernetes(release: list[dict[str, Any]]) -> None:
    checked = 0
    for document in release:
        if document["apiVersion"].startswith(("kueue.x-k8s.io/", "visibility.kueue.x-k8s.io/")):
            continue
        if document["kind"] == "CustomResourceDefinition":
            continue
        kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)
        checked += 1
    assert checked > 10
