"""Containers in Slurm jobs: the cluster file's `slurm.containers`, the release sources' checks, and what the
slurm_containers and slurm_common roles are given."""

from __future__ import annotations

import hashlib
from pathlib import Path

import jinja2
import pytest
import yaml

from gpuinfra import catalog
from gpuinfra.errors import InvalidInput
from gpuinfra.model import Cluster
from gpuinfra.render.inventory import groups
from gpuinfra.render.plan import render
from gpuinfra.render.vars import slurm
from gpuinfra.resolve import resolve
from gpuinfra.validate.load import load_cluster

ROOT = Path(__file__).resolve().parents[2]
ROLE = ROOT / "roles" / "slurm_containers"

CLUSTER = """\
name: c
driver: {version: "535.261.03"}
node_groups:
  head: {hosts: ctl01, roles: [slurm_controller, slurm_dbd, slurm_login]}
  gpu:
    hosts: gpu[01-02]
    roles: [slurm_compute]
    gpu: {model: L4, count: 2}
slurm:
  partitions:
    all: {node_groups: [gpu], default: true}
  containers:
    sources: sources
monitoring: {components: []}
"""


@pytest.fixture
def sources(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A sources folder beside the cluster file, with stand-in tarballs whose checksums are the pinned ones."""
    folder = tmp_path / "sources"
    folder.mkdir()
    pins = []
    for source in catalog.CONTAINER_SOURCES:
        data = f"stand-in for {source.file}".encode()
        (folder / source.file).write_bytes(data)
        pins.append(catalog.SourceTarball(source.file, hashlib.sha256(data).hexdigest(), source.url))
    monkeypatch.setattr(catalog, "CONTAINER_SOURCES", tuple(pins))
    return folder


def _write(tmp_path: Path, text: str = CLUSTER) -> Path:
    path = tmp_path / "cluster.yml"
    path.write_text(text)
    return path


def _errors(path: Path) -> list[str]:
    with pytest.raises(InvalidInput) as caught:
        load_cluster(path)
    return [f"{d.line}:{d.col}: {d.path}: {d.message}" for d in caught.value.diagnostics]


def test_the_sources_folder_is_taken_from_the_cluster_files_folder(tmp_path: Path, sources: Path) -> None:
    loaded = load_cluster(_write(tmp_path))
    containers = loaded.model.slurm.containers if loaded.model.slurm else None
    assert containers is not None and containers.sources == str(sources)
    # The toolkit is installed by default, so enroot's GPU hook has its nvidia-container-cli: no warning.
    assert loaded.warnings == []


def test_a_missing_folder_and_a_missing_tarball_are_errors(tmp_path: Path, sources: Path) -> None:
    assert _errors(_write(tmp_path, CLUSTER.replace("sources: sources", "sources: elsewhere"))) == [
        f"13:5: slurm.containers.sources: {tmp_path / 'elsewhere'} is not a folder; give the folder that holds "
        "enroot-4.1.2.tar.gz, makeself-5742be6.tar.gz, pyxis-0.24.0.tar.gz"
    ]
    (sources / "pyxis-0.24.0.tar.gz").unlink()
    assert _errors(_write(tmp_path)) == [
        f"13:5: slurm.containers.sources: {sources / 'pyxis-0.24.0.tar.gz'} is missing; download it from "
        "https://github.com/NVIDIA/pyxis/archive/refs/tags/v0.24.0.tar.gz"
    ]


def test_a_tarball_with_another_checksum_is_refused_with_both(tmp_path: Path, sources: Path) -> None:
    (sources / "enroot-4.1.2.tar.gz").write_bytes(b"something else")
    (error,) = _errors(_write(tmp_path))
    assert f"{sources / 'enroot-4.1.2.tar.gz'} has sha256 {hashlib.sha256(b'something else').hexdigest()}" in error
    assert f"not the pinned {catalog.CONTAINER_SOURCES[0].sha256}" in error


@pytest.mark.parametrize("path", ["/var/lib/$(id)", "relative/data", "/data dir", "/a/../b"])
def test_enroots_folders_are_plain_absolute_paths(tmp_path: Path, sources: Path, path: str) -> None:
    """enroot evaluates its settings in a shell: nothing but a plain absolute path reaches enroot.conf."""
    text = CLUSTER.replace("sources: sources", f"sources: sources\n    data_path: {path!r}")
    (error,) = _errors(_write(tmp_path, text))
    assert error.startswith("14:5: slurm.containers.data_path: ")


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("/etc", "/etc is in /etc, which the system owns"),
        ("/usr/local/bin", "/usr/local/bin is in /usr, which the system owns"),
        ("/var/lib/dpkg/x", "/var/lib/dpkg/x is in /var/lib/dpkg, which the system owns"),
        ("/lib64", "/lib64 is in /lib64, which the system owns"),
        ("/", "/ holds others' files"),
        ("/var/lib", "/var/lib holds others' files"),
        ("/var/./lib/", "/var/./lib/ holds others' files"),
    ],
)
def test_enroots_folders_are_never_system_folders(tmp_path: Path, sources: Path, path: str, message: str) -> None:
    """The role makes the parents root's and 0755 and removes what sits where a user's folder goes: never in a
    tree the system owns, never a folder that holds others' files."""
    text = CLUSTER.replace("sources: sources", f"sources: sources\n    cache_path: {path!r}")
    (error,) = _errors(_write(tmp_path, text))
    assert error.startswith(f"14:5: slurm.containers.cache_path: {message}"), error


def test_enroots_folders_are_apart(tmp_path: Path, sources: Path) -> None:
    text = CLUSTER.replace("sources: sources", "sources: sources\n    cache_path: /var/lib/enroot/data/cache")
    (error,) = _errors(_write(tmp_path, text))
    assert "slurm.containers: data_path /var/lib/enroot/data and cache_path /var/lib/enroot/data/cache" in error


def test_packages_are_never_built_where_jobs_run(tmp_path: Path, sources: Path) -> None:
    head = "roles: [slurm_controller, slurm_dbd, slurm_login]"
    text = CLUSTER.replace(head, "roles: [slurm_controller, slurm_compute]")
    refused = "slurm.containers: enroot and pyxis are built on the Slurm controller, where no job"
    assert any(refused in error for error in _errors(_write(tmp_path, text)))


def test_no_toolkit_warns_that_gpu_images_will_not_start(tmp_path: Path, sources: Path) -> None:
    loaded = load_cluster(_write(tmp_path, CLUSTER + "container_toolkit: {install: false}\n"))
    assert [w.path for w in loaded.warnings] == ["slurm.containers"]
    assert "nvidia-container-cli" in loaded.warnings[0].message


def test_every_host_that_runs_or_submits_jobs_gets_them_compute_hosts_first(tmp_path: Path, sources: Path) -> None:
    resolved = load_cluster(_write(tmp_path)).resolved
    assert groups(resolved)["slurm_containers"] == ["gpu01", "gpu02", "ctl01"]
    variables = slurm.group_vars(resolved)
    assert variables["slurm_common_containers"] is True
    assert variables["slurm_containers_build_sources"] == str(sources)
    assert variables["slurm_containers_build_checksums"] == {s.file: s.sha256 for s in catalog.CONTAINER_SOURCES}
    # One folder of packages per cluster, release and version on the controller, built into and installed from.
    packages = "~/.cache/gpuinfra/packages/c/bookworm/enroot-4.1.2_pyxis-0.24.0"
    assert variables["slurm_containers_build_dest"] == variables["slurm_containers_packages_dir"] == packages
    # Built where no job runs.
    assert variables["slurm_containers_build_host"] == "ctl01"


def test_off_by_default(tmp_path: Path) -> None:
    resolved = load_cluster(_write(tmp_path, CLUSTER.replace("  containers:\n    sources: sources\n", ""))).resolved
    assert groups(resolved)["slurm_containers"] == []
    assert slurm.group_vars(resolved)["slurm_common_containers"] is False
    (plugstack,) = render(resolved, only=[a for a in slurm.ARTIFACTS if a.path == "slurm/plugstack.conf"])
    assert [line for line in plugstack.content.splitlines() if not line.startswith("#")] == []


def test_plugstack_loads_pyxis(tmp_path: Path, sources: Path) -> None:
    resolved = load_cluster(_write(tmp_path)).resolved
    (plugstack,) = render(resolved, only=[a for a in slurm.ARTIFACTS if a.path == "slurm/plugstack.conf"])
    lines = [line for line in plugstack.content.splitlines() if not line.startswith("#")]
    # A named container lives as long as its job, in its user's own folder.
    assert lines == ["required /usr/lib/x86_64-linux-gnu/slurm/spank_pyxis.so container_scope=job"]


def test_the_roles_defaults_are_what_the_cluster_file_gets() -> None:
    """A plain-inventory user gets the same releases, checksums and package folder as a cluster file's."""
    build = yaml.safe_load((ROOT / "roles" / "slurm_containers_build" / "defaults" / "main.yml").read_text())
    install = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    rendered = slurm.containers_vars(resolve(Cluster.model_validate(yaml.safe_load(CLUSTER))))
    defaults = {**build, **install}
    facts = {"ansible_facts": {"distribution_release": "bookworm"}, "gpuinfra_cluster_name": "c"}
    facts["groups"] = {"slurm_controller": ["ctl01"], "slurm_compute": ["gpu01", "gpu02"]}
    for name in ("slurm_containers_build_dest", "slurm_containers_packages_dir", "slurm_containers_build_host"):
        defaults[name] = jinja2.Template(defaults[name]).render(**defaults, **facts)
    for name, value in rendered.items():  # the versions, checksums and folders: the catalog's
        if name != "slurm_containers_build_sources":  # required: the role has no default
            assert defaults[name] == value, name


def test_emulated_gpus_need_no_toolkit(tmp_path: Path, sources: Path) -> None:
    """The sandbox's GPUs have no driver for the hook to bring into a container: no warning there."""
    text = CLUSTER.replace("gpu: {model: L4, count: 2}", "gpu: {model: L4, count: 2, emulated: true}")
    assert load_cluster(_write(tmp_path, text + "container_toolkit: {install: false}\n")).warnings == []
