"""nvidia_driver and gpu_kernel_gate variables: per-OS package names and pins, the model mapping, rendered files.

The per-OS variables are rendered with Ansible's own templar, as a play would see them. The apt files the role
writes are checked with apt's own parsers where apt is installed. Ubuntu and RHEL are covered here only: their
packages are not installed by any test on this machine.
"""

from __future__ import annotations

import fnmatch
import json
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest
from ansible.inventory.manager import InventoryManager
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template
from ansible.vars.manager import VariableManager
from ruamel.yaml import YAML

from gpuinfra.model import Cluster
from gpuinfra.render import plan
from gpuinfra.render.inventory import inventory_yaml
from gpuinfra.render.vars import driver
from gpuinfra.resolve import resolve

ROOT = Path(__file__).resolve().parents[2]
ROLES = ROOT / "roles"

FACTS = {
    "Debian": {"distribution": "Debian", "os_family": "Debian", "distribution_major_version": "12",
               "distribution_version": "12.11", "distribution_release": "bookworm", "architecture": "x86_64"},
    "Debian13": {"distribution": "Debian", "os_family": "Debian", "distribution_major_version": "13",
                 "distribution_version": "13.8", "distribution_release": "trixie", "architecture": "x86_64"},
    "Ubuntu": {"distribution": "Ubuntu", "os_family": "Debian", "distribution_major_version": "22",
               "distribution_version": "22.04", "distribution_release": "jammy", "architecture": "x86_64"},
    "RedHat": {"distribution": "RedHat", "os_family": "RedHat", "distribution_major_version": "9",
               "distribution_version": "9.4", "distribution_release": "Plow", "architecture": "x86_64"},
}  # fmt: skip

# Binary packages of Debian 12's nvidia-graphics-drivers and nvidia-open-gpu-kernel-modules sources at 535.261.03.
DEBIAN_DRIVER_BINARIES = """
firmware-nvidia-gsp libcuda1 libcudadebugger1 libegl-nvidia0 libgl1-nvidia-glvnd-glx libgles-nvidia1
libgles-nvidia2 libglx-nvidia0 libnvcuvid1 libnvidia-allocator1 libnvidia-api1 libnvidia-cfg1 libnvidia-eglcore
libnvidia-encode1 libnvidia-fbc1 libnvidia-glcore libnvidia-glvkspirv libnvidia-ml1 libnvidia-ngx1 libnvidia-nvvm4
libnvidia-opticalflow1 libnvidia-pkcs11-openssl3 libnvidia-ptxjitcompiler1 libnvidia-rtcore libnvoptix1
nvidia-alternative nvidia-cuda-mps nvidia-detect nvidia-driver nvidia-driver-bin nvidia-driver-full
nvidia-driver-libs nvidia-egl-common nvidia-egl-icd nvidia-kernel-dkms nvidia-kernel-source nvidia-kernel-support
nvidia-legacy-check nvidia-libopencl1 nvidia-open-kernel-dkms nvidia-open-kernel-source nvidia-open-kernel-support
nvidia-opencl-common nvidia-opencl-icd nvidia-powerd nvidia-smi nvidia-suspend-common nvidia-vdpau-driver
nvidia-vulkan-common nvidia-vulkan-icd xserver-xorg-video-nvidia
""".split()  # noqa: SIM905 (a word list reads better as text)


# Variables that read what a run found on the host (package facts, registered results).
NEED_HOST_STATE = {
    "__nvidia_driver_held_packages",
    "__nvidia_driver_kernel_list",
    "__nvidia_driver_headers",
}


def _yaml(path: Path) -> dict[str, Any]:
    """A role's variables file; a role without one for this OS has none."""
    return (YAML(typ="safe").load(path.read_text()) or {}) if path.is_file() else {}


def _trusted(value: Any) -> Any:
    if isinstance(value, str):
        return trust_as_template(value)
    if isinstance(value, list):
        return [_trusted(v) for v in value]
    if isinstance(value, dict):
        return {k: _trusted(v) for k, v in value.items()}
    return value


def _templar(role: str, os_name: str, facts: dict[str, str] | None, overrides: dict[str, Any]) -> Templar:
    """The role's variables for one OS: defaults < overrides < vars/main.yml < vars/<OS>.yml. `facts` changes some of
    the OS's facts (another release or architecture)."""
    layers = _yaml(ROLES / role / "defaults" / "main.yml")
    layers.update(overrides)
    layers.update(_yaml(ROLES / role / "vars" / "main.yml"))
    os_file = ROLES / role / "vars" / f"{os_name}.yml"
    layers.update(_yaml(os_file if os_file.exists() else ROLES / role / "vars" / f"{FACTS[os_name]['os_family']}.yml"))
    all_facts = {**FACTS[os_name], **(facts or {})}
    variables = {**_trusted(layers), "ansible_facts": all_facts, "inventory_hostname": "gpu01"}
    return Templar(loader=DataLoader(), variables=variables)


