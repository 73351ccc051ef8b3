"""One source of truth: each role's argument_specs, its defaults, and the variables the model renders agree.

- Each default is written once, as the `default:` of its option in the role's meta/argument_specs.yml;
  defaults/main.yml, where Ansible takes the value from, is generated from it by scripts/role_docs.py
  (tests/unit/test_role_docs.py fails on a stale one). Every option carries its role's prefix.
- A role used on its own behaves as gpuinfra's minimal cluster file: for every variable the model renders, the
  role's default (templated with the rendered variables) equals what a minimal Slurm or Kubernetes cluster file
  renders, where that file leaves the setting at the model's default. `EXCEPTIONS` lists the variables that
  cannot agree, each with its reason.
- Shared places are spelled once: every role's secrets folder, and the job-mapping folder the Slurm prolog writes
  and the DCGM exporter reads.
"""

from __future__ import annotations

import re
import tomllib
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template
from ruamel.yaml import YAML

from gpuinfra.model.monitoring import DcgmExporter
from gpuinfra.redact import default_secrets_dir
from gpuinfra.render.inventory import group_vars, groups, host_vars
from gpuinfra.resolve import ResolvedCluster
from gpuinfra.validate.load import load_cluster

ROOT = Path(__file__).resolve().parents[2]
ROLES = sorted(p.name for p in (ROOT / "roles").iterdir() if p.is_dir()) if (ROOT / "roles").exists() else []
EXAMPLES = sorted((ROOT / "inventories").glob("*/cluster.yml"))
# Variables the inventory sets for every host that are not role options: connection and cluster-wide facts.
SHARED_PREFIXES = ("ansible_", "gpuinfra_")

# The smallest cluster files of each kind: everything they leave out takes the model's default.
MINIMAL = {
    "slurm": """
name: mini
node_groups:
  head: {hosts: ctl01, roles: [slurm_controller, slurm_dbd, slurm_login, monitoring]}
  gpu: {hosts: gpu01, roles: [slurm_compute], gpu: {model: A100-SXM4-80GB, count: 2}}
driver: {version: "535.261.03"}
slurm:
  partitions:
    gpu: {node_groups: [gpu]}
""",
    "kubernetes": """
name: mini
node_groups:
  control: {hosts: ctl01, roles: [k8s_control, monitoring]}
  gpu: {hosts: gpu01, roles: [k8s_gpu_worker], gpu: {model: A100-SXM4-80GB, count: 2}}
driver: {version: "535.261.03"}
kubernetes: {}
""",
}

_DRIVER_PIN = (
    "no model default: a cluster file pins the driver by version or branch; empty or the role's branch means none"
)
_HOSTS = "comes from the file's node groups and hosts; a role on its own has none"
EXCEPTIONS: dict[str, str] = {
    "nvidia_driver_version": _DRIVER_PIN,
    "nvidia_driver_branch": _DRIVER_PIN,
    "gpu_kernel_gate_driver_version": _DRIVER_PIN,
    "gpu_kernel_gate_driver_branch": _DRIVER_PIN,
    "gpu_health_driver_version": _DRIVER_PIN,
    "gpu_operator_driver_version": _DRIVER_PIN,
    "gpu_operator_driver_kernel_module_type": (
        "the role's `auto` leaves the choice to the operator's chart, which the model cannot say: a cluster with GPUs "
        "always has a driver section, whose kernel_modules defaults to proprietary"
    ),
    "slurm_common_release": (
        "the role's empty value means a current Slurm (23.02 or newer); the model names the release of the OS "
        "archive, 22.05 for a minimal cluster on Debian 12"
    ),
    "slurm_common_nodes": _HOSTS,
    "slurm_common_partitions": _HOSTS,
    "slurm_common_gres": _HOSTS,
    "k8s_tenants_nodes": _HOSTS,
    "node_exporter_slurm_state_hosts": _HOSTS,
    "prometheus_dcgm_exporter_gpu_counts": _HOSTS,
    "prometheus_alert_slurm": "follows whether the file has `slurm:`; a role on its own assumes no orchestrator",
    "prometheus_alert_idle_allocated_labels": (
        "follows the file's orchestrator (hpc_job with Slurm, pod with Kubernetes); a role on its own assumes none"
    ),
    "prometheus_application_xids": (
        "NVIDIA's XID catalog with the site's classes, which gpuinfra holds; a role on its own raises one alert for "
        "every XID, GpuXidError"
    ),
    "prometheus_ignored_xids": "the catalog's ignored XIDs, as above; a role on its own ignores none",
    "gpu_health_expected_pci_ids": "the GPU model's, from the node group; a role on its own knows no model",
    "gpu_health_nccl_floor": "the GPU model's floor, from the catalog; a role on its own knows no model",
    "gpu_health_host_floor": "the GPU model's floor, from the catalog; a role on its own knows no model",
    "gpu_health_scheduler": (
        "follows the host's roles (slurm_compute, k8s_gpu_worker); a role on its own only reports, changing nothing"
    ),
    "dcgm_exporter_hpc_job_mapping_dir": (
        "off without `slurm:`, where no prolog writes the files; the role's default is the Slurm cluster's folder"
    ),
}


def _yaml(path: Path) -> Any:
    return YAML(typ="safe").load(path.read_text()) if path.exists() else None


def _spec_entries(role: str) -> dict[str, dict[str, Any]]:
    """Entry point -> its options."""
    specs = _yaml(ROOT / "roles" / role / "meta" / "argument_specs.yml") or {}
    return {name: entry.get("options") or {} for name, entry in (specs.get("argument_specs") or {}).items()}


