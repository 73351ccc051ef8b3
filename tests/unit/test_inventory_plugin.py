"""The inventory plugin gpuinfra.cluster.cluster: through Ansible's own inventory code it gives exactly what
`gpuinfra inventory` prints, fails an invalid cluster file with gpuinfra's own diagnostics, and leaves every other
inventory source to the plugins it belongs to.

Runs of ansible-inventory and ansible-doc are subprocesses with this checkout as the collection; the rest loads the
plugin's file directly, so the collection loader stays out of the other tests.
"""

from __future__ import annotations

import configparser
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from ansible.errors import AnsibleParserError
from ansible.inventory.data import InventoryData
from ansible.parsing.dataloader import DataLoader
from ansible.template import is_trusted_as_template
from file_module import load

from gpuinfra.cli import exitcodes, main
from gpuinfra.errors import InvalidInput
from gpuinfra.limits import MAX_FILE_BYTES
from gpuinfra.render.inventory import inventory_yaml
from gpuinfra.validate.load import load_cluster

pytestmark = pytest.mark.tools  # runs Ansible or a system tool (tests/unit/tool_guard.py)

ROOT = Path(__file__).resolve().parents[2]
PLUGIN_FILE = ROOT / "plugins" / "inventory" / "cluster.py"
EXAMPLES = sorted((ROOT / "inventories").glob("*/cluster.yml"))
SANDBOX = ROOT / "inventories" / "sandbox" / "cluster.yml"
BAD = Path(__file__).parent / "bad"
NAME = "gpuinfra.cluster.cluster"
BIN = Path(sys.executable).parent


plugin = load(str(PLUGIN_FILE.relative_to(ROOT)), "gpuinfra_inventory_plugin_under_test")


def ansible(
    collections: Path, *args: str, enabled: str | None = NAME, cwd: Path = ROOT
) -> subprocess.CompletedProcess[str]:
    """An Ansible command line from this Python's environment, with this checkout as gpuinfra.cluster and, unless
    `enabled` is None, only the given inventory plugins enabled."""
    env = {
        **os.environ,
        "ANSIBLE_COLLECTIONS_PATH": str(collections),
        "ANSIBLE_INVENTORY_UNPARSED_FAILED": "True",
        "ANSIBLE_LOCALHOST_WARNING": "False",
        "ANSIBLE_NOCOLOR": "True",
    }
    env.pop("ANSIBLE_CONFIG", None)
    env.pop("ANSIBLE_INVENTORY_ENABLED", None)
    if enabled is not None:
        env["ANSIBLE_INVENTORY_ENABLED"] = enabled
    return subprocess.run(
        [str(BIN / args[0]), *args[1:]], capture_output=True, text=True, check=False, env=env, cwd=cwd, timeout=120
    )