def role_vars(role: str, os_name: str, facts: dict[str, str] | None = None, **overrides: Any) -> dict[str, Any]:
    """Every internal variable of the role, rendered for one OS (see _templar)."""
    templar = _templar(role, os_name, facts, overrides)
    return {
        k: templar.template(v)
        for k, v in templar.available_variables.items()
        if k.startswith(f"__{role}_") and k not in NEED_HOST_STATE
    }


def package_source_settings(os_name: str, **overrides: Any) -> dict[str, Any]:
    """What the driver hands the package_source role (tasks/source.yml), rendered for one OS; the packages from the
    host's other sources name its kernels, which only a run finds."""
    [task] = YAML(typ="safe").load((ROLES / "nvidia_driver" / "tasks" / "source.yml").read_text())
    templar = _templar("nvidia_driver", os_name, None, overrides)
    given = {k: v for k, v in task["vars"].items() if k != "package_source_archive_packages"}
    return {k: templar.template(_trusted(v)) for k, v in given.items()}


def render(role: str, template: str, os_name: str = "Debian", **overrides: Any) -> str:
    """A role template rendered as `gpuinfra plan` renders it: defaults < overrides < vars/main.yml."""
    layers = {**_yaml(ROLES / role / "defaults" / "main.yml"), **overrides}
    variables = _trusted({**layers, **_yaml(ROLES / role / "vars" / "main.yml")})
    variables.update({"ansible_managed": "Managed by gpuinfra", "ansible_facts": FACTS[os_name]})
    source = (ROLES / role / "templates" / template).read_text()
    return str(Templar(loader=DataLoader(), variables=variables).template(trust_as_template(source)))


# --- per-OS package names ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("os_name", "source", "modules", "dkms_package", "dkms_module"),
    [
        ("Debian", "distribution", "proprietary", "nvidia-kernel-dkms", "nvidia-current"),
        ("Debian", "distribution", "open", "nvidia-open-kernel-dkms", "nvidia-current-open"),
        ("Debian", "nvidia", "proprietary", "nvidia-kernel-dkms", "nvidia-current"),
        ("Ubuntu", "distribution", "proprietary", "nvidia-dkms-535-server", "nvidia"),
        ("Ubuntu", "distribution", "open", "nvidia-dkms-535-server-open", "nvidia"),
        ("Ubuntu", "nvidia", "proprietary", "nvidia-dkms-535", "nvidia"),
        ("Ubuntu", "mirror", "open", "nvidia-dkms-535-open", "nvidia"),
        ("RedHat", "nvidia", "proprietary", "kmod-nvidia-latest-dkms", "nvidia"),
        ("RedHat", "nvidia", "open", "kmod-nvidia-open-dkms", "nvidia"),
    ],
)
def test_dkms_package_and_module(os_name: str, source: str, modules: str, dkms_package: str, dkms_module: str) -> None:
    v = role_vars(
        "nvidia_driver",
        os_name,
        nvidia_driver_version="535.261.03",
        nvidia_driver_source_type=source,
        nvidia_driver_kernel_modules=modules,
    )
    assert v["__nvidia_driver_dkms_package"] == dkms_package
    assert v["__nvidia_driver_packages"][0] == dkms_package
    assert v["__nvidia_driver_dkms_module"] == dkms_module
    gate = role_vars("gpu_kernel_gate", os_name, gpu_kernel_gate_kernel_modules=modules)
    assert gate["__gpu_kernel_gate_module_name"] == dkms_module, "the gate must look for the module the driver builds"


def test_debian_packages_are_the_headless_compute_set() -> None:
    v = role_vars("nvidia_driver", "Debian", nvidia_driver_version="535.261.03")
    assert v["__nvidia_driver_packages"] == [
        "nvidia-kernel-dkms",
        "nvidia-smi",
        "libcuda1",
        "libnvidia-ml1",
        "libnvidia-cfg1",
    ]
    # Debian builds these from other sources at other versions (535.171.04, 535.161.07): not version-pinned.
    assert v["__nvidia_driver_unversioned_packages"] == ["nvidia-persistenced"]
    assert {"nvidia-persistenced", "nvidia-modprobe"} <= set(v["__nvidia_driver_companion_packages"])
    assert v["__nvidia_driver_headers_prefix"] == "linux-headers-"
    release = re.match(v["__nvidia_driver_initramfs_release_regex"], "initrd.img-6.12.57+deb12-rt-amd64")
    assert release is not None and release.group(1) == "6.12.57+deb12-rt-amd64"
    assert v["__nvidia_driver_initramfs_command"] == ["update-initramfs", "-u", "-k"]
    assert v["__nvidia_driver_base_packages"] == ["dkms"]
    assert v["__nvidia_driver_debian_components"] == ["contrib", "non-free", "non-free-firmware"]
    assert "distribution" not in v["__nvidia_driver_fabric_manager_sources"], "Debian's archive has no fabric manager"
    assert (
        v["__nvidia_driver_nvidia_repo_url"]
        == "https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/"
    )


