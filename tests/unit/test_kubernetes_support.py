"""Helpers (no tests) shared by the Kubernetes and MIG tests: the example clusters, their rendered artifacts, golden
files, and the ClusterPolicy the GPU Operator chart would create from gpuinfra's Helm values.

No Kubernetes API server runs here. The chart's values and its ClusterPolicy CRD are kept under
tests/unit/data/k8s/gpu-operator-chart; `cluster_policy` follows the chart's templates/clusterpolicy.yaml
for the sections gpuinfra sets, so that the spec Helm would submit can be checked against the CRD's schema.
"""

from __future__ import annotations

import os
from copy import deepcopy
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from ruamel.yaml import YAML

from gpuinfra.render.plan import Rendered, render
from gpuinfra.validate.load import LoadedCluster, load_cluster

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "unit" / "golden"
DATA = ROOT / "tests" / "unit" / "data" / "k8s"
REFERENCE = DATA / "gpu-operator-chart"
# Regenerate golden files with GPUINFRA_UPDATE_GOLDEN=1; without it a difference fails the test.
UPDATE = os.environ.get("GPUINFRA_UPDATE_GOLDEN") == "1"

EXAMPLES: dict[str, Path] = {
    "k8s-mig": ROOT / "inventories" / "k8s-mig" / "cluster.yml",
    "slurm-small": ROOT / "inventories" / "slurm-small" / "cluster.yml",
    "mig-mixed": DATA / "mig-mixed.yml",
    "slurm-mig": DATA / "slurm-mig.yml",
    "time-slicing": DATA / "time-slicing.yml",
}


@cache
def loaded(name: str) -> LoadedCluster:
    return load_cluster(EXAMPLES[name])


@cache
def rendered(name: str) -> dict[str, Rendered]:
    """Plan artifact path -> what `gpuinfra plan` renders for that example."""
    return {item.artifact.path: item for item in render(loaded(name).resolved)}


def yaml_load(text: str) -> Any:
    return YAML(typ="safe").load(text)


def yaml_load_all(text: str) -> list[Any]:
    return [doc for doc in YAML(typ="safe").load_all(text) if doc is not None]


def check_golden(path: Path, text: str) -> None:
    """Compare with the golden file, or write it when GPUINFRA_UPDATE_GOLDEN=1."""
    if UPDATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return
    if not path.exists():
        pytest.fail(f"{path.relative_to(ROOT)} is missing; create it with GPUINFRA_UPDATE_GOLDEN=1")
    assert text == path.read_text(), (
        f"{path.relative_to(ROOT)} differs from the rendered output; if the change is intended, regenerate it with "
        "GPUINFRA_UPDATE_GOLDEN=1 and review the diff"
    )


@cache
def chart_values() -> dict[str, Any]:
    data: dict[str, Any] = yaml_load((REFERENCE / "gpu-operator-values.yaml").read_text())
    return data


@cache
def cluster_policy_schema() -> dict[str, Any]:
    crd = yaml_load((REFERENCE / "gpu-operator-clusterpolicy-crd.yaml").read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]
    return schema


# --- the ClusterPolicy the chart creates ------------------------------------------------------------------------


def merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    """Helm's merge of user values over the chart's: maps merge key by key, anything else replaces."""
    out = deepcopy(base)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = deepcopy(value)
    return out


# Keys the chart's template copies into each spec section only when set (Helm's `if`: not empty, zero or false).
_IF_SET = ("repository", "image", "version", "imagePullPolicy", "imagePullSecrets", "resources", "env", "args")
_COPIED: dict[str, tuple[str, ...]] = {
    "operator": ("runtimeClass", "defaultGPUMode", "initContainer", "use_ocp_driver_toolkit"),
    "daemonsets": ("annotations", "tolerations", "priorityClassName", "updateStrategy"),
    "driver": (
        *_IF_SET,
        "startupProbe",
        "livenessProbe",
        "readinessProbe",
        "repoConfig",
        "certConfig",
        "licensingConfig",
        "virtualTopology",
        "kernelModuleConfig",
        "secretEnv",
        "hostNetwork",
    ),
    "toolkit": (*_IF_SET, "installDir", "hostNetwork"),
    "devicePlugin": (*_IF_SET, "hostNetwork"),
    "dcgm": (*_IF_SET, "hostNetwork"),
    "dcgmExporter": (*_IF_SET, "annotations", "serviceMonitor", "service", "hostPID", "hostNetwork", "hpcJobMapping"),
    "gfd": (*_IF_SET, "hostNetwork"),
    "migManager": (*_IF_SET, "gpuClientsConfig", "hostNetwork"),
    "nodeStatusExporter": (*_IF_SET, "hostNetwork"),
}
# Keys it always writes.
_ALWAYS: dict[str, tuple[str, ...]] = {
    "driver": ("enabled", "kernelModuleType", "usePrecompiled", "rdma"),
    "toolkit": ("enabled",),
    "devicePlugin": ("enabled",),
    "dcgm": ("enabled",),
    "dcgmExporter": ("enabled",),
    "gfd": ("enabled",),
    "migManager": ("enabled",),
    "nodeStatusExporter": ("enabled",),
    "psa": ("enabled",),
    "cdi": ("enabled",),
}


