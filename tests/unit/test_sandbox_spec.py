"""The sandbox's pure parts: container specs from a cluster file, what makes a file unfit, missing-tool messages."""

from __future__ import annotations

import json
from pathlib import Path

import container_sources
import pytest

from gpuinfra import sandbox
from gpuinfra.cli import exitcodes, main
from gpuinfra.sandbox import SandboxConfigError, sandbox_spec
from gpuinfra.sandbox.access import known_hosts_text
from gpuinfra.sandbox.image import DEFAULT_PLATFORM, INCLUDE, PLATFORMS, ImageResult, debootstrap_args
from gpuinfra.sandbox.resize import SUFFIX as RESIZE_SUFFIX
from gpuinfra.sandbox.resize import resized
from gpuinfra.sandbox.spec import COMPILER_CACHE, EMULATED_GPUS, network_create_args, run_args, spec_digest, user_id
from gpuinfra.sandbox.tools import MissingTools, missing_message, missing_tools, require
from gpuinfra.validate.load import load_cluster

ROOT = Path(__file__).resolve().parents[2]
SANDBOX = ROOT / "inventories" / "sandbox" / "cluster.yml"

SMALL = """\
name: tiny
connection:
  ssh_key: state/id_ed25519
  known_hosts_file: state/known_hosts
node_groups:
  head: {hosts: head1, addresses: {head1: 10.77.1.5}, roles: [slurm_controller, slurm_dbd, monitoring]}
  gpu:
    hosts: gpu[1-2]
    addresses: {gpu1: 10.77.1.6, gpu2: 10.77.1.7}
    roles: [slurm_compute]
    gpu: {model: L4, count: 3, emulated: true}
driver: {version: "535.261.03"}
slurm:
  partitions: {all: {node_groups: [gpu]}}
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "cluster.yml"
    path.write_text(text)
    return path


def test_one_container_per_host_with_fake_gpus_matching_the_group(tmp_path: Path) -> None:
    spec = sandbox_spec(load_cluster(write(tmp_path, SMALL)), "localhost/img")
    assert (spec.network, spec.subnet, spec.gateway) == ("gpuinfra-tiny", "10.77.1.0/24", "10.77.1.1")
    assert [(c.host, c.name, c.address, c.gpus) for c in spec.containers] == [
        ("head1", "tiny-head1", "10.77.1.5", 0),
        ("gpu1", "tiny-gpu1", "10.77.1.6", 3),
        ("gpu2", "tiny-gpu2", "10.77.1.7", 3),
    ]
    assert spec.containers[0].devices == []
    assert spec.containers[1].devices == [
        "/dev/null:/dev/nvidia0",
        "/dev/null:/dev/nvidia1",
        "/dev/null:/dev/nvidia2",
        "/dev/null:/dev/nvidiactl",
        "/dev/null:/dev/nvidia-uvm",
    ]
    # Relative key paths are taken from the cluster file's folder, like apply does.
    assert spec.ssh_key == tmp_path / "state" / "id_ed25519"
    assert spec.state_dir == tmp_path / "state"


def test_each_host_runs_the_base_image_of_its_os_unless_one_is_given(tmp_path: Path) -> None:
    text = (
        SMALL.replace("name: tiny\n", "name: tiny\nos: debian13\n")
        .replace('"535.261.03"', '"550.163.01"')
        .replace(
            "node_groups:\n",
            "node_groups:\n  mon: {hosts: mon1, addresses: {mon1: 10.77.1.8}, roles: [monitoring], os: debian12}\n",
        )
    )
    path = write(tmp_path, text)
    images = [c.image for c in sandbox_spec(load_cluster(path)).containers]
    assert images == ["localhost/gpuinfra-debian12"] + ["localhost/gpuinfra-debian13"] * 3
    assert {c.image for c in sandbox_spec(load_cluster(path), "localhost/img").containers} == {"localhost/img"}
    ubuntu = write(tmp_path, SMALL.replace("name: tiny\n", "name: tiny\nos: ubuntu24.04\n"))
    with pytest.raises(SandboxConfigError, match=r"host head1: os ubuntu24\.04 has no sandbox image"):
        sandbox_spec(load_cluster(ubuntu))


def test_podman_run_arguments(tmp_path: Path) -> None:
    spec = sandbox_spec(load_cluster(write(tmp_path, SMALL)), "localhost/img")
    gpu1 = spec.containers[1]
    args = run_args(spec, gpu1)
    assert args[:4] == ["run", "--detach", "--name", "tiny-gpu1"]
    assert args[-2:] == ["localhost/img", "/sbin/init"]

    def values(flag: str) -> list[str]:
        return [args[i + 1] for i, arg in enumerate(args) if arg == flag]

    assert values("--hostname") == ["gpu1"]
    assert values("--network") == ["gpuinfra-tiny"]
    assert values("--ip") == ["10.77.1.6"]
    assert values("--network-alias") == ["gpu1"]
    assert values("--runtime") == ["runc"]
    assert values("--systemd") == ["always"]
    assert values("--restart") == ["always"]  # a reboot inside brings it back, as a machine comes back
    assert values("--ulimit") == ["nofile=1024:1024", "nproc=4096:4096"]
    assert values("--device") == gpu1.devices
    assert values("--label") == ["gpuinfra.sandbox=tiny", f"gpuinfra.sandbox.spec={spec_digest(spec, gpu1)}"]
    # GPU nodes only: the emulated GPUs' answers, read-only, and the machine's compiler cache for their DKMS builds.
    assert values("--volume") == [
        f"{EMULATED_GPUS}:/usr/local/lib/gpuinfra-sandbox:ro",
        f"{COMPILER_CACHE}:/var/cache/ccache",
    ]
    assert "--volume" not in run_args(spec, spec.containers[0])
    assert network_create_args(spec) == [
        "network", "create", "--subnet", "10.77.1.0/24", "--gateway", "10.77.1.1",
        "--label", "gpuinfra.sandbox=tiny", "gpuinfra-tiny",
    ]  # fmt: skip


def test_the_digest_changes_with_image_and_gpus(tmp_path: Path) -> None:
    path = write(tmp_path, SMALL)
    spec = sandbox_spec(load_cluster(path), "localhost/img")
    other_image = sandbox_spec(load_cluster(path), "localhost/driver")
    more_gpus = sandbox_spec(load_cluster(write(tmp_path, SMALL.replace("count: 3", "count: 4"))), "localhost/img")
    digest = spec_digest(spec, spec.containers[1])
    assert digest == spec_digest(spec, spec.containers[1])
    assert digest != spec_digest(other_image, other_image.containers[1])
    assert digest != spec_digest(more_gpus, more_gpus.containers[1])


def test_the_committed_sandbox_is_a_controller_and_two_emulated_gpu_nodes() -> None:
    loaded = load_cluster(SANDBOX)
    assert loaded.warnings == []
    spec = sandbox_spec(loaded, "localhost/gpuinfra-debian12")
    assert [(c.host, c.gpus) for c in spec.containers] == [("ctl01", 0), ("gpu01", 2), ("gpu02", 2)]
    roles = {h.name: set(h.roles) for h in loaded.resolved.hosts.values()}
    assert roles["ctl01"] == {"slurm_controller", "slurm_dbd", "slurm_login", "monitoring"}
    assert roles["gpu01"] == roles["gpu02"] == {"slurm_compute"}
    assert all(h.gpu_emulated for h in loaded.resolved.gpu_hosts)
    assert loaded.model.slurm is not None and len(loaded.model.slurm.partitions) >= 2
    # The generated key pair lives beside the cluster's other secrets in the home folder, outside the repository.
    assert spec.state_dir == Path.home() / ".local" / "share" / "gpuinfra" / "sandbox" / "ssh"
    assert not spec.state_dir.is_relative_to(ROOT)


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (("addresses: {head1: 10.77.1.5}", "addresses: {}"), "host head1: needs an IPv4 address"),
        (("10.77.1.7", "10.77.2.7"), "span 2 /24 networks"),
        (("10.77.1.5", "10.77.1.1"), "is the network, gateway or broadcast address"),
        (("connection:\n", "connection:\n  user: admin\n"), "the sandbox logs in as root"),
        (("connection:\n", "connection:\n  port: 2222\n"), "sshd listens on 22"),
        (("connection:\n", "connection:\n  host_key_checking: false\n"), "keep it on"),
        (("connection:\n", "connection:\n  bastion: {host: jump}\n"), "reached directly"),
        (("  known_hosts_file: state/known_hosts\n", ""), "set connection.ssh_key and connection.known_hosts_file"),
        (("state/known_hosts", "elsewhere/known_hosts"), "must be in the same folder"),
    ],
)
def test_a_file_unfit_for_a_sandbox_says_why(tmp_path: Path, change: tuple[str, str], expected: str) -> None:
    loaded = load_cluster(write(tmp_path, SMALL.replace(*change)))
    with pytest.raises(SandboxConfigError, match=expected):
        sandbox_spec(loaded, "localhost/img")


def test_every_problem_is_reported_at_once(tmp_path: Path) -> None:
    text = SMALL.replace("connection:\n", "connection:\n  user: admin\n  port: 2222\n").replace("10.77.1.7", "gpu2")
    with pytest.raises(SandboxConfigError) as caught:
        sandbox_spec(load_cluster(write(tmp_path, text)), "localhost/img")
    assert str(caught.value).count("\n  - ") == 3


def test_every_host_gets_the_slurm_users_with_one_uid_each() -> None:
    """Jobs run as the accounts' users, so each sandbox host has them, as a directory service would give them."""
    spec = sandbox_spec(load_cluster(SANDBOX), "img")
    assert spec.users == ["alice", "bob"]
    assert len({user_id(name) for name in spec.users}) == 2
    assert all(10000 <= user_id(name) < 60000 for name in spec.users)
    assert user_id("alice") == user_id("alice")