def gpuinfra_inventory(path: Path, capsys: pytest.CaptureFixture[str]) -> Any:
    assert main(["inventory", str(path)]) == exitcodes.OK
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.parent.name)
def test_a_cluster_file_gives_what_gpuinfra_inventory_prints(
    example: Path, collections: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Hosts, groups and every variable, unsafe marks included: the whole of `ansible-inventory --list`."""
    done = ansible(collections, "ansible-inventory", "-i", str(example), "--list", "--export")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == gpuinfra_inventory(example, capsys)


def test_a_source_file_points_to_a_cluster_file_and_needs_no_setting(
    tmp_path: Path, collections: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`plugin: gpuinfra.cluster.cluster` with a path relative to the source file, through Ansible's default
    plugins (`auto` hands the file to this plugin), from another working directory."""
    source = tmp_path / "sources" / "sandbox.gpuinfra.yml"
    source.parent.mkdir()
    source.write_text(f"plugin: {NAME}\ncluster_file: {os.path.relpath(SANDBOX, source.parent)}\n")
    done = ansible(
        collections, "ansible-inventory", "-i", str(source), "--list", "--export", enabled=None, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == gpuinfra_inventory(SANDBOX, capsys)


def test_a_source_file_points_to_the_inventory_gpuinfra_made(
    tmp_path: Path, collections: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """What `gpuinfra apply` hands each run: the JSON it rendered, read as it is, with the same hosts and values."""
    expected = gpuinfra_inventory(SANDBOX, capsys)
    rendered = tmp_path / "hosts.json"
    rendered.write_text(json.dumps({"all": inventory_yaml(load_cluster(SANDBOX).resolved)["all"]}))
    source = tmp_path / "run.yml"
    source.write_text(f"plugin: {NAME}\ninventory_file: hosts.json\n")
    done = ansible(collections, "ansible-inventory", "-i", str(source), "--list", "--export", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == expected


def _templated(value: Any, jinja: str, plain: bool) -> Any:
    """`value` with every string gpuinfra marks unsafe, and with `plain` every plain one too, replaced by `jinja`."""
    if isinstance(value, dict):
        if list(value) == ["__ansible_unsafe"]:
            return {"__ansible_unsafe": jinja}
        return {key: _templated(item, jinja, plain) for key, item in value.items()}
    if isinstance(value, list):
        return [_templated(item, jinja, plain) for item in value]
    return jinja if plain and isinstance(value, str) else value


@pytest.mark.parametrize("plain", [False, True], ids=["values", "values and connection settings"])
def test_jinja_in_every_field_of_the_inventory_file_runs_nothing(
    plain: bool, tmp_path: Path, collections: Path
) -> None:
    """The run's inventory file with a template that would run a command on the controller in every field: the
    values stay data (printed as written); a connection setting that holds one fails the source."""
    marker = tmp_path / "ran"
    jinja = f"{{{{ lookup('ansible.builtin.pipe', 'touch {marker}') }}}}"
    rendered = {"all": _templated(inventory_yaml(load_cluster(SANDBOX).resolved)["all"], jinja, plain)}
    (tmp_path / "hosts.json").write_text(json.dumps(rendered))
    (tmp_path / "run.yml").write_text(f"plugin: {NAME}\ninventory_file: hosts.json\n")
    (tmp_path / "play.yml").write_text(
        "- hosts: gpu01\n  gather_facts: false\n  tasks:\n    - ansible.builtin.debug: {var: gpuinfra_node_group}\n"
    )
    done = ansible(collections, "ansible-playbook", "-i", str(tmp_path / "run.yml"), "-c", "local",
                   str(tmp_path / "play.yml"), cwd=tmp_path)  # fmt: skip
    if plain:
        assert done.returncode != 0 and "holds a template, which no inventory gpuinfra made does" in done.stderr
    else:
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        assert "lookup('ansible.builtin.pipe'" in done.stdout, done.stdout
    assert not marker.exists()


def test_an_inventory_file_that_is_a_fifo_is_refused_at_once(tmp_path: Path, collections: Path) -> None:
    os.mkfifo(tmp_path / "hosts.json")
    (tmp_path / "run.yml").write_text(f"plugin: {NAME}\ninventory_file: hosts.json\n")
    done = ansible(collections, "ansible-inventory", "-i", str(tmp_path / "run.yml"), "--list", cwd=tmp_path)
    assert done.returncode != 0 and "not a regular file" in " ".join(done.stderr.split()), done.stderr


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (f"plugin: {NAME}\n", "name either cluster_file or inventory_file, not 0"),
        (f"plugin: {NAME}\ncluster_file: c.yml\ninventory_file: h.json\n", "not 2"),
        (f"plugin: {NAME}\ninventory_file: missing.json\n", "cannot read the inventory"),
        (f"plugin: {NAME}\ninventory_file: source.yml\n", "cannot read the inventory"),
    ],
)
def test_a_source_file_names_exactly_one_readable_file(
    text: str, message: str, tmp_path: Path, collections: Path
) -> None:
    source = tmp_path / "source.yml"
    source.write_text(text)
    done = ansible(collections, "ansible-inventory", "-i", str(source), "--list", cwd=tmp_path)
    assert done.returncode != 0
    assert message in " ".join(done.stderr.split()), done.stderr


def diagnostic_lines(path: Path) -> list[str]:
    with pytest.raises(InvalidInput) as caught:
        load_cluster(path)
    return [str(d) for d in caught.value.diagnostics]


@pytest.mark.parametrize("form", ["cluster file", "source file"])
def test_an_invalid_cluster_file_fails_with_every_diagnostic(form: str, tmp_path: Path, collections: Path) -> None:
    bad = BAD / "many_errors.yml"
    source = bad
    if form == "source file":
        source = tmp_path / "bad.gpuinfra.yml"
        source.write_text(f"plugin: {NAME}\ncluster_file: {bad}\n")
    done = ansible(collections, "ansible-inventory", "-i", str(source), "--list", enabled=f"{NAME},auto")
    assert done.returncode != 0
    assert "Traceback" not in done.stderr
    # Ansible wraps nothing: each diagnostic arrives whole, on a line of its own.
    lines = done.stderr.splitlines()
    expected = diagnostic_lines(bad)
    assert len(expected) > 3
    assert all(any(line.endswith(diagnostic) for line in lines) for diagnostic in expected), done.stderr
    assert f"{bad}: {len(expected)} errors" in lines


def test_a_failure_is_shown_even_when_the_yaml_plugin_takes_the_file_afterwards(collections: Path) -> None:
    """Ansible keeps a plugin's failure to itself when a later plugin parses the source, and its YAML plugin
    parses a cluster file as an inventory without hosts: the plugin shows its diagnostics itself then."""
    bad = BAD / "unknown_key.yml"
    done = ansible(collections, "ansible-inventory", "-i", str(bad), "--graph", enabled=f"{NAME},auto,yaml")
    for diagnostic in diagnostic_lines(bad):
        assert diagnostic in done.stderr.splitlines()


@pytest.mark.parametrize("name", sorted(p.name for p in BAD.glob("*.yml")))
def test_every_bad_file_fails_with_exactly_its_diagnostics(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(BAD)  # the file as given, as tests/unit/test_bad_files.py names it
    with pytest.raises(AnsibleParserError) as caught:
        parse(name)
    expected = (BAD / name.replace(".yml", ".expected")).read_text().splitlines()
    errors = sum(": warning: " not in line for line in expected)
    assert str(caught.value.message).splitlines() == [*expected, f"{name}: {errors} error{'s' if errors != 1 else ''}"]


def parse(path: str | Path) -> InventoryData:
    inventory = InventoryData()
    plugin.InventoryModule().parse(inventory, DataLoader(), str(path))
    inventory.reconcile_inventory()
    return inventory


def test_cluster_values_are_unsafe_and_only_connection_settings_are_plain() -> None:
    """As Ansible holds them after reading the run directory's inventory: never templated, except Ansible's own
    connection settings, which tools that connect (testinfra, AWX) take only as plain strings."""
    inventory = parse(SANDBOX)
    sets = [*(group.vars for group in inventory.groups.values()), *(host.vars for host in inventory.hosts.values())]
    checked = 0
    for variables in sets:
        for key, value in variables.items():
            for text in _strings(value):
                assert is_trusted_as_template(text) is key.startswith("ansible_"), (key, text)
                checked += 1
    assert checked > 50
    assert inventory.groups["group_gpu"].vars["gpuinfra_node_group"] == "gpu"


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for item in value.values() for s in _strings(item)]
    if isinstance(value, list):
        return [s for item in value for s in _strings(item)]
    return []


def test_without_the_gpuinfra_package_the_source_fails_saying_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "gpuinfra.validate.load", None)  # its import now fails, as when it is missing
    with pytest.raises(AnsibleParserError, match="needs the gpuinfra Python package"):
        parse(SANDBOX)


# --- which sources the plugin takes --------------------------------------------------------------------------


def claims(path: Path) -> bool:
    return bool(plugin.InventoryModule().verify_file(str(path)))


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.parent.name)
def test_verify_file_takes_cluster_files(example: Path) -> None:
    assert claims(example)