def cluster_policy(values: dict[str, Any], chart_version: str) -> dict[str, Any]:
    """The ClusterPolicy the chart renders from its values.yaml overlaid with `values`, for the sections the CRD
    requires and those gpuinfra sets. Renamed and reshaped keys follow the chart: `driver.upgradePolicy.
    gpuPodDeletion` becomes `podDeletion`, `nvidiaDriverCRD.enabled` becomes `useNvidiaDriverCRD`, and of the
    ConfigMap references only `name` and `default` reach the spec (`create` and `data` make the chart's own
    ConfigMaps)."""
    v = merge(chart_values(), values)
    spec: dict[str, Any] = {}
    for section in {*_COPIED, *_ALWAYS}:
        source = v.get(section, {})
        out = {key: deepcopy(source[key]) for key in _ALWAYS.get(section, ()) if key in source}
        out.update({key: deepcopy(source[key]) for key in _COPIED.get(section, ()) if source.get(key)})
        spec[section] = out
    if v["daemonsets"].get("rollingUpdate"):
        spec["daemonsets"]["rollingUpdate"] = {
            "maxUnavailable": str(v["daemonsets"]["rollingUpdate"]["maxUnavailable"])
        }
    if v["mig"].get("strategy"):
        spec["mig"] = {"strategy": v["mig"]["strategy"]}
    if v["cdi"].get("enabled") and v["cdi"].get("nriPluginEnabled"):
        spec["cdi"]["nriPluginEnabled"] = True
    driver = v["driver"]
    spec["driver"]["useNvidiaDriverCRD"] = bool(driver.get("nvidiaDriverCRD", {}).get("enabled"))
    spec["driver"]["manager"] = {k: deepcopy(driver["manager"][k]) for k in _IF_SET if driver["manager"].get(k)}
    policy = driver.get("upgradePolicy")
    if policy:
        spec["driver"]["upgradePolicy"] = {
            "autoUpgrade": bool(policy.get("autoUpgrade")),
            "maxParallelUpgrades": policy.get("maxParallelUpgrades") or 0,
            "maxUnavailable": policy.get("maxUnavailable") or "25%",
            "waitForCompletion": {
                "timeoutSeconds": policy["waitForCompletion"]["timeoutSeconds"],
                **_if_set(policy["waitForCompletion"], "podSelector"),
            },
            "podDeletion": {
                "force": bool(policy["gpuPodDeletion"].get("force")),
                "timeoutSeconds": policy["gpuPodDeletion"]["timeoutSeconds"],
                "deleteEmptyDir": bool(policy["gpuPodDeletion"].get("deleteEmptyDir")),
            },
            "drain": {
                "enable": bool(policy["drain"].get("enable")),
                "force": bool(policy["drain"].get("force")),
                **_if_set(policy["drain"], "podSelector"),
                "timeoutSeconds": policy["drain"]["timeoutSeconds"],
                "deleteEmptyDir": bool(policy["drain"].get("deleteEmptyDir")),
            },
        }
    plugin_config = v["devicePlugin"].get("config") or {}
    if plugin_config.get("name"):
        spec["devicePlugin"]["config"] = {"name": plugin_config["name"], "default": plugin_config.get("default", "")}
    mig_config = v["migManager"].get("config")
    if mig_config:
        spec["migManager"]["config"] = {**_if_set(mig_config, "name"), "default": mig_config.get("default", "")}
    exporter_config = v["dcgmExporter"].get("config") or {}
    if exporter_config.get("name"):
        spec["dcgmExporter"]["config"] = {"name": exporter_config["name"]}
    spec["nodeStatusExporter"].setdefault("version", chart_version)
    return {
        "apiVersion": "nvidia.com/v1",
        "kind": "ClusterPolicy",
        "metadata": {"name": "cluster-policy"},
        "spec": spec,
    }


def _if_set(source: dict[str, Any], key: str) -> dict[str, Any]:
    return {key: source[key]} if source.get(key) else {}