def test_missing_tools_name_their_debian_packages() -> None:
    def which(tool: str) -> str | None:
        return None if tool in ("runc", "ssh", "ssh-keygen") else f"/usr/bin/{tool}"

    assert missing_tools(["podman", "runc", "ssh", "ssh-keygen"], which) == ["runc", "ssh", "ssh-keygen"]
    with pytest.raises(MissingTools) as caught:
        require(["podman", "runc", "ssh", "ssh-keygen"], which)
    assert caught.value.packages == ["openssh-client", "runc"]
    assert str(caught.value) == (
        "the sandbox needs runc, ssh, ssh-keygen, which are not installed; "
        "install them with: apt-get install openssh-client runc"
    )
    assert missing_message(["debootstrap"]) == (
        "the sandbox needs debootstrap, which is not installed; install it with: apt-get install debootstrap"
    )
    require(["podman"], which)  # present: no error


def test_missing_podman_is_a_message_and_exit_3_not_a_traceback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty folder: no podman, runc or ssh
    for action in ("up", "down", "status"):
        assert main(["sandbox", action, str(SANDBOX)]) == exitcodes.INVALID_INPUT
        err = capsys.readouterr().err
        assert err.startswith(f"gpuinfra sandbox {action}: the sandbox needs podman")
        assert "apt-get install" in err and "Traceback" not in err
    assert main(["sandbox", "image", "--json"]) == exitcodes.INVALID_INPUT
    doc = json.loads(capsys.readouterr().out)
    assert (doc["status"], doc["exit_code"]) == ("invalid", exitcodes.INVALID_INPUT)
    assert doc["errors"][0].endswith("install them with: apt-get install podman runc")