def test_each_debian_release_pins_the_key_nvidia_signs_its_repository_with() -> None:
    """debian12's CUDA repository is signed by 3bf863cc, debian13's by 8793F200: the nvidia source fetches each
    release's own key and pins its fingerprint."""
    expected = {
        "Debian": ("/repos/debian12/x86_64/3bf863cc.pub", "EB693B3035CD5710E231E123A4B469963BF863CC"),
        "Debian13": ("/repos/debian13/x86_64/8793F200.pub", "02182E60104FCDC26EAE1B8597A5D4CB8793F200"),
    }
    for facts, (key, fingerprint) in expected.items():
        v = role_vars("nvidia_driver", facts, nvidia_driver_source_type="nvidia")
        assert v["__nvidia_driver_nvidia_repo_key"].endswith(key), facts
        assert v["__nvidia_driver_nvidia_repo_fingerprint"] == fingerprint, facts


@pytest.mark.parametrize("os_name", ["Debian", "Debian13", "Ubuntu", "RedHat"])
def test_nvidias_repository_reaches_the_package_source_role_with_its_pinned_key(os_name: str) -> None:
    """The nvidia source is a vendor source of the package_source role, which refuses one without a full
    fingerprint: every OS pins the key NVIDIA signs its repository with, fetched over https from the repository."""
    settings = package_source_settings(os_name, nvidia_driver_source_type="nvidia", nvidia_driver_version="535.261.03")
    repo = role_vars("nvidia_driver", os_name)["__nvidia_driver_nvidia_repo_url"]
    assert (settings["package_source_name"], settings["package_source_type"]) == ("nvidia-driver", "vendor")
    assert settings["package_source_vendor_url"] == repo and repo.startswith("https://developer.download.nvidia.com/")
    assert settings["package_source_vendor_key_url"].startswith(repo)
    assert re.fullmatch("[0-9A-F]{40}", settings["package_source_vendor_fingerprint"]), settings
    assert settings["package_source_settings_prefix"] == "nvidia_driver_source"


@pytest.mark.parametrize(
    ("source", "expected"),
    [("distribution", "configured"), ("nvidia", "vendor"), ("mirror", "mirror"), ("local", "local")],
)
def test_each_driver_source_is_a_package_source(source: str, expected: str) -> None:
    """Every driver source maps onto the package_source role, with the driver's packages at the pinned version (apt)
    or the exact one (dnf), the DNF module stream on RHEL only, and a refresh only when this run changed the archive
    components."""
    debian = package_source_settings("Debian", nvidia_driver_source_type=source, nvidia_driver_version="535.261.03")
    assert debian["package_source_type"] == expected
    assert debian["package_source_packages"] == role_vars("nvidia_driver", "Debian")["__nvidia_driver_install_packages"]
    assert (debian["package_source_version"], debian["package_source_dnf_modules"]) == ("535.261.03-*", [])
    assert debian["package_source_refresh"] is False
    rhel = package_source_settings("RedHat", nvidia_driver_source_type=source, nvidia_driver_version="535.261.03")
    assert (rhel["package_source_version"], rhel["package_source_dnf_modules"]) == (
        "535.261.03", ["nvidia-driver:535-dkms"])  # fmt: skip


def test_debian_13_takes_the_same_packages_at_its_550_driver() -> None:
    """trixie's nvidia-graphics-drivers 550.163.01 keeps bookworm's package and DKMS module names
    (nvidia-kernel-dkms builds /usr/src/nvidia-current-550.163.01), so one vars file serves both releases."""
    bookworm = role_vars("nvidia_driver", "Debian", nvidia_driver_version="535.261.03")
    trixie = role_vars("nvidia_driver", "Debian13", nvidia_driver_version="550.163.01")
    for name in ("__nvidia_driver_packages", "__nvidia_driver_dkms_module", "__nvidia_driver_debian_components"):
        assert trixie[name] == bookworm[name], name
    assert trixie["__nvidia_driver_major"] == 550
    assert trixie["__nvidia_driver_nvidia_repo_url"].endswith("/repos/debian13/x86_64/")
    pin = render("nvidia_driver", "nvidia-driver.pref.j2", "Debian13", nvidia_driver_version="550.163.01")
    assert "Pin: version 550.163.01-*\n" in pin
    backports = render("nvidia_driver", "nvidia-driver.pref.j2", "Debian13", nvidia_driver_source_backports=True)
    assert "Pin: release n=trixie-backports\n" in backports
    sources = render(
        "nvidia_driver",
        "debian-nonfree.sources.j2",
        "Debian13",
        __nvidia_driver_debian_components=["contrib", "non-free", "non-free-firmware"],
    )
    assert "Suites: trixie trixie-updates\n" in sources
    assert "Suites: trixie-security\n" in sources


