"""nvidia_container_toolkit: the runtime configurations it writes, accepted by the real runtimes' parsers.

containerd merges the drop-in through its main configuration (`containerd --config FILE config dump`); dockerd
loads and validates daemon.json (`dockerd --validate` from docker 23 on; older dockerd, such as Debian 12's
20.10, run as an unprivileged user, load and validate the file, then stop at their root check before they create
anything). Each check is skipped, saying so, where its binary is not installed: `apt-get install containerd
docker.io` provides both.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template
from ruamel.yaml import YAML

from gpuinfra.model import Cluster
from gpuinfra.render.vars import toolkit
from gpuinfra.resolve import resolve

pytestmark = pytest.mark.tools  # runs Ansible or a system tool (tests/unit/tool_guard.py)

ROOT = Path(__file__).resolve().parents[2]
ROLE = ROOT / "roles" / "nvidia_container_toolkit"
NOBODY = 65534


def _trusted(value: Any) -> Any:
    if isinstance(value, str):
        return trust_as_template(value)
    if isinstance(value, list):
        return [_trusted(v) for v in value]
    if isinstance(value, dict):
        return {k: _trusted(v) for k, v in value.items()}
    return value


def render(template: str, **overrides: Any) -> str:
    """Render a role template as the role does: role defaults, then the given variables."""
    variables = _trusted(YAML(typ="safe").load((ROLE / "defaults" / "main.yml").read_text()))
    variables.update(overrides)
    variables["ansible_managed"] = "Managed by gpuinfra"
    source = (ROLE / "templates" / template).read_text()
    return str(Templar(loader=DataLoader(), variables=variables).template(trust_as_template(source)))


@pytest.fixture
def tmp_path() -> Iterator[Path]:
    """A folder the parsers can read when they run as nobody (pytest's own temporary folders are private)."""
    with tempfile.TemporaryDirectory(prefix="gpuinfra-toolkit-") as name:
        path = Path(name)
        path.chmod(0o755)
        yield path


def _binary(name: str) -> str:
    path = shutil.which(name) or next(
        (p for p in (f"/usr/sbin/{name}", f"/usr/bin/{name}") if os.access(p, os.X_OK)), None
    )
    if path is None:
        pytest.skip(f"{name} is not installed: the real parser checks this file (apt-get install containerd docker.io)")
    return path


def _run(argv: list[str], unprivileged: bool = False) -> subprocess.CompletedProcess[str]:
    """Run a parser; as root, drop to nobody where asked so that no daemon could start."""
    extra: dict[str, Any] = {}
    if unprivileged and os.geteuid() == 0:
        extra = {"user": NOBODY, "group": NOBODY, "extra_groups": []}
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False, cwd="/", **extra)


# --- containerd ------------------------------------------------------------------------------------------------

# Debian 12's /etc/containerd/config.toml, as its containerd package ships it.
DEBIAN_CONTAINERD_CONFIG = """version = 2

[plugins]
  [plugins."io.containerd.grpc.v1.cri"]
    [plugins."io.containerd.grpc.v1.cri".cni]
      bin_dir = "/usr/lib/cni"
      conf_dir = "/etc/cni/net.d"
  [plugins."io.containerd.internal.v1.opt"]
    path = "/var/lib/containerd/opt"
"""
CRI = "io.containerd.grpc.v1.cri"


def _containerd_schema_2() -> str:
    containerd = _binary("containerd")
    version = _run([containerd, "--version"]).stdout
    match = re.search(r"\s v?(\d+)\.\d+", version)
    if match is not None and int(match.group(1)) >= 2:
        pytest.skip("containerd 2.x reads schema 3; see the schema 3 test")
    return containerd


def _dump(containerd: str, config: Path) -> subprocess.CompletedProcess[str]:
    return _run([containerd, "--config", str(config), "config", "dump"], unprivileged=True)


def _apply_role(containerd: str, tmp_path: Path, site: str | None, **options: Any) -> dict[str, Any]:
    """Do what the role does to a site's main configuration (None: there is none), then parse the result.

    The role writes a fresh main configuration or adds the imports line, dumps the site's configuration without
    its imports through containerd, and renders the drop-in from that dump.
    """
    conf_d = tmp_path / "conf.d"
    conf_d.mkdir()
    options = {"nvidia_container_toolkit_containerd_dropin_dir": str(conf_d), **options}
    main = tmp_path / "config.toml"
    main.write_text(render("containerd-config.toml.j2", **options) if site is None else site)
    site_only = tmp_path / "site.toml"
    site_only.write_text(re.sub(r"(?m)^[ \t]*imports[ \t]*=.*$", "", main.read_text()))
    site_dump = _dump(containerd, site_only)
    assert site_dump.returncode == 0, site_dump.stderr
    if site is not None:
        main.write_text(f'imports = ["{conf_d}/*.toml"]\n' + site)  # the role's lineinfile, before the first line
    dropin = render(
        "containerd-nvidia.toml.j2", __nvidia_container_toolkit_containerd_site_dump=site_dump.stdout, **options
    )
    (conf_d / "99-nvidia.toml").write_text(dropin)
    merged = _dump(containerd, main)
    assert merged.returncode == 0, merged.stderr
    assert f'"{conf_d}/99-nvidia.toml"' in merged.stdout  # the import was followed
    return tomllib.loads(merged.stdout)