def test_verify_file_takes_a_cluster_file_in_json_and_a_source_file(tmp_path: Path) -> None:
    cluster = tmp_path / "cluster.json"
    cluster.write_text(json.dumps({"name": "lab", "node_groups": {"a": {"hosts": "a01"}}}))
    assert claims(cluster)
    for text in (f"plugin: {NAME}\ncluster_file: c.yml\n", f"---\n# ours\n'plugin': \"{NAME}\"  # note\n"):
        source = tmp_path / "ours.yml"
        source.write_text(text)
        assert claims(source), text


OTHER_SOURCES = {
    "yaml inventory": "all:\n  hosts:\n    web01:\n  children:\n    node_groups:\n      hosts: {web02: null}\n",
    "other plugin": "plugin: ansible.builtin.constructed\nnode_groups: {}\n",
    "short plugin name": "plugin: cluster\ncluster_file: c.yml\n",
    "json inventory": json.dumps({"all": {"hosts": {"web01": None}}}),
    "vars file": "name: web\nport: 80\n",
    "mig-parted config": "version: v1\nmig-configs:\n  all-1g: []\n",
    "indented key": "groups:\n  node_groups: {}\n",
}


@pytest.mark.parametrize("kind", sorted(OTHER_SOURCES))
def test_verify_file_leaves_other_yaml_alone(kind: str, tmp_path: Path) -> None:
    path = tmp_path / ("other.json" if kind.startswith("json") else "other.yml")
    path.write_text(OTHER_SOURCES[kind])
    assert not claims(path)