def test_ubuntu_packages_carry_the_branch() -> None:
    v = role_vars("nvidia_driver", "Ubuntu", nvidia_driver_version="550.127.05")
    assert v["__nvidia_driver_packages"] == [
        "nvidia-dkms-550-server",
        "nvidia-utils-550-server",
        "libnvidia-compute-550-server",
        "libnvidia-cfg1-550-server",
        "nvidia-compute-utils-550-server",
    ]
    assert v["__nvidia_driver_nvidia_repo_url"].endswith("/repos/ubuntu2204/x86_64/")
    fm = role_vars("nvidia_driver", "Ubuntu", nvidia_driver_version="550.127.05", nvidia_driver_fabric_manager=True)
    assert fm["__nvidia_driver_install_packages"][-2:] == ["nvidia-fabricmanager-550", "libnvidia-nscq-550"]


def test_rhel_uses_the_dkms_module_streams_and_versionlock() -> None:
    v = role_vars("nvidia_driver", "RedHat", nvidia_driver_version="535.261.03")
    assert v["__nvidia_driver_module_stream"] == "nvidia-driver:535-dkms"
    assert (
        role_vars("nvidia_driver", "RedHat", nvidia_driver_kernel_modules="open")["__nvidia_driver_module_stream"]
        == "nvidia-driver:535-open"
    )
    assert v["__nvidia_driver_headers_prefix"] == "kernel-devel-"
    assert "python3-dnf-plugin-versionlock" in v["__nvidia_driver_base_packages"]
    assert v["__nvidia_driver_fabric_manager_packages"] == ["nvidia-fabric-manager", "libnvidia-nscq"]
    assert v["__nvidia_driver_nvidia_repo_key"].endswith("/repos/rhel9/x86_64/D42D0685.pub")
    assert v["__nvidia_driver_nvidia_repo_fingerprint"] == "610C7B14E068A878070DA4E99CD0A493D42D0685"
    # dnf takes the exact version; a branch is the stream's choice.
    assert v["__nvidia_driver_install_version"] == "535.261.03"
    assert role_vars("nvidia_driver", "RedHat", nvidia_driver_branch=535)["__nvidia_driver_install_version"] == ""


def test_aarch64_uses_nvidia_sbsa_repositories() -> None:
    assert role_vars("nvidia_driver", "Debian")["__nvidia_driver_repo_arch"] == "x86_64"
    arm = role_vars("nvidia_driver", "Debian", facts={"architecture": "aarch64"})
    assert arm["__nvidia_driver_repo_arch"] == "sbsa"
    assert arm["__nvidia_driver_nvidia_repo_url"].endswith("/repos/debian12/sbsa/")


def test_ubuntu_24_04_uses_its_own_repository() -> None:
    noble = {"distribution_major_version": "24", "distribution_version": "24.04", "distribution_release": "noble"}
    v = role_vars("nvidia_driver", "Ubuntu", facts=noble, nvidia_driver_version="570.172.08")
    assert v["__nvidia_driver_nvidia_repo_url"] == (
        "https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2404/x86_64/"
    )
    assert v["__nvidia_driver_packages"] == [
        "nvidia-dkms-570-server",
        "nvidia-utils-570-server",
        "libnvidia-compute-570-server",
        "libnvidia-cfg1-570-server",
        "nvidia-compute-utils-570-server",
    ]


def test_rhel_package_list() -> None:
    v = role_vars("nvidia_driver", "RedHat", nvidia_driver_version="535.261.03", nvidia_driver_fabric_manager=True)
    assert v["__nvidia_driver_install_packages"] == [
        "kmod-nvidia-latest-dkms",
        "nvidia-driver",
        "nvidia-driver-cuda",
        "nvidia-driver-cuda-libs",
        "nvidia-driver-NVML",
        "nvidia-kmod-common",
        "nvidia-persistenced",
        "nvidia-fabric-manager",
        "libnvidia-nscq",
    ]
    assert v["__nvidia_driver_initramfs_command"] == ["dracut", "--force", "--kver"]
    release = re.match(v["__nvidia_driver_initramfs_release_regex"], "initramfs-5.14.0-427.13.1.el9_4.x86_64.img")
    assert release is not None and release.group(1) == "5.14.0-427.13.1.el9_4.x86_64"
    assert fnmatch.fnmatch("initramfs-5.14.0-427.13.1.el9_4.x86_64.img", v["__nvidia_driver_initramfs_pattern"])


@pytest.mark.parametrize(("role", "pattern"), [("nvidia_driver", "setup-{}.yml"), ("package_source", "{}.yml")])
def test_every_os_family_has_its_setup_tasks(role: str, pattern: str) -> None:
    """main.yml includes the tasks of the host's os_family: each OS family the tests know needs that file."""
    families = {FACTS[name]["os_family"] for name in FACTS}
    for family in families:
        assert (ROLES / role / "tasks" / pattern.format(family)).is_file(), family