@pytest.mark.parametrize("default_runtime", [False, True])
def test_containerd_merges_the_dropin_into_a_fresh_config(tmp_path: Path, default_runtime: bool) -> None:
    containerd = _containerd_schema_2()
    merged = _apply_role(containerd, tmp_path, None, nvidia_container_toolkit_default_runtime=default_runtime)
    cri = merged["plugins"][CRI]["containerd"]
    nvidia = cri["runtimes"]["nvidia"]
    assert nvidia["runtime_type"] == "io.containerd.runc.v2"
    assert nvidia["options"]["BinaryName"] == "/usr/bin/nvidia-container-runtime"
    assert nvidia["options"]["SystemdCgroup"] is True
    assert cri["runtimes"]["runc"]["runtime_type"] == "io.containerd.runc.v2", "the stock runtime stays"
    assert cri["default_runtime_name"] == ("nvidia" if default_runtime else "runc")


@pytest.mark.parametrize("default_runtime", [False, True])
def test_containerd_keeps_the_settings_of_debians_config(tmp_path: Path, default_runtime: bool) -> None:
    """containerd 1.x replaces the CRI section with the imported one: the drop-in must carry the site's settings."""
    containerd = _containerd_schema_2()
    merged = _apply_role(
        containerd, tmp_path, DEBIAN_CONTAINERD_CONFIG, nvidia_container_toolkit_default_runtime=default_runtime
    )
    plugins = merged["plugins"]
    assert plugins[CRI]["cni"]["bin_dir"] == "/usr/lib/cni"
    assert plugins["io.containerd.internal.v1.opt"]["path"] == "/var/lib/containerd/opt"
    runtimes = plugins[CRI]["containerd"]["runtimes"]
    assert set(runtimes) == {"runc", "nvidia"}
    assert runtimes["nvidia"]["options"]["BinaryName"] == "/usr/bin/nvidia-container-runtime"
    assert plugins[CRI]["containerd"]["default_runtime_name"] == ("nvidia" if default_runtime else "runc")


def test_containerd_replaces_an_nvidia_runtime_the_site_already_had(tmp_path: Path) -> None:
    containerd = _containerd_schema_2()
    site = (
        DEBIAN_CONTAINERD_CONFIG
        + f'  [plugins."{CRI}".containerd.runtimes.nvidia]\n    runtime_type = "io.containerd.runc.v2"\n'
        + f'    [plugins."{CRI}".containerd.runtimes.nvidia.options]\n      BinaryName = "/opt/old/runtime"\n'
    )
    merged = _apply_role(
        containerd, tmp_path, site, nvidia_container_toolkit_runtime_path="/usr/bin/nvidia-container-runtime"
    )
    runtimes = merged["plugins"][CRI]["containerd"]["runtimes"]
    assert runtimes["nvidia"]["options"]["BinaryName"] == "/usr/bin/nvidia-container-runtime"
    assert merged["plugins"][CRI]["cni"]["bin_dir"] == "/usr/lib/cni"


def test_containerd_1_replaces_the_cri_section_with_an_imported_one(tmp_path: Path) -> None:
    """Why the drop-in restates the site's settings: a drop-in with only the runtime loses runc and the CNI path."""
    containerd = _containerd_schema_2()
    conf_d = tmp_path / "conf.d"
    conf_d.mkdir()
    (conf_d / "99-nvidia.toml").write_text(render("containerd-nvidia.toml.j2"))  # no site dump: the runtime alone
    (tmp_path / "config.toml").write_text(f'imports = ["{conf_d}/*.toml"]\n' + DEBIAN_CONTAINERD_CONFIG)
    result = _dump(containerd, tmp_path / "config.toml")
    assert result.returncode == 0, result.stderr
    cri = tomllib.loads(result.stdout)["plugins"][CRI]
    assert "runc" not in cri["containerd"]["runtimes"]
    assert cri["cni"]["bin_dir"] == "/opt/cni/bin"


def test_containerd_rejects_a_broken_dropin(tmp_path: Path) -> None:
    """The parser really reads the drop-in: a broken one fails the dump, naming the file."""
    containerd = _binary("containerd")
    conf_d = tmp_path / "conf.d"
    conf_d.mkdir()
    (conf_d / "99-nvidia.toml").write_text(render("containerd-nvidia.toml.j2").replace("]\n", "\n", 1))
    (tmp_path / "config.toml").write_text(f'version = 2\nimports = ["{conf_d}/*.toml"]\n')
    result = _dump(containerd, tmp_path / "config.toml")
    assert result.returncode != 0
    assert "99-nvidia.toml" in result.stderr and "permission denied" not in result.stderr, result.stderr