def test_verify_file_leaves_other_names_binaries_and_fifos_alone(tmp_path: Path) -> None:
    ini = tmp_path / "hosts"
    ini.write_text(SANDBOX.read_text())  # a cluster file's text, but not a YAML file's name
    assert not claims(ini)
    assert not claims(BAD / "binary.yml")
    fifo = tmp_path / "fifo.yml"
    os.mkfifo(fifo)
    assert not claims(fifo)  # never opened: opening a FIFO with no writer would block
    assert not claims(tmp_path / "missing.yml")


def test_verify_file_reads_no_more_than_gpuinfra_would() -> None:
    assert plugin.SNIFF_BYTES == MAX_FILE_BYTES


def test_other_yaml_inventories_still_parse_beside_the_plugin(tmp_path: Path, collections: Path) -> None:
    path = tmp_path / "hosts.yml"
    path.write_text(OTHER_SOURCES["yaml inventory"])
    done = ansible(collections, "ansible-inventory", "-i", str(path), "--list", enabled=f"{NAME},yaml")
    assert done.returncode == 0, done.stderr
    listed = json.loads(done.stdout)
    assert listed["node_groups"] == {"hosts": ["web02"]} and listed["ungrouped"] == {"hosts": ["web01"]}


def test_ansible_doc_reads_the_documentation(collections: Path) -> None:
    done = ansible(collections, "ansible-doc", "-t", "inventory", "--json", NAME)
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)[NAME]["doc"]
    assert set(doc["options"]) == {"plugin", "cluster_file", "inventory_file"}
    assert doc["options"]["plugin"]["choices"] == [NAME]
    assert json.loads(done.stdout)[NAME]["examples"].count(f"plugin: {NAME}") == 1


def test_docs_ansible_cfg_holds_the_settings_apply_gives_its_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/ansible.cfg is for runs without the CLI: it must not drift from what gpuinfra.run sets."""
    from gpuinfra.run.environment import RUN_CONFIG, envvars

    for name in ("ANSIBLE_PIPELINING", "ANSIBLE_GATHERING"):
        monkeypatch.delenv(name, raising=False)
    env = envvars(tmp_path)
    config = configparser.ConfigParser()
    config.read(ROOT / "docs" / "ansible.cfg")
    assert config.get("defaults", "gathering") == env["ANSIBLE_GATHERING"]
    run_config = configparser.ConfigParser()
    run_config.read_string(RUN_CONFIG)
    assert dict(run_config["defaults"]).items() <= dict(config["defaults"]).items()
    assert config.getboolean("ssh_connection", "pipelining") is (env["ANSIBLE_PIPELINING"] == "True")
    assert config.getboolean("inventory", "unparsed_is_failed") is (env["ANSIBLE_INVENTORY_UNPARSED_FAILED"] == "True")
    enabled = [name.strip() for name in config.get("inventory", "enable_plugins").split(",")]
    assert enabled[0] == NAME and "yaml" not in enabled and "auto" in enabled