# --- the pin ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("os_name", ["Debian", "Ubuntu", "RedHat"])
@pytest.mark.parametrize("fabric_manager", [False, True])
def test_pin_patterns_cover_every_installed_package(os_name: str, fabric_manager: bool) -> None:
    v = role_vars(
        "nvidia_driver", os_name, nvidia_driver_version="535.261.03", nvidia_driver_fabric_manager=fabric_manager
    )
    patterns = _yaml(ROLES / "nvidia_driver" / "defaults" / "main.yml")["nvidia_driver_pin_patterns"]
    regex = re.compile(v["__nvidia_driver_name_regex"])
    for package in v["__nvidia_driver_install_packages"] + v["__nvidia_driver_companion_packages"]:
        assert any(fnmatch.fnmatchcase(package, p) for p in patterns), package
        assert regex.match(package), package


def test_pin_covers_every_binary_of_debians_driver_sources() -> None:
    regex = re.compile(role_vars("nvidia_driver", "Debian")["__nvidia_driver_name_regex"])
    assert [p for p in DEBIAN_DRIVER_BINARIES if not regex.match(p)] == []


@pytest.mark.parametrize(
    ("version", "branch", "matches", "rejects"),
    [
        (
            "535.261.03",
            535,
            ["535.261.03-1", "535.261.03-0ubuntu0.22.04.1", "535.261.03"],
            ["535.261.031-1", "535.309.01-0+deb12u1", "535x261.03-1"],
        ),
        ("", 535, ["535.261.03-1", "535.309.01-0+deb12u1"], ["550.54.15-1", "5351.0-1", "1.17.8-1"]),
    ],
)  # fmt: skip
def test_hold_takes_packages_at_the_driver_version(
    version: str, branch: int, matches: list[str], rejects: list[str]
) -> None:
    v = role_vars("nvidia_driver", "Debian", nvidia_driver_version=version, nvidia_driver_branch=branch)
    regex = re.compile(v["__nvidia_driver_version_regex"])
    assert all(regex.match(m) for m in matches)
    assert not any(regex.match(r) for r in rejects)
    assert v["__nvidia_driver_pin_version"] == (f"{version}-*" if version else f"{branch}.*")
    assert v["__nvidia_driver_module_version"] == (version or str(branch))


def test_pin_file() -> None:
    text = render("nvidia_driver", "nvidia-driver.pref.j2", nvidia_driver_version="535.261.03")
    assert "Package: *nvidia* libcuda* libnv*\nPin: version 535.261.03-*\nPin-Priority: 1001\n" in text
    branch = render("nvidia_driver", "nvidia-driver.pref.j2")
    assert "Pin: version 535.*\n" in branch
    backports = render("nvidia_driver", "nvidia-driver.pref.j2", nvidia_driver_source_backports=True)
    assert "Pin: release n=bookworm-backports\n" in backports


def _apt(tool: str) -> str:
    path = shutil.which(tool)
    if path is None:
        pytest.skip(f"{tool} is not installed (apt's own parser checks the rendered file)")
    return path


@pytest.mark.tools
def test_apt_accepts_the_pin_file(tmp_path: Path) -> None:
    apt_cache = _apt("apt-cache")
    empty = tmp_path / "parts"
    empty.mkdir()

    def policy(text: str) -> subprocess.CompletedProcess[str]:
        pref = tmp_path / "nvidia.pref"
        pref.write_text(text)
        opts = ["-o", f"Dir::Etc::Preferences={pref}", "-o", f"Dir::Etc::PreferencesParts={empty}"]
        return subprocess.run([apt_cache, *opts, "policy"], capture_output=True, text=True, check=False)

    for overrides in ({"nvidia_driver_version": "535.261.03"}, {}, {"nvidia_driver_source_backports": True}):
        result = policy(render("nvidia_driver", "nvidia-driver.pref.j2", **overrides))
        assert result.returncode == 0 and "E:" not in result.stderr and "W:" not in result.stderr, result.stderr
    broken = policy("Package nvidia-smi\nPin version 1\n")
    assert broken.returncode != 0 and "E:" in broken.stderr, "apt did not read the file"