# --- docker ----------------------------------------------------------------------------------------------------


def _dockerd_validate(path: Path) -> tuple[bool, str]:
    dockerd = _binary("dockerd")
    if "--validate" in _run([dockerd, "--help"]).stdout:
        result = _run([dockerd, "--validate", "--config-file", str(path)])
        return result.returncode == 0, result.stderr + result.stdout
    result = _run([dockerd, "--config-file", str(path)], unprivileged=True)
    output = result.stderr + result.stdout
    if "unable to configure the Docker daemon" in output:
        return False, output
    assert "needs to be started with root" in output, f"dockerd neither rejected nor accepted the file: {output}"
    return True, output


@pytest.mark.parametrize("default_runtime", [False, True])
def test_dockerd_accepts_daemon_json(tmp_path: Path, default_runtime: bool) -> None:
    current = {"log-driver": "journald", "runtimes": {"crun": {"path": "/usr/bin/crun"}}}
    text = render(
        "docker-daemon.json.j2",
        __nvidia_container_toolkit_docker_current=current,
        nvidia_container_toolkit_default_runtime=default_runtime,
    )
    config = json.loads(text)
    assert config["log-driver"] == "journald", "settings already there are kept"
    assert config["runtimes"] == {
        "crun": {"path": "/usr/bin/crun"},
        "nvidia": {"path": "/usr/bin/nvidia-container-runtime", "args": []},
    }
    assert ("default-runtime" in config) is default_runtime
    path = tmp_path / "daemon.json"
    path.write_text(text)
    ok, output = _dockerd_validate(path)
    assert ok, output


def test_dockerd_rejects_a_default_runtime_it_does_not_know(tmp_path: Path) -> None:
    """The validation is real: dockerd refuses a default runtime that no runtime entry defines."""
    path = tmp_path / "daemon.json"
    config = json.loads(render("docker-daemon.json.j2", nvidia_container_toolkit_default_runtime=True))
    del config["runtimes"]["nvidia"]
    path.write_text(json.dumps(config))
    ok, output = _dockerd_validate(path)
    assert not ok and "nvidia" in output


def test_daemon_json_without_earlier_settings() -> None:
    assert json.loads(render("docker-daemon.json.j2")) == {
        "runtimes": {"nvidia": {"path": "/usr/bin/nvidia-container-runtime", "args": []}}
    }


# --- cri-o -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("default_runtime", [False, True])
def test_crio_dropin_structure(default_runtime: bool) -> None:
    text = render("crio-nvidia.toml.j2", nvidia_container_toolkit_default_runtime=default_runtime)
    runtime = tomllib.loads(text)["crio"]["runtime"]
    assert runtime["runtimes"]["nvidia"] == {"runtime_path": "/usr/bin/nvidia-container-runtime", "runtime_type": "oci"}
    assert (runtime.get("default_runtime") == "nvidia") is default_runtime


# --- model -> role variables -----------------------------------------------------------------------------------


def _specs() -> dict[str, Any]:
    specs = YAML(typ="safe").load((ROLE / "meta" / "argument_specs.yml").read_text())
    return specs["argument_specs"]["main"]["options"]  # type: ignore[no-any-return]


def test_group_vars_from_the_model() -> None:
    gpu = {"hosts": "gpu01", "roles": ["k8s_gpu_worker"], "gpu": {"model": "H100-SXM5-80GB", "count": 8}}
    toolkit_section = {
        "runtimes": ["containerd", "docker"],
        "version": "1.17.8",
        "default_runtime": True,
        "source": {"type": "mirror", "url": "https://mirror.example/libnvidia-container/stable/deb/amd64"},
    }
    rc = resolve(
        Cluster.model_validate({"name": "lab", "node_groups": {"gpu": gpu}, "container_toolkit": toolkit_section})
    )
    out = toolkit.group_vars(rc)
    assert out["nvidia_container_toolkit_runtimes"] == ["containerd", "docker"]
    assert out["nvidia_container_toolkit_version"] == "1.17.8"
    assert out["nvidia_container_toolkit_default_runtime"] is True
    assert out["nvidia_container_toolkit_source_type"] == "mirror"
    assert out["nvidia_container_toolkit_source_url"].startswith("https://mirror.example/")
    options = _specs()
    kinds = {"str": str, "int": int, "bool": bool, "list": list}
    for name, value in out.items():
        assert name in options, name
        assert isinstance(value, kinds[options[name]["type"]]), name


def test_artifacts_are_role_templates() -> None:
    assert {a.template for a in toolkit.ARTIFACTS} == {
        "containerd-nvidia.toml.j2",
        "docker-daemon.json.j2",
        "crio-nvidia.toml.j2",
    }
    for artifact in toolkit.ARTIFACTS:
        assert (ROOT / "roles" / artifact.role / "templates" / artifact.template).exists()
        assert artifact.host_role == "gpu_nodes"