def test_an_unfit_file_exits_3_with_json(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = write(tmp_path, SMALL.replace("10.77.1.7", "gpu2"))
    assert main(["sandbox", "status", str(path), "--json"]) == exitcodes.INVALID_INPUT
    out = capsys.readouterr().out
    assert '"status": "invalid"' in out and "host gpu2: needs an IPv4 address" in out


def test_an_invalid_file_prints_its_diagnostics(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = write(tmp_path, SMALL.replace("count: 3", "count: many"))
    assert main(["sandbox", "up", str(path)]) == exitcodes.INVALID_INPUT
    assert "node_groups[gpu].gpu.count" in capsys.readouterr().err


def test_known_hosts_lines_name_address_and_host() -> None:
    text = known_hosts_text({"gpu1": ("10.77.1.6", "ssh-ed25519 AAAAkey1"), "gpu2": ("10.77.1.7", "ssh-ed25519 K2")})
    assert text == "10.77.1.6,gpu1 ssh-ed25519 AAAAkey1\n10.77.1.7,gpu2 ssh-ed25519 K2\n"


def test_the_image_has_what_the_working_rules_list() -> None:
    args = debootstrap_args(Path("/tmp/rootfs"))
    assert args[:2] == ["debootstrap", "--variant=minbase"]
    assert args[-3:] == ["trixie", "/tmp/rootfs", "http://deb.debian.org/debian"]
    assert set(INCLUDE) >= {"systemd", "systemd-sysv", "python3", "python3-apt", "openssh-server", "sudo", "kmod"}


def test_each_platform_image_is_its_suite_built_the_same_way() -> None:
    assert {name: (p.suite, p.image) for name, p in PLATFORMS.items()} == {
        "debian12": ("bookworm", "localhost/gpuinfra-debian12"),
        "debian13": ("trixie", "localhost/gpuinfra-debian13"),
    }
    trixie = debootstrap_args(Path("/tmp/rootfs"))
    bookworm = debootstrap_args(Path("/tmp/rootfs"), suite=PLATFORMS["debian12"].suite)
    assert bookworm == [arg.replace("trixie", "bookworm") for arg in trixie]


def test_the_default_image_is_the_sandbox_cluster_files_os() -> None:
    """scripts/setup builds the default image: the one the quickstart's sandbox starts its hosts from."""
    loaded = load_cluster(SANDBOX)
    assert {host.os for host in loaded.resolved.hosts.values()} == {DEFAULT_PLATFORM.os} == {"debian13"}


def test_image_command_builds_the_platform_asked_for(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[tuple[str, str]] = []

    def ensure(name: str, suite: str) -> ImageResult:
        asked.append((name, suite))
        return ImageResult(name, built=False, seconds=0.0)

    monkeypatch.setattr(sandbox, "ensure_image", ensure)
    assert main(["sandbox", "image", "--os", "debian12"]) == exitcodes.OK
    assert main(["sandbox", "image"]) == exitcodes.OK
    assert main(["sandbox", "image", "--os", "debian13", "--image", "localhost/other"]) == exitcodes.OK
    assert asked == [
        ("localhost/gpuinfra-debian12", "bookworm"),
        ("localhost/gpuinfra-debian13", "trixie"),
        ("localhost/other", "trixie"),
    ]


def test_gpu_nodes_resizes_the_emulated_group_and_keeps_the_rest(tmp_path: Path) -> None:
    source = write(tmp_path, "# the operator's comment\n" + SMALL)
    out = resized(source, 12, "img")
    assert out == tmp_path / "state" / f"cluster-12{RESIZE_SUFFIX}"
    assert out.read_text().startswith("# the operator's comment\n")
    spec = sandbox_spec(load_cluster(out), "img")
    gpus = {c.host: (c.address, c.gpus) for c in spec.containers if c.gpus}
    assert gpus == {f"gpu{i:02d}": (f"10.77.1.{5 + i}", 3) for i in range(1, 13)}  # numbered and addressed on
    assert [(c.host, c.address) for c in spec.containers if not c.gpus] == [("head1", "10.77.1.5")]
    assert spec.ssh_key == tmp_path / "state" / "id_ed25519"  # relative paths still name the source's folder


def test_gpu_nodes_grow_and_shrink_the_slurm_topology(tmp_path: Path) -> None:
    """New hosts join the leaf of the group's last host; hosts taken away leave theirs, and an emptied leaf goes."""
    leaves = "slurm:\n  topology: {leaves: {leaf1: gpu1, leaf2: gpu2}}\n"
    source = write(tmp_path, SMALL.replace("slurm:\n", leaves))
    grown = load_cluster(resized(source, 4, "img")).model.slurm
    assert grown is not None and grown.topology is not None
    assert grown.topology.leaves == {"leaf1": "gpu1", "leaf2": "gpu[2-4]"}
    shrunk = load_cluster(resized(source, 1, "img")).model.slurm
    assert shrunk is not None and shrunk.topology is not None
    assert shrunk.topology.leaves == {"leaf1": "gpu1"}


@pytest.mark.parametrize(
    ("gpu_nodes", "expected"),
    [(0, "--gpu-nodes must be 1 to 200, not 0"), (250, "--gpu-nodes must be 1 to 200, not 250")],
)
def test_gpu_nodes_out_of_range_is_refused(tmp_path: Path, gpu_nodes: int, expected: str) -> None:
    with pytest.raises(SandboxConfigError, match=expected):
        resized(write(tmp_path, SMALL), gpu_nodes, "img")


def test_gpu_nodes_that_overflow_the_subnet_are_refused(tmp_path: Path) -> None:
    path = write(tmp_path, SMALL.replace("10.77.1.6", "10.77.1.200").replace("10.77.1.7", "10.77.1.201"))
    with pytest.raises(SandboxConfigError, match=r"60 GPU nodes from 10\.77\.1\.200 do not fit in 10\.77\.1\.0/24"):
        resized(path, 60, "img")
    assert not (tmp_path / "state").exists()  # nothing written


def test_the_committed_sandbox_resizes_to_sixteen_gpu_nodes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))  # its state folder is under ~
    container_sources.link_into(tmp_path)
    spec = sandbox_spec(load_cluster(resized(SANDBOX, 16, "img")), "img")
    assert [c.host for c in spec.containers] == ["ctl01", *(f"gpu{i:02d}" for i in range(1, 17))]
    assert spec.containers[-1].address == "10.213.42.26"


def test_gpu_nodes_out_of_range_exits_3(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["sandbox", "up", str(write(tmp_path, SMALL)), "--gpu-nodes", "0"]) == exitcodes.INVALID_INPUT
    assert capsys.readouterr().err == "gpuinfra sandbox up: --gpu-nodes must be 1 to 200, not 0\n"
