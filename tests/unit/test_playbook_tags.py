"""`gpuinfra apply --tags`: every play of site.yml carries the tag of its concern, and a tag selects exactly that
concern's tasks (plus Ansible's own `always` ones: each role's argument check).

The selection is Ansible's: `ansible-playbook --list-tasks --tags TAG playbooks/site.yml` against the inventory
`gpuinfra apply` renders for the sandbox cluster, with this checkout as the collection gpuinfra.cluster.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpuinfra.render.inventory import inventory_yaml
from gpuinfra.validate.load import load_cluster

pytestmark = pytest.mark.tools  # runs Ansible or a system tool (tests/unit/tool_guard.py)

ROOT = Path(__file__).resolve().parents[2]
SITE = ROOT / "playbooks" / "site.yml"
CLUSTER = ROOT / "inventories" / "sandbox" / "cluster.yml"
APPLY_DOC = ROOT / "docs" / "apply.md"

# Concern tag -> the roles whose tasks it selects. The read-only checks before the driver and the toolkit go on
# serve both, so either tag runs them.
CONCERNS: dict[str, frozenset[str]] = {
    "driver": frozenset({"gpu_preflight", "nvidia_driver", "kernel_updates"}),
    "toolkit": frozenset({"gpu_preflight", "nvidia_container_toolkit"}),
    "mig": frozenset({"mig"}),
    "munge": frozenset({"munge"}),
    "slurm": frozenset(
        {"slurm_containers_build", "slurm_containers", "slurm_common", "slurm_controller", "slurm_compute"}
        | {"slurm_login"}
    ),
    "accounting": frozenset({"slurm_dbd", "slurm_accounting"}),
    "kubernetes": frozenset({"gpu_operator"}),
    "tenants": frozenset({"k8s_tenants"}),
    "queues": frozenset({"kueue"}),
    "monitoring": frozenset(
        {
            "monitoring_tls",
            "prometheus",
            "prometheus_targets",
            "alertmanager",
            "grafana",
            "node_exporter",
            "dcgm_exporter",
        }
    ),
    "health": frozenset({"gpu_health", "gpu_check_tools", "k8s_node_health", "gpu_admission", "gpu_scheduled_checks"}),
}
ALWAYS = "always"
TASK = re.compile(r"^ {6}(?:(?P<role>[\w.]+) : )?(?P<name>.*)\tTAGS: \[(?P<tags>[^\]]*)\]$")


@dataclass(frozen=True)
class Task:
    role: str  # the role's short name ("munge"), or "" for a task of the playbook itself
    name: str
    tags: frozenset[str]

    @property
    def always(self) -> bool:
        return ALWAYS in self.tags


def _parse(listing: str) -> list[Task]:
    """The listed tasks. ansible-playbook lists a role's include_role task (monitoring_web's) without the role's
    name: it is the role of the task before it in the same play."""
    tasks: list[Task] = []
    role = ""
    for line in listing.splitlines():
        if line.startswith("  play #"):
            role = ""
        match = TASK.match(line)
        if match:
            tags = frozenset(t.strip() for t in match["tags"].split(",") if t.strip())
            role = (match["role"] or "").rsplit(".", 1)[-1] or role
            tasks.append(Task(role, match["name"], tags))
    return tasks


@pytest.fixture(scope="module")
def ansible(collections: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """ansible-playbook's output per argument list, for the listings every test here reads (run in parallel)."""
    tmp = tmp_path_factory.mktemp("tags")
    hosts = tmp / "hosts.json"
    hosts.write_text(json.dumps(inventory_yaml(load_cluster(CLUSTER).resolved)))
    env = {
        **os.environ,
        "ANSIBLE_COLLECTIONS_PATH": str(collections),
        "ANSIBLE_INVENTORY_ENABLED": "ansible.builtin.yaml",
        "ANSIBLE_INVENTORY_UNPARSED_FAILED": "True",
        "ANSIBLE_NOCOLOR": "True",
    }
    runs = {"list-tags": ["--list-tags"], "all": ["--list-tasks"]}
    runs.update({tag: ["--list-tasks", "--tags", tag] for tag in CONCERNS})

    def run(args: list[str]) -> str:
        done = subprocess.run(
            [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(hosts), *args, str(SITE)],
            capture_output=True,
            text=True,
            env=env,
            cwd=tmp,
            check=False,
        )
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        return done.stdout

    with ThreadPoolExecutor(max_workers=4) as pool:
        return dict(zip(runs, pool.map(run, runs.values()), strict=True))


def test_site_lists_one_tag_per_concern(ansible: dict[str, str]) -> None:
    found = re.findall(r"TASK TAGS: \[([^\]]*)\]", ansible["list-tags"])
    tags = {t.strip() for line in found for t in line.split(",") if t.strip()}
    assert tags == {*CONCERNS, ALWAYS}


def test_every_task_carries_its_concern(ansible: dict[str, str]) -> None:
    """No task of site.yml is left out of every tag, and each role sits under the concern that names it."""
    tasks = _parse(ansible["all"])
    assert tasks, ansible["all"]
    untagged = [t for t in tasks if not t.always and not t.tags & set(CONCERNS)]
    assert untagged == []
    for task in tasks:
        if task.always:
            continue
        expected = {tag for tag, roles in CONCERNS.items() if task.role in roles}
        assert task.tags == expected, f"{task.role} : {task.name} has tags {sorted(task.tags)}, not {sorted(expected)}"


@pytest.mark.parametrize("tag", CONCERNS)
def test_a_tag_selects_its_concern_and_nothing_else(ansible: dict[str, str], tag: str) -> None:
    everything = _parse(ansible["all"])
    selected = _parse(ansible[tag])
    own = [t for t in selected if not t.always]
    assert own, f"--tags {tag} selects no task"
    strangers = sorted({t.role for t in own} - CONCERNS[tag])
    assert strangers == [], f"--tags {tag} selects tasks of {strangers}"
    # Every task of the concern's roles, and of nothing else: the same tasks as an untagged run has of them.
    expected = Counter((t.role, t.name) for t in everything if t.role in CONCERNS[tag] and not t.always)
    assert Counter((t.role, t.name) for t in own) == expected
    # What runs besides: only Ansible's argument checks of the roles and the read-only receipt probe.
    others = {t.name.split(" - ")[0] for t in selected if t.always}
    probe = "Read every receipt and the state it watches, and leave each host out of the plays of its fresh roles"
    assert all(name.startswith("Validating arguments against arg spec") or name == probe for name in others), others


def test_monitoring_alone_runs_no_other_role(ansible: dict[str, str]) -> None:
    """`apply --tags monitoring` converges monitoring only: the tasks it selects, counted by role."""
    roles = Counter(t.role for t in _parse(ansible["monitoring"]) if not t.always)
    assert set(roles) == CONCERNS["monitoring"]
    assert sum(roles.values()) > 0


def test_the_tags_are_documented() -> None:
    """docs/apply.md lists every tag of site.yml in its table of tags."""
    text = APPLY_DOC.read_text()
    section = text[text.index("## Tags") :]
    section = section[: section.find("\n## ", 1)]
    documented = set(re.findall(r"^\| `([a-z]+)` \|", section, flags=re.MULTILINE))
    assert documented == set(CONCERNS)