@pytest.mark.tools
def test_apt_reads_the_unattended_upgrades_blacklist(tmp_path: Path) -> None:
    apt_config = _apt("apt-config")
    conf = tmp_path / "51gpuinfra-nvidia-driver"
    conf.write_text(render("nvidia_driver", "unattended-upgrades-nvidia.conf.j2"))
    result = subprocess.run(
        [apt_config, "-c", str(conf), "dump", "Unattended-Upgrade::Package-Blacklist"],
        capture_output=True,
        text=True,
        check=True,
    )
    patterns = re.findall(r'^Unattended-Upgrade::Package-Blacklist:: "(.*)";$', result.stdout, re.M)
    assert patterns[-3:] == ["^.*nvidia.*$", "^libcuda.*$", "^libnv.*$"]
    # unattended-upgrades matches these as Python regular expressions against package names.
    for package in ["nvidia-kernel-dkms", "libcuda1", "libnvidia-ml1", "firmware-nvidia-gsp", "nvidia-persistenced"]:
        assert any(re.match(p, package) for p in patterns), package
    assert not any(re.match(p, "linux-image-amd64") for p in patterns)
    conf.write_text('Unattended-Upgrade::Package-Blacklist { "unclosed"\n')
    assert subprocess.run([apt_config, "-c", str(conf), "dump"], capture_output=True, check=False).returncode != 0


@pytest.mark.tools
@pytest.mark.parametrize("unattended", [False, True])
def test_apt_reads_the_kernel_updates_file(tmp_path: Path, unattended: bool) -> None:
    """Kernels stay out of unattended-upgrades unless allowed, and it never reboots a GPU node."""
    apt_config = _apt("apt-config")
    conf = tmp_path / "52gpuinfra-kernel-updates"
    text = render("kernel_updates", "unattended-upgrades-kernel.conf.j2", kernel_updates_unattended=unattended)
    conf.write_text(text)
    result = subprocess.run([apt_config, "-c", str(conf), "dump"], capture_output=True, text=True, check=True)
    assert 'Unattended-Upgrade::Automatic-Reboot "false";' in result.stdout.splitlines()
    patterns = re.findall(r'^Unattended-Upgrade::Package-Blacklist:: "(.*)";$', result.stdout, re.M)
    kernels = ["linux-image-amd64", "linux-image-6.1.0-50-amd64", "linux-headers-amd64", "linux-kbuild-6.1",
               "linux-image-generic-hwe-24.04", "linux-modules-6.8.0-45-generic", "linux-headers-6.8.0-45"]  # fmt: skip
    for package in kernels:  # matched as unattended-upgrades matches: Python's re.match
        assert any(re.match(p, package) for p in patterns) != unattended, package
    for package in ["linux-base", "linux-libc-dev", "firmware-linux-free", "libc6"]:
        assert not any(re.match(p, package) for p in patterns), package


DPKG_KERNELS = """linux-image-6.1.0-50-amd64 6.1.176-1 ii
linux-image-6.1.0-50-amd64-unsigned  un
linux-image-amd64 6.1.176-1 ii
linux-image-cloud-amd64  un
linux-image-rt-amd64 6.1.170-1 rc
linux-image-generic-hwe-24.04 6.8.0-45.45~22.04.1 ii
"""


@pytest.mark.parametrize(
    ("madison", "wanted"),
    [
        # The sources offer the kernel metapackage's own version: that one.
        (" linux-headers-amd64 | 6.1.176-1 | http://deb.debian.org/debian bookworm/main amd64 Packages\n"
         " linux-headers-amd64 | 6.12.95-1~bpo12+1 | http://deb.debian.org/debian bookworm-backports/main amd64"
         " Packages\n",
         ["linux-headers-amd64=6.1.176-1"]),
        # Only a newer one (the archive moved on): the name alone, apt's candidate.
        ("linux-headers-amd64 | 6.1.180-1 | http://deb.debian.org/debian bookworm/main amd64 Packages\n",
         ["linux-headers-amd64"]),
        # Ubuntu's HWE kernel beside Debian's; an unknown headers package is never asked for.
        ("          linux-headers-amd64 | 6.1.176-1 | http://deb.debian.org/debian bookworm/main amd64 Packages\n"
         "linux-headers-generic-hwe-24.04 | 6.8.0-45.45~22.04.1 | http://archive.ubuntu.com/ubuntu jammy-updates/main"
         " amd64 Packages\n",
         ["linux-headers-amd64=6.1.176-1", "linux-headers-generic-hwe-24.04=6.8.0-45.45~22.04.1"]),
        ("", []),
    ],
)  # fmt: skip
def test_the_headers_metapackage_follows_each_kernel_metapackage(madison: str, wanted: list[str]) -> None:
    answers = {"__kernel_updates_dpkg": {"stdout": DPKG_KERNELS}, "__kernel_updates_madison": {"stdout": madison}}
    found = role_vars("kernel_updates", "Debian", **answers)
    assert [flavour for flavour, _ in found["__kernel_updates_images"]] == ["amd64", "generic-hwe-24.04"]
    assert found["__kernel_updates_headers_packages"] == wanted


def test_nouveau_blacklist() -> None:
    text = render("nvidia_driver", "blacklist-nouveau.conf.j2")
    assert "blacklist nouveau\n" in text and "options nouveau modeset=0\n" in text


# --- model -> role variables -----------------------------------------------------------------------------------


