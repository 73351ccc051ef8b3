"""GPU capacity of the Kubernetes workers, and quotas beyond it warned about when the cluster file is validated."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from test_kubernetes_support import DATA, ROOT, loaded

from gpuinfra import k8s_resources
from gpuinfra.validate import kubernetes as k8s_rules
from gpuinfra.validate.load import load_cluster


def test_capacity_of_the_examples() -> None:
    # k8s-mig: 2 L4 nodes x 4 GPUs x 4 time-sliced replicas; 4 H100 nodes with GPUs 0-3 in sevenths, 4-5 balanced
    # (3g + 2g + 2 x 1g) and 6-7 whole (7g).
    assert k8s_resources.gpu_capacity(loaded("k8s-mig").resolved) == Counter(
        {
            "nvidia.com/gpu": 32,
            "nvidia.com/mig-1g.10gb": 4 * (4 * 7 + 2 * 2),
            "nvidia.com/mig-3g.40gb": 8,
            "nvidia.com/mig-2g.20gb": 8,
            "nvidia.com/mig-7g.80gb": 8,
        }
    )
    # mig-mixed: 2 H100 nodes with GPUs 6-7 whole; one A100-40GB node with 4 GPUs in halves.
    assert k8s_resources.gpu_capacity(loaded("mig-mixed").resolved) == Counter(
        {
            "nvidia.com/gpu": 4,
            "nvidia.com/mig-1g.10gb": 2 * (4 * 7 + 2),
            "nvidia.com/mig-3g.40gb": 4,
            "nvidia.com/mig-2g.20gb": 4,
            "nvidia.com/mig-3g.20gb": 8,
        }
    )
    # Renamed time-sliced GPUs: 3 nodes x 4 GPUs x 4 replicas, all as nvidia.com/gpu.shared.
    assert k8s_resources.gpu_capacity(loaded("time-slicing").resolved) == Counter({"nvidia.com/gpu.shared": 48})


def test_the_examples_fit() -> None:
    for example in ("mig-mixed", "time-slicing"):
        assert k8s_rules.capacity_warnings(loaded(example).resolved) == []


OVER = (DATA / "mig-mixed.yml").read_text()
OVER = OVER.replace(
    "gpu_quota: 2\n      mig_quota: {1g.10gb: 20, 3g.40gb: 2}",
    "gpu_quota: 5\n      mig_quota: {1g.10gb: 70, 4g.40gb: 1}",
)
OVER = OVER.replace(
    "mig_quota: {2g.20gb: 4, 3g.20gb: 8}", "mig_quota: {1g.10gb: 10, 3g.20gb: 8}\n      gpus_per_container: {max: 3}"
)


def test_quotas_beyond_capacity_are_warnings_at_validate_time(tmp_path: Path) -> None:
    cluster = tmp_path / "cluster.yml"
    cluster.write_text(OVER)
    found = [(d.path, d.message) for d in load_cluster(cluster).warnings]
    assert found == [
        ("kubernetes.tenants[vision].gpu_quota", "5 nvidia.com/gpu is more than the k8s_gpu_worker hosts provide: 4"),
        (
            "kubernetes.tenants[vision].mig_quota.1g.10gb",
            "70 1g.10gb slices is more than the k8s_gpu_worker hosts provide: 60",
        ),
        (
            "kubernetes.tenants[vision].mig_quota.4g.40gb",
            "no k8s_gpu_worker host has 4g.40gb MIG slices (available: 1g.10gb, 2g.20gb, 3g.20gb, 3g.40gb)",
        ),
        (
            "kubernetes.tenants[nlp].gpus_per_container.max",
            "3 nvidia.com/gpu per container is more than any k8s_gpu_worker host has (2), so such a pod never "
            "schedules",
        ),
        (
            "kubernetes.tenants",
            "the tenants' gpu_quota add up to 7 nvidia.com/gpu, more than the 4 the k8s_gpu_worker hosts provide: "
            "quotas are overcommitted",
        ),
        (
            "kubernetes.tenants",
            "the tenants' 1g.10gb MIG quotas add up to 80, more than the 60 slices the k8s_gpu_worker hosts provide: "
            "quotas are overcommitted",
        ),
    ]


@pytest.mark.tools
def test_validate_prints_the_warnings_with_their_place_and_succeeds(tmp_path: Path) -> None:
    cluster = tmp_path / "cluster.yml"
    cluster.write_text(OVER)
    result = subprocess.run(
        [sys.executable, "-m", "gpuinfra", "validate", str(cluster)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    line = OVER.splitlines().index("      gpu_quota: 5") + 1
    assert f"{cluster}:{line}:7: warning: kubernetes.tenants[vision].gpu_quota: 5 nvidia.com/gpu" in result.stderr
    assert "(6 warnings)" in result.stderr


def test_settings_the_device_plugin_ignores(tmp_path: Path) -> None:
    cluster = tmp_path / "cluster.yml"
    text = OVER.replace("mig_strategy: mixed", "mig_strategy: none")
    cluster.write_text(text)
    found = {(d.path, d.message) for d in load_cluster(cluster).warnings}
    assert (
        "kubernetes.mig_strategy",
        "k8s_gpu_worker node groups a100, h100 have MIG layouts but mig_strategy is none, so the device plugin does "
        "not advertise their slices; set mixed (or single)",
    ) in found
    assert (
        "kubernetes.tenants[vision].mig_quota",
        "MIG quotas need mig_strategy: mixed (it is none); they are not applied",
    ) in found


def test_time_sliced_limits_above_one_are_warned(tmp_path: Path) -> None:
    cluster = tmp_path / "cluster.yml"
    cluster.write_text((DATA / "time-slicing.yml").read_text().replace("{min: 1, max: 1}", "{min: 1, max: 2}"))
    found = [(d.path, d.message) for d in load_cluster(cluster).warnings]
    assert found == [
        (
            "kubernetes.tenants[inference].gpus_per_container.max",
            "time-slicing rejects containers that ask for more than one shared GPU (fail_requests_greater_than_one), "
            "so a max of 2 is never usable; set max: 1",
        )
    ]
