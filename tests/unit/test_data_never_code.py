"""A cluster file is data, never code: values reach Ansible as unsafe, and any input is answered with diagnostics
within the loader's limits, never a traceback, a hang or a MemoryError.

The hostile files themselves, with their exact diagnostics, are under bad/ (test_bad_files.py).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpuinfra import limits
from gpuinfra.errors import InvalidInput
from gpuinfra.render.inventory import inventory_yaml
from gpuinfra.render.plan import render
from gpuinfra.render.vars import monitoring
from gpuinfra.resolve import ResolvedCluster
from gpuinfra.unsafe import as_data, unsafe
from gpuinfra.validate.load import load_cluster
from gpuinfra.validate.source import read_yaml

ROOT = Path(__file__).resolve().parents[2]
BAD = Path(__file__).parent / "bad"
SANDBOX = ROOT / "inventories" / "sandbox" / "cluster.yml"
BIN = Path(sys.executable).parent

# What a value in a pull request could hold: run on the controller if Ansible ever templated it.
LOOKUP = "{{ lookup('pipe', 'touch MARKER') }}"


def test_unsafe_marks_every_string_value_and_no_key() -> None:
    data = {"a": "x", "b": ["y", 1, True, None], "c": {"d": "z"}}
    assert unsafe(data) == {
        "a": {"__ansible_unsafe": "x"},
        "b": [{"__ansible_unsafe": "y"}, 1, True, None],
        "c": {"d": {"__ansible_unsafe": "z"}},
    }


def test_a_value_already_unsafe_is_not_wrapped_again() -> None:
    """Wrapped twice, Ansible's JSON decoder would hand the inner text on as a template (a lookup in it ran)."""
    marked = {"__ansible_unsafe": LOOKUP}
    assert unsafe({"a": marked, "b": [marked]}) == {"a": marked, "b": [marked]}


def test_only_connection_settings_stay_plain_strings() -> None:
    """Tools that connect from the inventory (testinfra's Ansible backend) take ansible_host only as a string; every
    other value is unsafe. The grammar of the connection fields admits no template delimiter."""
    inventory = inventory_yaml(load_cluster(SANDBOX).resolved)["all"]
    assert inventory["hosts"]["gpu01"]["ansible_host"] == "10.213.42.11"
    assert inventory["children"]["group_gpu"]["vars"]["gpuinfra_node_group"] == {"__ansible_unsafe": "gpu"}
    assert as_data({"ansible_user": "root", "x": ["y"]}) == {"ansible_user": "root", "x": [{"__ansible_unsafe": "y"}]}


def _with_receiver_url(rc: ResolvedCluster, url: str) -> ResolvedCluster:
    """The sandbox cluster with its webhook's URL replaced without validation, as if the grammar had a hole: the
    inventory's unsafe marking is the layer under test."""
    mon = rc.model.monitoring
    receiver = mon.receivers["local"].model_copy(update={"url": url})
    model = rc.model.model_copy(update={"monitoring": mon.model_copy(update={"receivers": {"local": receiver}})})
    return dataclasses.replace(rc, model=model)


def _probe_role(tmp: Path, role: str, template: str) -> Path:
    """A copy of `role` whose only task renders `template` to a file: the role's own defaults, vars and template,
    layered by Ansible exactly as in a run."""
    probe = tmp / "roles" / "probe"
    for part in ("defaults", "vars", "templates"):
        if (ROOT / "roles" / role / part).is_dir():
            shutil.copytree(ROOT / "roles" / role / part, probe / part)
    (probe / "tasks").mkdir(parents=True)
    (probe / "tasks" / "main.yml").write_text(
        "- name: Render the template under test\n"
        "  ansible.builtin.template:\n"
        f"    src: {template}\n"
        '    dest: "{{ probe_dest }}"\n'
        '    mode: "0600"\n'
    )
    return tmp / "roles"


