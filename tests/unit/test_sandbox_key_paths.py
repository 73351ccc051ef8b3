"""Where the SSH key and known_hosts paths of a cluster file point, and that no sandbox key lands in a repository."""

from __future__ import annotations

import shutil
import stat
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import container_sources
import pytest

from gpuinfra.errors import InvalidInput
from gpuinfra.render.inventory import inventory_yaml
from gpuinfra.sandbox import SandboxConfigError, sandbox_spec
from gpuinfra.sandbox.access import ensure_state_dir
from gpuinfra.sandbox.spec import SOURCE_ROOT, check_state_folder, repository_of
from gpuinfra.validate.load import load_cluster

ROOT = Path(__file__).resolve().parents[2]

CLUSTER = """\
name: keys
connection:
  ssh_key: {key}
  known_hosts_file: {known_hosts}
node_groups:
  node: {{hosts: node1, addresses: {{node1: 10.77.3.5}}, roles: [monitoring]}}
"""


def plain(value: Any) -> Any:
    """An inventory value without the unsafe mark gpuinfra's inventory puts on every string."""
    return value["__ansible_unsafe"] if isinstance(value, dict) and list(value) == ["__ansible_unsafe"] else value


def write(folder: Path, key: str, known_hosts: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "cluster.yml"
    path.write_text(CLUSTER.format(key=key, known_hosts=known_hosts))
    return path


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    container_sources.link_into(home)
    return home


def test_controller_paths_expand_home_and_take_relative_ones_from_the_file(home: Path, tmp_path: Path) -> None:
    conn = load_cluster(
        write(tmp_path / "a", "~/.local/share/gpuinfra/x/ssh/id_ed25519", "keys/known")
    ).model.connection
    assert conn.ssh_key == str(home / ".local/share/gpuinfra/x/ssh/id_ed25519")
    assert conn.known_hosts_file == str(tmp_path / "a" / "keys" / "known")
    conn = load_cluster(write(tmp_path / "b", "/etc/ssh/key", "../k")).model.connection
    assert (conn.ssh_key, conn.known_hosts_file) == ("/etc/ssh/key", str(tmp_path / "k"))


def test_the_inventory_gets_absolute_key_and_known_hosts_paths(home: Path, tmp_path: Path) -> None:
    cluster = write(tmp_path / "site", "~/.local/share/gpuinfra/keys/ssh/id_ed25519", "hosts/known_hosts")
    conn = inventory_yaml(load_cluster(cluster).resolved)["all"]["vars"]
    assert plain(conn["ansible_ssh_private_key_file"]) == str(home / ".local/share/gpuinfra/keys/ssh/id_ed25519")
    known_hosts = tmp_path / "site" / "hosts" / "known_hosts"
    assert plain(conn["ansible_ssh_common_args"]) == f"-o UserKnownHostsFile={known_hosts}"


@pytest.mark.parametrize("folder", ["site{{ 6 * 7 }}", "site{% raw %}", "site{# x #}"])
def test_a_folder_name_that_ansible_would_template_is_refused_at_the_path(
    folder: str, home: Path, tmp_path: Path
) -> None:
    """The cluster file's values admit no template, but the folder a relative path is taken from is not the file's:
    a path that would carry `{{`, `{%` or `{#` into Ansible's connection settings is refused at its line."""
    cluster = write(tmp_path / folder, "keys/id_ed25519", "~/known_hosts")
    with pytest.raises(InvalidInput) as caught:
        load_cluster(cluster)
    [problem] = caught.value.diagnostics
    assert (problem.line, problem.path) == (3, "connection.ssh_key"), problem
    assert "holds a template delimiter, from a folder's name, which Ansible would run" in problem.message


def test_the_committed_sandbox_keeps_its_key_in_the_home_folder_from_any_working_folder(
    home: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(tmp_path)
    loaded = load_cluster(ROOT / "inventories" / "sandbox" / "cluster.yml")
    spec = sandbox_spec(loaded, "localhost/img")
    assert spec.ssh_key == home / ".local/share/gpuinfra/sandbox/ssh/id_ed25519"
    assert spec.known_hosts == home / ".local/share/gpuinfra/sandbox/ssh/known_hosts"
    conn = inventory_yaml(loaded.resolved)["all"]["vars"]
    assert plain(conn["ansible_ssh_private_key_file"]) == str(spec.ssh_key)


def test_a_sandbox_refuses_to_write_its_key_into_a_git_work_tree(home: Path, tmp_path: Path) -> None:
    site = tmp_path / "site-repo"
    (site / ".git").mkdir(parents=True)
    cluster = write(site / "clusters", "state/id_ed25519", "state/known_hosts")
    spec = sandbox_spec(load_cluster(cluster), "localhost/img")  # status and down still work on it
    with pytest.raises(SandboxConfigError, match=r"connection.ssh_key is inside .*site-repo: .*no private key"):
        check_state_folder(spec, cluster)


def test_a_sandbox_refuses_to_write_its_key_into_gpuinfras_own_tree(home: Path, tmp_path: Path) -> None:
    inside = SOURCE_ROOT / ".gpuinfra" / "sandbox"
    cluster = write(tmp_path, str(inside / "id_ed25519"), str(inside / "known_hosts"))
    with pytest.raises(SandboxConfigError, match="no private key may be written into a repository"):
        check_state_folder(sandbox_spec(load_cluster(cluster), "localhost/img"), cluster)


def test_up_refuses_a_state_folder_in_a_repository_before_it_changes_anything(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpuinfra.sandbox import lifecycle, tools

    (tmp_path / "repo" / ".git").mkdir(parents=True)
    cluster = write(tmp_path / "repo", "state/id_ed25519", "state/known_hosts")
    monkeypatch.setattr(tools, "require", lambda _names: None)
    with pytest.raises(SandboxConfigError, match="no private key"):
        lifecycle.up(cluster, image="localhost/not-used")
    assert not (tmp_path / "repo" / "state").exists()


def test_a_home_folder_kept_in_git_does_not_count_as_a_repository(home: Path) -> None:
    (home / ".git").mkdir()
    assert repository_of(home / ".local" / "share" / "gpuinfra" / "x" / "ssh") is None
    assert repository_of(SOURCE_ROOT / "inventories") == SOURCE_ROOT


def test_the_state_folder_and_the_folders_made_on_the_way_are_private(home: Path) -> None:
    state = home / ".local" / "share" / "gpuinfra" / "demo" / "ssh"
    (home / ".local").mkdir(mode=0o755)
    ensure_state_dir(state)
    for folder in (state, state.parent, state.parent.parent, home / ".local" / "share"):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700, folder
    assert stat.S_IMODE((home / ".local").stat().st_mode) == 0o755  # already there: left alone


@pytest.mark.tools
def test_a_collection_build_leaves_state_secrets_and_key_files_out(tmp_path: Path) -> None:
    """ansible-lint and Molecule build this repository as a collection and install it under .ansible/ with files
    made world-readable: galaxy.yml's build_ignore keeps every private file out of that build."""
    tree = tmp_path / "checkout"
    (tree / "roles" / "demo" / "tasks").mkdir(parents=True)
    (tree / "roles" / "demo" / "tasks" / "main.yml").write_text("---\n[]\n")
    shutil.copy(ROOT / "galaxy.yml", tree)
    (tree / "README.md").write_text("demo\n")
    private = [".gpuinfra/sandbox/id_ed25519", ".ansible/tmp/secrets/munge.key", "secrets/db-password",
               "roles/demo/files/id_ed25519", "roles/demo/files/id_rsa", "keys/host.pem"]  # fmt: skip
    for name in private:
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        (tree / name).write_text("-----BEGIN OPENSSH PRIVATE KEY-----\n")
    galaxy = Path(sys.executable).parent / "ansible-galaxy"
    done = subprocess.run(
        [str(galaxy), "collection", "build", "--output-path", str(tmp_path)],
        cwd=tree, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    (built,) = tmp_path.glob("gpuinfra-cluster-*.tar.gz")
    with tarfile.open(built) as archive:
        names = archive.getnames()
    assert "roles/demo/tasks/main.yml" in names
    assert [
        name for name in names if name in private or name.split("/")[0] in (".gpuinfra", ".ansible", "secrets")
    ] == []
