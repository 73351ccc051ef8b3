"""Helpers (no tests) shared by the Kubernetes and MIG tests: the example clusters, their rendered artifacts, golden
files, the GPU Operator chart rendered by `helm template`, and the key tree of its values that gpuinfra ships.

No Kubernetes API server runs here. The released chart gpuinfra pins is read from beside this checkout
(../shared/reference/gpu-operator-chart/<version>/gpu-operator), and rendered by the helm of scripts/get-helm; without
either, the tests that need them skip and say which is missing.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from ruamel.yaml import YAML

from gpuinfra.model.kubernetes import GpuOperator
from gpuinfra.render.plan import Rendered, render
from gpuinfra.validate.load import LoadedCluster, load_cluster

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "unit" / "golden"
DATA = ROOT / "tests" / "unit" / "data" / "k8s"
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


# --- the GPU Operator chart, rendered by helm -------------------------------------------------------------------

# The released chart packages, unpacked, beside this checkout (../shared/reference/gpu-operator-chart/README.md).
CHARTS = ROOT.parent / "shared" / "reference" / "gpu-operator-chart"
CHART_VERSION: str = GpuOperator().chart_version
CHART_PATH = CHARTS / CHART_VERSION / "gpu-operator"
# The helm scripts/get-helm fetches (a static linux/amd64 build); GPUINFRA_HELM or a helm on PATH also do.
HELM_VERSION = "v4.1.4"
HELM_CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "gpuinfra" / f"helm-{HELM_VERSION}"


def find_helm() -> Path | None:
    for candidate in (os.environ.get("GPUINFRA_HELM"), HELM_CACHE / "helm", shutil.which("helm")):
        if candidate and os.access(candidate, os.X_OK):
            return Path(candidate)
    return None


@dataclass(frozen=True)
class Chart:
    """A pinned chart (gpu-operator unless said otherwise) and a helm to render it."""

    path: Path
    helm: Path
    release: str = "gpu-operator"

    def template(self, *values: str, namespace: str = "gpu-operator", flags: tuple[str, ...] = ()) -> list[Any]:
        """The objects `helm template` renders from the chart with these values files' contents, in order (later
        files win, as for `helm install -f a -f b`)."""
        with tempfile.TemporaryDirectory() as tmp:
            files: list[str] = []
            for index, text in enumerate(values):
                path = Path(tmp) / f"values-{index}.yaml"
                path.write_text(text)
                files += ["--values", str(path)]
            done = subprocess.run(
                [str(self.helm), "template", self.release, str(self.path), "--namespace", namespace, *files, *flags],
                capture_output=True,
                text=True,
                check=False,
                timeout=120,
            )
        if done.returncode != 0:
            raise HelmError(done.stderr.strip())
        return yaml_load_all(done.stdout)


class HelmError(Exception):
    """helm refused to render the chart; the message is its stderr."""


# The chart lives beside a checkout, never in it. Under CI this skip fails the run as any other (tests/skip_policy.py):
# CI's checkout has ../shared/reference beside it.
REFERENCE_ABSENT = "reference material absent:"


def chart_path() -> Path:
    """The pinned chart's folder, or a skip that says the reference material beside the checkout is missing."""
    if not (CHART_PATH / "Chart.yaml").is_file():
        pytest.skip(
            f"{REFERENCE_ABSENT} {CHART_PATH} is missing: the released GPU Operator chart {CHART_VERSION} is not "
            "beside this checkout"
        )
    return CHART_PATH


def chart() -> Chart:
    """The pinned chart and a helm. With the chart there, a missing helm is a failure of the setup, never a skip."""
    path = chart_path()
    helm = find_helm()
    if helm is None:
        pytest.fail(f"helm is missing, and the chart is at {path}: run scripts/get-helm (or set GPUINFRA_HELM)")
    return Chart(path, helm)


@cache
def cluster_policy_schema(chart: Path) -> dict[str, Any]:
    """The openAPIV3Schema of the chart's ClusterPolicy CRD."""
    crd = yaml_load((chart / "crds" / "nvidia.com_clusterpolicies.yaml").read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]
    return schema


# --- the chart's value keys, as gpuinfra ships them (gpuinfra/validate/chart_values.py) -------------------------

# Keys that hold a Kubernetes object or a map with keys of the user's choosing (label, annotation and resource
# names), which the chart passes on verbatim for the API server to check: any sub-keys are allowed there, whatever
# the chart's default happens to show (operator.nodeSelector has one label, operator.affinity one preference).
FREE_KEYS = frozenset(
    {
        "labels",
        "annotations",
        "nodeSelector",
        "affinity",
        "resources",
        "securityContext",
        "podSecurityContext",
        "startupProbe",
        "livenessProbe",
        "readinessProbe",
    }
)
_REFERENCE = re.compile(r"\.Values((?:\.[A-Za-z_][A-Za-z0-9_]*)+)")
_VERBATIM = re.compile(r"toYaml\s+\(?\s*\.Values((?:\.[A-Za-z_][A-Za-z0-9_]*)+)")
# A key the templates read but values.yaml does not set: known, of a kind nothing says.
_READ = "read"