def _cluster(driver_section: dict[str, Any] | None) -> Any:
    data: dict[str, Any] = {
        "name": "lab",
        "node_groups": {
            "gpu": {
                "hosts": "gpu[01-02]",
                "roles": ["slurm_compute"],
                "gpu": {"model": "H100-SXM5-80GB", "count": 8, "nvswitch": True},
            },
            "ctl": {"hosts": "ctl01", "roles": ["slurm_controller"]},
        },
    }  # fmt: skip
    if driver_section is not None:
        data["driver"] = driver_section
    return resolve(Cluster.model_validate(data))


def _spec_options(role: str) -> dict[str, Any]:
    specs = _yaml(ROLES / role / "meta" / "argument_specs.yml")["argument_specs"]
    return specs["main"]["options"]  # type: ignore[no-any-return]


def test_group_vars_from_an_exact_pin() -> None:
    rc = _cluster(
        {
            "version": "535.261.03",
            "source": {"type": "mirror", "url": "https://mirror.example/cuda/", "keyring": "keys/cuda.asc"},
        }
    )
    out = driver.group_vars(rc)
    assert out["nvidia_driver_version"] == "535.261.03"
    assert out["nvidia_driver_branch"] == 535
    assert out["nvidia_driver_source_type"] == "mirror"
    assert out["nvidia_driver_source_url"] == "https://mirror.example/cuda/"
    assert out["nvidia_driver_source_keyring"] == "keys/cuda.asc"
    assert out["nvidia_driver_hold"] is True
    assert out["nvidia_driver_reboot"] == "when_needed"
    assert out["gpu_kernel_gate_driver_version"] == "535.261.03"
    assert "nvidia_driver_fabric_manager" not in out, "a per-host setting (see host_vars)"
    nvswitch = [h for h in rc.hosts.values() if h.nvswitch]
    assert nvswitch and all(driver.host_vars(h)["nvidia_driver_fabric_manager"] for h in nvswitch)


def test_group_vars_from_a_branch_and_local_packages() -> None:
    section = {
        "branch": 550,
        "kernel_modules": "open",
        "source": {"type": "local", "path": "/srv/debs"},
        "reboot": "never",
        "hold": False,
    }
    out = driver.group_vars(_cluster(section))
    assert (out["nvidia_driver_version"], out["nvidia_driver_branch"]) == ("", 550)
    assert out["nvidia_driver_kernel_modules"] == out["gpu_kernel_gate_kernel_modules"] == "open"
    assert out["nvidia_driver_source_path"] == "/srv/debs"
    assert (out["nvidia_driver_reboot"], out["nvidia_driver_hold"]) == ("never", False)


def test_no_driver_section_renders_only_the_kernel_updates() -> None:
    assert driver.group_vars(_cluster(None)) == {"kernel_updates_unattended": False}


def test_group_vars_are_declared_options_of_the_right_type() -> None:
    options = {**_spec_options("nvidia_driver"), **_spec_options("gpu_kernel_gate"), **_spec_options("kernel_updates")}
    out = driver.group_vars(_cluster({"version": "535.261.03", "source": {"type": "distribution", "backports": True}}))
    kinds = {"str": str, "int": int, "bool": bool, "list": list}
    for name, value in out.items():
        assert name in options, name
        if name in ("nvidia_driver_fabric_manager", "nvidia_driver_service_manage"):
            continue  # per-host templates of gpuinfra_nvswitch and gpuinfra_gpu_emulated (tested above and below)
        assert isinstance(value, kinds[options[name]["type"]]), name
        if "choices" in options[name]:
            assert value in options[name]["choices"], name


def test_artifacts_render_for_the_first_gpu_host() -> None:
    rc = _cluster({"version": "535.261.03"})
    names = {a.template for a in driver.ARTIFACTS}
    assert names == {
        "nvidia-driver.pref.j2",
        "unattended-upgrades-nvidia.conf.j2",
        "blacklist-nouveau.conf.j2",
        "unattended-upgrades-kernel.conf.j2",
        "gpuinfra-kernel-updates.service.j2",
        "gpuinfra-kernel-updates.timer.j2",
    }
    planned = {r.artifact.template: r.content for r in plan.render(rc, list(driver.ARTIFACTS))}
    for artifact in driver.ARTIFACTS:
        assert artifact.host_role == "gpu_nodes"
        assert (ROLES / artifact.role / "templates" / artifact.template).exists()
        assert "Managed by gpuinfra" in planned[artifact.template]


# --- emulated GPUs ---------------------------------------------------------------------------------------------