def _spec_options(role: str) -> dict[str, Any]:
    options: dict[str, Any] = {}
    for entry in _spec_entries(role).values():
        options.update(entry)
    return options


def _defaults(role: str) -> dict[str, Any]:
    return _yaml(ROOT / "roles" / role / "defaults" / "main.yml") or {}


@cache
def role_defaults() -> dict[str, tuple[str, Any]]:
    """Variable -> (its role, its default) over every role."""
    return {name: (role, value) for role in ROLES for name, value in _defaults(role).items()}


def _template(value: Any, variables: dict[str, Any]) -> Any:
    """A role default as Ansible would see it with these variables: templated when it is a template."""
    if not (isinstance(value, str) and "{{" in value):
        return value
    return Templar(loader=DataLoader(), variables=variables).template(trust_as_template(value))


@pytest.mark.parametrize("role", ROLES)
def test_options_carry_the_role_prefix(role: str) -> None:
    options = _spec_options(role)
    assert options, f"{role} has no meta/argument_specs.yml options"
    for name in options:
        assert name.startswith(f"{role}_"), f"{role}: public variable {name!r} lacks the role prefix"


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.parent.name)
def test_rendered_variables_are_role_options(example: Path) -> None:
    """Every variable the model renders is an option some role declares, so none is silently ignored."""
    declared = {name for role in ROLES for name in _spec_options(role)}
    rendered = group_vars(load_cluster(example).resolved)
    unknown = {k for k in rendered if not k.startswith(SHARED_PREFIXES) and k not in declared}
    assert unknown == set()


@cache
def minimal(kind: str, folder: Path) -> ResolvedCluster:
    path = folder / f"{kind}.yml"
    path.write_text(MINIMAL[kind])
    return load_cluster(path).resolved


def _rendered_per_host(rc: ResolvedCluster) -> dict[str, dict[str, Any]]:
    """Host -> every variable the inventory gives it (group vars, then its host vars)."""
    shared = group_vars(rc)
    return {name: {**shared, **host_vars(host)} for name, host in rc.hosts.items()}


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("minimal")


@pytest.mark.parametrize("kind", MINIMAL)
def test_role_defaults_are_the_models_defaults(kind: str, folder: Path) -> None:
    """What a minimal cluster file renders is what the roles do on their own: one default, written in the model."""
    rc = minimal(kind, folder)
    members = {**groups(rc), "all": list(rc.hosts)}
    defaults = role_defaults()
    wrong: dict[str, str] = {}
    for host, rendered in _rendered_per_host(rc).items():
        magic = {"inventory_hostname": host, "inventory_hostname_short": host.split(".")[0], "groups": members}
        for name, value in rendered.items():
            if name.startswith(SHARED_PREFIXES) or name in EXCEPTIONS:
                continue
            assert name in defaults, f"{name} is rendered but no role has a default for it"
            role, default = defaults[name]
            actual = _template(default, {**rendered, **magic})
            if actual != value:
                wrong[name] = (
                    f"roles/{role}/meta/argument_specs.yml defaults it to {actual!r}, a minimal {kind} cluster "
                    f"renders {value!r}"
                )
    assert wrong == {}, "\n".join(f"{name}: {why}" for name, why in sorted(wrong.items()))


def test_every_exception_is_a_rendered_role_variable(folder: Path) -> None:
    """An exception names a variable the model renders and a role defaults, so the list cannot outlive either."""
    rendered = {
        name for kind in MINIMAL for host in _rendered_per_host(minimal(kind, folder)).values() for name in host
    }
    assert set(EXCEPTIONS) - rendered == set()
    assert set(EXCEPTIONS) - set(role_defaults()) == set()


def test_every_role_keeps_its_secrets_in_one_folder() -> None:
    """Every `<role>_secrets_dir` is spelled the same, and is gpuinfra_secrets_dir or the folder gpuinfra's own code
    knows (`gpuinfra.redact.default_secrets_dir`), so that the roles share their secrets and apply redacts them."""
    spelled = {role: default for name, (role, default) in role_defaults().items() if name.endswith("_secrets_dir")}
    assert len(spelled) >= 8, spelled
    assert len(set(spelled.values())) == 1, spelled
    default = next(iter(spelled.values()))
    assert _template(default, {"gpuinfra_cluster_name": "lab"}) == default_secrets_dir("lab")
    assert _template(default, {"gpuinfra_cluster_name": "lab", "gpuinfra_secrets_dir": "/vault"}) == "/vault"


def test_the_prolog_writes_where_the_exporter_reads() -> None:
    """One job-mapping folder: the model's, the Slurm prolog's and the DCGM exporter's defaults."""
    defaults = role_defaults()
    folder = DcgmExporter().job_mapping_dir
    assert defaults["slurm_compute_job_mapping_dir"][1] == folder
    assert defaults["dcgm_exporter_hpc_job_mapping_dir"][1] == folder


def test_roles_need_the_ansible_core_the_project_supports() -> None:
    """meta/runtime.yml and every role's min_ansible_version name the oldest ansible-core that pyproject.toml allows."""
    requirement = next(
        item
        for item in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
        if item.startswith("ansible-core")
    )
    oldest = re.search(r">=([0-9.]+)", requirement)
    assert oldest is not None, requirement
    runtime = _yaml(ROOT / "meta" / "runtime.yml")["requires_ansible"]
    assert runtime.startswith(f">={oldest[1]}.0"), runtime
    stale = [
        role
        for role in ROLES
        if str(_yaml(ROOT / "roles" / role / "meta" / "main.yml")["galaxy_info"]["min_ansible_version"]) != oldest[1]
    ]
    assert stale == []
