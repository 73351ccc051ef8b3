"""`gpuinfra plan` renders every file a role writes from a template: each `ansible.builtin.template` task's template
is one that plan renders for an example cluster, or is in `EXCEPTIONS` with the reason plan cannot render it.

A task that loops over its templates (`src: "{{ item }}.j2"`) is read with its loop: a literal list, or a list the
role's vars/main.yml or defaults/main.yml spells out.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import jinja2
import pytest
from ruamel.yaml import YAML

from gpuinfra.render.plan import render
from gpuinfra.validate.load import load_cluster

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE_MODULES = ("ansible.builtin.template", "ansible.legacy.template", "template")
# Between them, these render every artifact: Slurm with enroot (sandbox), Slurm with MIG, Kubernetes.
EXAMPLES = ("sandbox", "slurm-small", "k8s-mig")

HOST_ONLY = "needs what only the host has at run time (its address, a file it reads, its OS facts or OS vars file)"
EXCEPTIONS: dict[tuple[str, str], str] = {
    ("alertmanager", "alertmanager.default.j2"): HOST_ONLY,
    ("prometheus", "prometheus.default.j2"): HOST_ONLY,
    ("node_exporter", "node-exporter.default.j2"): HOST_ONLY,
    ("grafana", "grafana-server.conf.j2"): HOST_ONLY,
    ("grafana", "datasource.yml.j2"): HOST_ONLY,
    ("dcgm_exporter", "gpuinfra-dcgm-exporter.service.j2"): HOST_ONLY,
    ("package_source", "package-source.sources.j2"): "rendered for the role that includes it, with that role's "
    "settings, which the plan does not list",
    ("nvidia_driver", "debian-nonfree.sources.j2"): HOST_ONLY,
    ("monitoring_web", "web-config.yml.j2"): "the including role names the service, and the password hash is read "
    "from the secrets folder at run time",
    ("slurm_dbd", "slurmdbd.conf.j2"): "holds the database password",
    ("k8s_node_health", "kubeconfig.json.j2"): "holds the node's API token, made on the cluster at run time",
    ("nvidia_container_toolkit", "containerd-config.toml.j2"): "written only where the host has no containerd "
    "configuration of its own",
    ("slurm_login", "sackd.default.j2"): "written only on login nodes that fetch the configuration with sackd, which "
    "no inventory group names",
}


def _role_list(role: str, name: str) -> Any:
    """A list variable of the role, as its vars/main.yml or defaults/main.yml spells it."""
    for folder in ("vars", "defaults"):
        path = ROOT / "roles" / role / folder / "main.yml"
        data = YAML(typ="safe").load(path) if path.is_file() else None
        if data and name in data:
            return data[name]
    raise AssertionError(f"roles/{role}: no variable {name} in vars/ or defaults/")


def _tasks(node: Any) -> Iterator[dict[str, Any]]:
    """Every task of a task file, those inside blocks too."""
    for task in node or []:
        yield task
        for section in ("block", "rescue", "always"):
            yield from _tasks(task.get(section))


def _sources(role: str, task: dict[str, Any]) -> list[str]:
    """The templates one template task renders: its src, once per loop item where it loops."""
    module = next(name for name in TEMPLATE_MODULES if name in task)
    src = str(task[module]["src"])
    if "{{" not in src:
        return [src]
    loop = task.get("loop", task.get("with_items"))
    if isinstance(loop, str):  # "{{ __role_list }}"
        loop = _role_list(role, loop.strip("{} "))
    assert isinstance(loop, list), f"roles/{role}: cannot tell the templates of {task.get('name')!r}"
    return [jinja2.Template(src).render(item=item) for item in loop]


@cache
def template_tasks() -> dict[tuple[str, str], str]:
    """(role, template) -> the task file that writes it, for every template task of every role."""
    out: dict[tuple[str, str], str] = {}
    for path in sorted((ROOT / "roles").glob("*/tasks/**/*.yml")):
        role = path.relative_to(ROOT / "roles").parts[0]
        for task in _tasks(YAML(typ="safe").load(path)):
            if any(name in task for name in TEMPLATE_MODULES):
                for src in _sources(role, task):
                    out[(role, src)] = str(path.relative_to(ROOT))
    return out


@cache
def planned() -> set[tuple[str, str]]:
    """(role, template) of every file `gpuinfra plan` renders for the example clusters."""
    out = set()
    for name in EXAMPLES:
        rc = load_cluster(ROOT / "inventories" / name / "cluster.yml").resolved
        out |= {(r.artifact.role, r.artifact.template) for r in render(rc)}
    return out


def test_the_scan_finds_loops_and_blocks() -> None:
    tasks = template_tasks()
    assert ("slurm_common", "slurm.conf.j2") in tasks  # a loop over a list in vars/main.yml
    assert ("gpu_health", "gpuinfra-health.timer.j2") in tasks  # a literal loop
    assert ("slurm_login", "sackd.default.j2") in tasks  # inside a block
    for role, template in tasks:
        assert (ROOT / "roles" / role / "templates" / template).is_file(), (role, template)


def test_plan_renders_every_template_a_role_writes() -> None:
    missing = {
        f"{role}/templates/{template} ({where})"
        for (role, template), where in template_tasks().items()
        if (role, template) not in planned() and (role, template) not in EXCEPTIONS
    }
    listed = "\n".join(sorted(missing))
    assert not missing, f"plan never renders (add an Artifact in gpuinfra/render/vars/ or an exception):\n{listed}"


@pytest.mark.parametrize("exception", sorted(EXCEPTIONS), ids="/".join)
def test_each_exception_is_a_template_plan_does_not_render(exception: tuple[str, str]) -> None:
    """So the list stays short and true: an exception the roles no longer write, or that plan now renders, goes."""
    assert exception in template_tasks()
    assert exception not in planned()
