"""The nvidia_dkms_status module: `dkms status` of DKMS 2.x and 3.x, kernel discovery and the next-boot kernel."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from file_module import load, module_util

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(__file__).parent / "data"


# The parsing lives in the collection's module_utils; the module imports it under its collection name.
dkms = module_util("dkms")
mod = load("plugins/modules/nvidia_dkms_status.py", "nvidia_dkms_status")


def parse(text: str) -> list[dict[str, str]]:
    return [entry.__dict__ for entry in dkms.parse_dkms_status(text)]


def _dkms(name: str) -> str:
    return (DATA / "dkms" / name).read_text()


@pytest.mark.parametrize("name", ["debian12-dkms3-one-kernel.txt", "debian12-dkms2-one-kernel.txt"])
def test_both_formats_parse_to_the_same_entry(name: str) -> None:
    assert parse(_dkms(name)) == [
        {
            "module": "nvidia-current",
            "version": "535.261.03",
            "kernel": "6.1.0-50-amd64",
            "arch": "x86_64",
            "state": "installed",
            "note": "",
        }
    ]


@pytest.mark.parametrize("name", sorted(p.name for p in (DATA / "dkms").glob("*.txt")))
def test_every_captured_line_parses(name: str) -> None:
    text = _dkms(name)
    status_lines = [line for line in text.splitlines() if line.strip() and not line.startswith(("Error", "Warning"))]
    assert len(parse(text)) == len(status_lines)


def test_three_kernels_with_a_failed_build() -> None:
    """Captured (stdout of `dkms status`) in the kernel_gate scenario after the rt kernel's DKMS build failed, with
    the archive's 6.1, the 6.12 and the 6.12 rt kernel installed: no line for the rt kernel at all."""
    path = DATA / "dkms" / "debian12-dkms3-three-kernels-rt-failed.txt"
    entries = dkms.parse_dkms_status(path.read_text())
    kernels = {e.kernel: e.state for e in entries}
    assert all(state == "installed" for state in kernels.values())
    assert not any(k.endswith("-rt-amd64") for k in kernels)
    assert any(k.startswith("6.12.") for k in kernels) and any(k.startswith("6.1.0-") for k in kernels)


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        # DKMS 3 with the notes it appends in parentheses.
        (
            "nvidia/535.183.01, 5.15.0-113-generic, x86_64: installed"
            " (WARNING! Diff between built and installed module!)",
            (
                "nvidia",
                "535.183.01",
                "5.15.0-113-generic",
                "installed",
                "WARNING! Diff between built and installed module!",
            ),
        ),
        # Added to the tree, built for no kernel (both formats).
        ("nvidia-current/535.261.03: added", ("nvidia-current", "535.261.03", "", "added", "")),
        ("nvidia, 535.54.03: added", ("nvidia", "535.54.03", "", "added", "")),
        (
            "nvidia-current/535.261.03, 6.12.95+deb12-amd64, x86_64: built",
            ("nvidia-current", "535.261.03", "6.12.95+deb12-amd64", "built", ""),
        ),
    ],
)
def test_line_shapes(line: str, expected: tuple[str, str, str, str, str]) -> None:
    (entry,) = parse(line)
    assert (entry["module"], entry["version"], entry["kernel"], entry["state"], entry["note"]) == expected


def test_noise_is_skipped() -> None:
    assert parse("Error! Could not locate dkms.conf file.\nFile: /var/lib/dkms/x/1/source/dkms.conf\n") == []


PAIRS = [
    ("6.1.0-50-amd64", "6.12.95+deb12-amd64"),
    ("6.12.95+deb12-amd64", "6.12.95+deb12-rt-amd64"),
    ("6.1.0-9-amd64", "6.1.0-10-amd64"),
    ("5.15.0-113-generic", "5.15.0-97-generic"),
    ("6.8.0-45-generic", "6.8.0-45-lowlatency"),
    ("5.14.0-427.13.1.el9_4.x86_64", "5.14.0-503.11.1.el9_5.x86_64"),
    ("6.12.90+deb12-amd64", "6.12.90+deb12.1-amd64"),
    ("1.0~rc1", "1.0"),
]


@pytest.mark.tools
@pytest.mark.parametrize(("a", "b"), PAIRS)
def test_kernel_order_matches_dpkg(a: str, b: str) -> None:
    dpkg = shutil.which("dpkg")
    if dpkg is None:
        pytest.skip("dpkg is not installed: the reference ordering is dpkg --compare-versions")
    lt = subprocess.run([dpkg, "--compare-versions", a, "lt", b], check=False).returncode == 0
    gt = subprocess.run([dpkg, "--compare-versions", a, "gt", b], check=False).returncode == 0
    ours = dkms.compare_versions(a, b)
    assert (ours < 0) == lt and (ours > 0) == gt


def _host(tmp_path: Path, images: list[str], headers: list[str]) -> tuple[Path, Path]:
    boot, modules = tmp_path / "boot", tmp_path / "modules"
    boot.mkdir()
    modules.mkdir()
    for release in images:
        (boot / f"vmlinuz-{release}").write_bytes(b"")
        (modules / release).mkdir(exist_ok=True)
    for release in headers:
        (modules / release / "build").mkdir(parents=True)
    return boot, modules