def _kinds(value: Any) -> Any:
    """values.yaml as a key tree: an empty map is the user's to fill, a null is anything the templates accept."""
    if isinstance(value, dict):
        return {str(k): _kinds(v) for k, v in value.items()} if value else "map"
    if value is None:
        return "any"
    return "list" if isinstance(value, list) else "scalar"


def _union(a: Any, b: Any) -> Any:
    """What two sources say about one key, together: known keys add up; a free map or `any` on either side wins, as
    the side that documents the key as free-form is the one that reads it."""
    if a == _READ:
        return b
    if b == _READ:
        return a
    if isinstance(a, dict) and isinstance(b, dict):
        out = dict(a)
        for key, value in b.items():
            out[key] = _union(out[key], value) if key in out else value
        return out
    if a == b:
        return a
    other = b if isinstance(a, dict) else a if isinstance(b, dict) else None
    return other if other == "map" else "any"


def _chart_tree(chart: Path) -> dict[str, Any]:
    """One chart's values.yaml plus the keys its templates read (deepest first, so that a key read both whole and
    by its parts becomes a mapping of those parts)."""
    values = yaml_load((chart / "values.yaml").read_text())
    tree: dict[str, Any] = _kinds(values) if values else {}
    references = {
        tuple(match.group(1)[1:].split("."))
        for path in sorted((chart / "templates").rglob("*"))
        if path.is_file()
        for match in _REFERENCE.finditer(path.read_text())
    }
    for parts in sorted(references, key=lambda p: (-len(p), p)):
        _fill(tree, list(parts))
    return tree


def _fill(tree: dict[str, Any], parts: list[str]) -> None:
    node: Any = tree
    for index, part in enumerate(parts):
        if not isinstance(node, dict):
            return  # below a leaf that values.yaml already describes
        if part not in node:
            node[part] = _READ if index == len(parts) - 1 else {}
        node = node[part]


def _crd_tree(schema: dict[str, Any]) -> Any:
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return "any"
    if "properties" in schema:
        return {key: _crd_tree(value) for key, value in schema["properties"].items()}
    kind = schema.get("type")
    return {"object": "map", "array": "list", None: "any"}.get(kind, "scalar")


def _copied_into_cluster_policy(chart: Path) -> dict[str, Any]:
    """Sections templates/clusterpolicy.yaml copies verbatim (`toYaml .Values.x.y`) into the ClusterPolicy's
    `spec.x.y`: their keys are the CRD's there, which may hold more than the chart's default shows."""
    spec = cluster_policy_schema(chart)["properties"]["spec"]
    tree: dict[str, Any] = {}
    for match in _VERBATIM.finditer((chart / "templates" / "clusterpolicy.yaml").read_text()):
        parts = match.group(1)[1:].split(".")
        node: dict[str, Any] | None = spec
        for part in parts:
            node = (node or {}).get("properties", {}).get(part)
        if node is None:
            continue  # copied under another name: the chart's own keys stand
        sub: Any = _crd_tree(node)
        for part in reversed(parts):
            sub = {part: sub}
        tree = _union(tree, sub)
    return tree


def _free(tree: Any) -> Any:
    if not isinstance(tree, dict):
        return "any" if tree == _READ else tree
    return {key: "map" if key in FREE_KEYS and isinstance(value, dict) else _free(value) for key, value in tree.items()}


def chart_key_tree(chart: Path) -> dict[str, Any]:
    """The key tree of the chart's values, as gpuinfra/data ships it (the format is in chart_values.py): values.yaml
    and the keys its templates read, each subchart's under its name (and its `global`), and the CRD's keys for the
    sections the chart copies verbatim into the ClusterPolicy."""
    tree = _chart_tree(chart)
    for subchart in sorted(p for p in (chart / "charts").iterdir() if (p / "Chart.yaml").is_file()):
        sub = _chart_tree(subchart)
        shared = sub.pop("global", None)
        tree = _union(tree, {subchart.name: sub})
        if shared is not None:
            tree = _union(tree, {"global": shared})
    tree = _union(tree, _copied_into_cluster_policy(chart))
    free: dict[str, Any] = _free(tree)
    return free


def chart_key_tree_file(chart: Path) -> str:
    """The JSON file gpuinfra ships for the chart."""
    package = chart.parent / f"gpu-operator-{CHART_VERSION}.tgz"
    document = {
        "chart": "gpu-operator",
        "version": CHART_VERSION,
        "package_sha256": hashlib.sha256(package.read_bytes()).hexdigest() if package.is_file() else None,
        "generated_by": "tests/unit/test_gpu_operator_chart.py (GPUINFRA_UPDATE_GOLDEN=1)",
        "values": chart_key_tree(chart),
    }
    return json.dumps(document, indent=1, sort_keys=True) + "\n"