def _play_vars(rc: Any, host: str, names: list[str], role_defaults: tuple[str, ...] = ()) -> dict[str, Any]:
    """Variables as a play sees them on one host: the rendered inventory read by Ansible's own inventory code,
    over the defaults of the given roles."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "inventory.yml"
        path.write_text(json.dumps(inventory_yaml(rc)))
        loader = DataLoader()
        inventory = InventoryManager(loader=loader, sources=[str(path)])
        variables = VariableManager(loader=loader, inventory=inventory).get_vars(host=inventory.get_host(host))
        defaults: dict[str, Any] = {}
        for role in role_defaults:
            defaults.update(_trusted(_yaml(ROLES / role / "defaults" / "main.yml")))
        variables = {**defaults, **variables}
        templar = Templar(loader=loader, variables=variables)
        return {name: templar.template(variables[name]) for name in names}


@pytest.mark.parametrize("emulated", [False, True])
def test_emulated_gpus_get_the_driver_built_but_not_loaded(emulated: bool) -> None:
    gpu = {"model": "L4", "count": 2, "emulated": emulated}
    data: dict[str, Any] = {
        "name": "lab",
        "node_groups": {
            "gpu": {"hosts": "gpu01", "roles": ["slurm_compute"], "gpu": gpu},
            "ctl": {"hosts": "ctl01", "roles": ["slurm_controller"]},
        },
        "driver": {"version": "535.261.03", "reboot": "never"},
    }
    rc = resolve(Cluster.model_validate(data))
    names = ["nvidia_driver_service_manage", "gpu_health_gpu_access", "nvidia_driver_version"]
    names.append("gpu_kernel_gate_boots_own_kernel")
    seen = _play_vars(rc, "gpu01", names, role_defaults=("gpu_health",))
    assert seen["nvidia_driver_service_manage"] is (not emulated)
    assert seen["gpu_kernel_gate_boots_own_kernel"] is (not emulated), "a container runs its machine's kernel"
    assert seen["gpu_health_gpu_access"] is (not emulated)
    assert seen["nvidia_driver_version"] == "535.261.03", "the driver is still installed and built"


def _index_targets(tmp_path: Path, name: str, text: str) -> subprocess.CompletedProcess[str]:
    """apt's own reading of one deb822 .sources file: the index targets it would fetch (nothing is fetched)."""
    parts = tmp_path / name
    parts.mkdir()
    (parts / f"{name}.sources").write_text(text)
    opts = ["-o", "Dir::Etc::SourceList=/dev/null", "-o", f"Dir::Etc::SourceParts={parts}"]
    return subprocess.run(
        [_apt("apt-get"), *opts, "indextargets", "--no-release-info", "--format", "$(URI)"],
        capture_output=True,
        text=True,
        check=False,
    )


# product -> NVIDIA's repository, as its role hands it to the package_source role
TOOLKIT_REPO = "https://nvidia.github.io/libnvidia-container/stable/deb/$(ARCH)"
REPOSITORIES = {
    "nvidia-driver": role_vars("nvidia_driver", "Debian")["__nvidia_driver_nvidia_repo_url"],
    "nvidia-container-toolkit": TOOLKIT_REPO,
}


@pytest.mark.tools
@pytest.mark.parametrize("product", list(REPOSITORIES))
def test_apt_reads_the_repository_of_every_source(tmp_path: Path, product: str) -> None:
    """NVIDIA's repository and a mirror (with either keyring form) as apt reads them. NVIDIA's repositories cannot
    be reached from the test machines, so the download itself is not exercised; test_package_sources.py has apt
    verify a signed mirror through the same files."""
    repo = REPOSITORIES[product]
    vendor = {"package_source_type": "vendor", "package_source_vendor_url": repo}
    mirror = {"package_source_type": "mirror", "package_source_url": "https://mirror.example.internal/nvidia/"}
    # The role's variables, as role_vars() and render() take them (**overrides: Any).
    cases: dict[str, tuple[dict[str, Any], str]] = {
        "nvidia": (vendor, repo.replace("$(ARCH)", "amd64")),
        "mirror-asc": ({**mirror, "package_source_keyring": "files/mirror.asc"}, mirror["package_source_url"]),
        "mirror-gpg": ({**mirror, "package_source_keyring": "files/mirror.gpg"}, mirror["package_source_url"]),
    }
    for name, (settings, uri) in cases.items():
        overrides = {"package_source_name": product, **settings}
        internal = role_vars("package_source", "Debian", **overrides)  # the keyring's path, whether it is signed
        text = render("package_source", "package-source.sources.j2", **{**internal, **overrides})
        assert f"/etc/apt/keyrings/gpuinfra-{product}." in text, text
        result = _index_targets(tmp_path, name, text)
        assert result.returncode == 0 and "E:" not in result.stderr and "W:" not in result.stderr, result.stderr
        assert result.stdout.split() == [uri.rstrip("/") + "/Packages"], (name, result.stdout)
    broken = _index_targets(tmp_path, "broken", "Types: deb\nSuites: /\n")  # no URIs
    assert broken.returncode != 0 and "E:" in broken.stderr, "apt did not read the file"