def test_installed_kernels_need_an_image(tmp_path: Path) -> None:
    boot, modules = _host(tmp_path, ["6.12.95+deb12-rt-amd64", "6.1.0-50-amd64", "6.12.95+deb12-amd64"], [])
    (modules / "6.1.0-99-amd64" / "build").mkdir(parents=True)  # headers without an image: not a kernel
    (boot / "vmlinuz-6.1.0-49-amd64.old").write_bytes(b"")
    (boot / "vmlinuz-6.12.96+deb12-amd64.dpkg-new").write_bytes(b"")  # dpkg unpacking a kernel package
    assert dkms.installed_kernels(str(boot), str(modules)) == [
        "6.1.0-50-amd64",
        "6.12.95+deb12-amd64",
        "6.12.95+deb12-rt-amd64",
    ]


def test_next_boot_is_the_newest_without_a_bootloader(tmp_path: Path) -> None:
    boot, modules = _host(tmp_path, ["6.1.0-50-amd64", "6.12.95+deb12-amd64"], [])
    kernels = dkms.installed_kernels(str(boot), str(modules))
    assert mod.next_boot_kernel(None, str(boot), kernels) == ("6.12.95+deb12-amd64", "newest")
    assert mod.next_boot_kernel(None, str(tmp_path / "none"), []) == ("", "none")


@pytest.mark.parametrize(
    ("cfg", "grubenv", "expected"),
    [
        ("debian12-default-0.cfg", "", "6.12.95+deb12-rt-amd64"),
        (
            "debian12-saved-default.cfg",
            "saved_entry=gnulinux-advanced-0f1e2d3c-aaaa-bbbb-cccc-000000000001>"
            "gnulinux-6.1.0-50-amd64-advanced-0f1e2d3c-aaaa-bbbb-cccc-000000000001\n",
            "6.1.0-50-amd64",
        ),
        ("debian12-saved-default.cfg", "saved_entry=1>2\n", "6.12.95+deb12-amd64"),
        (
            "debian12-saved-default.cfg",
            "saved_entry=Advanced options for Debian GNU/Linux>Debian GNU/Linux, with Linux 6.12.95+deb12-amd64\n",
            "6.12.95+deb12-amd64",
        ),
        ("debian12-saved-default.cfg", "saved_entry=0\nnext_entry=1>4\n", "6.1.0-50-amd64"),
        # A saved entry that no longer exists: GRUB falls back, and so does the module (to the newest kernel).
        ("debian12-saved-default.cfg", "saved_entry=gnulinux-5.10.0-30-amd64-advanced-x\n", None),
    ],
)
def test_next_boot_from_grub(tmp_path: Path, cfg: str, grubenv: str, expected: str | None) -> None:
    boot, modules = _host(tmp_path, ["6.1.0-50-amd64", "6.12.95+deb12-amd64", "6.12.95+deb12-rt-amd64"], [])
    (boot / "grub").mkdir()
    (boot / "grub" / "grub.cfg").write_text((DATA / "grub" / cfg).read_text())
    if grubenv:
        (boot / "grub" / "grubenv").write_text("# GRUB Environment Block\n" + grubenv)
    kernels = dkms.installed_kernels(str(boot), str(modules))
    release, source = mod.next_boot_kernel(None, str(boot), kernels)
    if expected is None:
        assert (release, source) == ("6.12.95+deb12-rt-amd64", "newest")
    else:
        assert (release, source) == (expected, "grub")


def test_kernel_report_names_state_headers_and_log(tmp_path: Path) -> None:
    boot, modules = _host(
        tmp_path, ["6.1.0-50-amd64", "6.12.95+deb12-rt-amd64"], ["6.1.0-50-amd64", "6.12.95+deb12-rt-amd64"]
    )
    tree = tmp_path / "dkms"
    (tree / "nvidia-current" / "535.261.03" / "build").mkdir(parents=True)
    (tree / "nvidia-current" / "535.261.03" / "build" / "make.log").write_text("error\n")
    entries = dkms.parse_dkms_status(
        _dkms("debian12-dkms3-one-kernel.txt")
        + "nvidia-current/535.216.03, 6.12.95+deb12-rt-amd64, x86_64: installed\n"
    )
    installed = dkms.installed_kernels(str(boot), str(modules))
    report = mod.kernel_report(
        installed, installed, "6.12.95+deb12-rt-amd64", entries, "nvidia-current", "535.261.03", str(modules), str(tree)
    )
    old, rt = report
    assert old["ready"] and old["state"] == "installed" and not old["next_boot"]
    assert not rt["ready"] and rt["state"] == "missing" and rt["next_boot"] and rt["headers"]
    assert rt["other_versions"] == {"535.216.03": "installed"}
    assert rt["build_log"].endswith("nvidia-current/535.261.03/build/make.log")
    lines = mod.summary_lines(report, "nvidia-current", "535.261.03")
    assert lines[1].startswith(
        "6.12.95+deb12-rt-amd64: nvidia-current/535.261.03 missing (boots next; 535.216.03 installed"
    )


def test_branch_matches_any_version_of_it() -> None:
    assert dkms.version_matches("535.261.03", "535")
    assert not dkms.version_matches("550.54.15", "535")
    assert dkms.version_matches("550.54", "550.54")
    assert not dkms.version_matches("535.261.03", "535.216.03")