@pytest.mark.tools
def test_a_template_in_a_value_lands_literally_and_runs_nothing(tmp_path: Path) -> None:
    """A real ansible-playbook run renders the alertmanager template with a value holding a lookup: no command
    runs on the controller, the literal text lands in the file, and `plan` renders the same bytes."""
    rc = _with_receiver_url(load_cluster(SANDBOX).resolved, f"http://ctl01:9099/alerts?{LOOKUP}")
    inventory = inventory_yaml(rc)
    host = "ctl01"
    inventory["all"]["hosts"][host]["ansible_connection"] = "local"
    inventory["all"]["hosts"][host]["ansible_python_interpreter"] = sys.executable
    (tmp_path / "hosts.json").write_text(json.dumps(inventory))
    roles = _probe_role(tmp_path, "alertmanager", "alertmanager.yml.j2")
    out = tmp_path / "alertmanager.yml"
    (tmp_path / "play.yml").write_text(
        f"- hosts: {host}\n  gather_facts: false\n  vars: {{probe_dest: {json.dumps(str(out))}}}\n  roles: [probe]\n"
    )
    env = {
        **os.environ,
        "ANSIBLE_ROLES_PATH": str(roles),
        "ANSIBLE_INVENTORY_ENABLED": "ansible.builtin.yaml",
        "ANSIBLE_LOCALHOST_WARNING": "false",
        "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),  # as a run sets it (gpuinfra/run.py)
    }
    done = subprocess.run(
        [str(BIN / "ansible-playbook"), "-i", str(tmp_path / "hosts.json"), str(tmp_path / "play.yml")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert not (tmp_path / "MARKER").exists(), "the lookup ran on the controller"
    written = out.read_text()
    assert LOOKUP in written
    planned = {r.artifact.template: r.content for r in render(rc, list(monitoring.ARTIFACTS))}
    assert planned["alertmanager.yml.j2"] == written, "plan and apply rendered different files"


# --- limits: bounded time and memory ---------------------------------------------------------------------------


def test_a_file_over_the_size_limit_is_refused_unread(tmp_path: Path) -> None:
    path = tmp_path / "big.yml"
    path.write_text("name: lab\n# " + "x" * limits.MAX_FILE_BYTES + "\n")
    with pytest.raises(InvalidInput, match=r"big.yml:1:1: the file is larger than 128 KiB"):
        load_cluster(path)


@pytest.mark.parametrize("special", ["fifo", "/dev/zero", "folder"])
def test_only_regular_files_are_read(tmp_path: Path, special: str) -> None:
    """A FIFO would block open() and /dev/zero never ends: both are refused before they are read."""
    path = tmp_path / "cluster.yml"
    if special == "fifo":
        os.mkfifo(path)
    elif special == "folder":
        path.mkdir()
    else:
        path = Path(special)
    with pytest.raises(InvalidInput, match="not a regular file"):
        read_yaml(path)


HOSTILE = ["alias_bomb.yml", "deep_nesting.yml", "resource_limits.yml", "referenced_file.yml", "gpu_selectors.yml"]


@pytest.mark.parametrize("name", HOSTILE)
def test_hostile_files_are_answered_within_256_mib(name: str) -> None:
    """The CLI under an address-space limit of 256 MiB: a clear diagnostic and exit 3, never a MemoryError.
    (The time each takes is printed by benchmarks/hostile_inputs.py, not asserted here.)"""
    limit = 256 * 1024 * 1024
    done = subprocess.run(
        ["prlimit", f"--as={limit}", sys.executable, "-m", "gpuinfra", "validate", name],
        cwd=BAD,
        capture_output=True,
        text=True,
        timeout=120,  # a guard against a hang, far above any answer
        check=False,
    )
    assert done.returncode == 3, done.stdout + done.stderr
    assert "Traceback" not in done.stderr and "MemoryError" not in done.stderr
    assert done.stderr.startswith(f"{name}:"), done.stderr


@pytest.mark.tools
def test_nesting_deep_enough_to_crash_a_recursive_parser_is_refused(tmp_path: Path) -> None:
    """100,000 levels of `[` within the size limit: the C composer would overflow the C stack (a segfault, not an
    exception), so depth is checked on the parser's events first. In a process of its own, so a crash shows."""
    path = tmp_path / "deep.yml"
    path.write_text("name: " + "[" * 100_000 + "\n")
    done = subprocess.run(
        [sys.executable, "-m", "gpuinfra", "validate", str(path)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 3, (done.returncode, done.stderr[-500:])
    assert "nesting is deeper than 32 levels" in done.stderr


# --- references and merge keys ---------------------------------------------------------------------------------

PARTED = """\
version: v1
mig-configs:
  halves:
    - devices: all
      mig-enabled: true
      mig-devices: {3g.40gb: 2}
"""

WITH_PARTED = """\
name: lab
node_groups:
  gpu:
    hosts: gpu01
    roles: [slurm_compute]
    gpu: {model: A100-SXM4-80GB, count: 8}
    mig: [{layout: halves}]
  ctl: {hosts: ctl01, roles: [slurm_controller, slurm_dbd]}
driver: {version: "535.261.03"}
slurm: {partitions: {batch: {node_groups: [gpu]}}}
mig: {parted_file: layouts/mig.yml}
"""


def test_a_relative_parted_file_is_read_beside_the_cluster_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    site = tmp_path / "site"
    (site / "layouts").mkdir(parents=True)
    (site / "layouts" / "mig.yml").write_text(PARTED)
    (site / "cluster.yml").write_text(WITH_PARTED)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    loaded = load_cluster(site / "cluster.yml")
    assert loaded.model.mig.parted_file == str(site / "layouts" / "mig.yml")
    assert loaded.resolved.layouts["halves"] == {"3g.40gb": 2}


MERGED = """\
name: lab
x-gpu-node: &gpu-node
  roles: [slurm_compute]
  gpu: {model: L4, count: 2}
  memory_mb: 1024
node_groups:
  ctl: {hosts: ctl01, roles: [slurm_controller, slurm_dbd]}
  a:
    <<: *gpu-node
    hosts: a[1-2]
  b:
    <<: *gpu-node
    hosts: b1
    memory_mb: 2048
driver: {version: "535.261.03"}
slurm: {partitions: {batch: {node_groups: [a, b]}}}
"""


def test_merge_keys_and_extension_fields_load_as_yaml_defines_them(tmp_path: Path) -> None:
    path = tmp_path / "cluster.yml"
    path.write_text(MERGED)
    groups = load_cluster(path).model.node_groups
    assert groups["a"].gpu is not None and groups["a"].gpu.count == 2 and groups["a"].memory_mb == 1024
    assert groups["b"].memory_mb == 2048, "a key of the mapping itself wins over the merged one"


def _diagnose(text: str, tmp: Path) -> list[str]:
    path = tmp / "cluster.yml"
    path.write_text(text)
    with pytest.raises(InvalidInput) as caught:
        load_cluster(path)
    return [f"{d.line}:{d.col}: {d.path}" for d in caught.value.diagnostics]


def test_an_error_in_a_merged_value_points_at_the_anchor(tmp_path: Path) -> None:
    got = _diagnose(MERGED.replace("memory_mb: 1024", "memory_mb: lots"), tmp_path)
    assert got == ["5:3: node_groups[a].memory_mb"]
