"""The programs the mig role installs on a host.

- gpuinfra-mig-slurm-gres, the Slurm GRES fragment generator, on nvidia-smi output of an A100 node with MIG
  (tests/unit/data/nvidia-smi, written after NVIDIA's format, see its README) and that node's capability minors.
- gpuinfra-mig-apply, the wrapper the boot service and Ansible run. The real nvidia-mig-parted needs a GPU, and
  cannot be downloaded here; to exercise the wrapper's own logic (stop the running GPU clients, apply, start them
  again, also after a failed apply) `nvidia-mig-parted` and `systemctl` are replaced by scripts that record their
  calls. They test the wrapper, not mig-parted: the Molecule scenario and a real GPU node cover the rest.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
FILES = ROOT / "roles" / "mig" / "files"
FIXTURES = ROOT / "tests" / "unit" / "data" / "nvidia-smi"
GOLDEN = ROOT / "tests" / "unit" / "golden" / "mig" / "gres"


def _generator() -> ModuleType:
    path = str(FILES / "gpuinfra_mig_slurm_gres.py")
    loader = importlib.machinery.SourceFileLoader("gpuinfra_mig_slurm_gres", path)
    spec = importlib.util.spec_from_loader(loader.name, loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[loader.name] = module  # dataclasses look their module up
    loader.exec_module(module)
    return module


gres = _generator()


def _args(**override: str) -> list[str]:
    args = {
        "--query-xml": str(FIXTURES / "a100-sxm4-4x-mig.xml"),
        "--list": str(GOLDEN / "nvidia-smi-L.txt"),
        "--mig-minors": str(GOLDEN / "mig-minors"),
    }
    args.update(override)
    return [f"{key}={value}" for key, value in args.items()]


def test_fragment_lists_every_mig_device_with_its_device_files(capsys: pytest.CaptureFixture[str]) -> None:
    assert gres.main(_args()) == 0
    assert capsys.readouterr().out == (GOLDEN / "gres-mig.conf").read_text()


def test_fragment_is_rewritten_only_when_it_changes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "slurm" / "gres-mig.conf"
    assert gres.main([*_args(), f"--output={out}"]) == 0
    assert gres.main([*_args(), f"--output={out}"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"gpuinfra-mig-slurm-gres: {out} {w}" for w in ("changed", "unchanged")
    ]
    assert out.read_text() == (GOLDEN / "gres-mig.conf").read_text()
    assert out.stat().st_mode & 0o777 == 0o644


def test_minors_follow_the_drivers_numbering() -> None:
    """gi N of GPU g has minor 3 + 9 * (15 g + N), its compute instance c the next 1 + c, as the driver numbers them."""
    minors = gres.parse_minors((GOLDEN / "mig-minors").read_text())
    for name, minor in minors.items():
        parts = name.split("/")
        if len(parts) < 3:
            continue
        gpu, gi = int(parts[0][3:]), int(parts[1][2:])
        base = 3 + 9 * (15 * gpu + gi)
        assert minor == (base if len(parts) == 3 else base + 1 + int(parts[2][2:])), name


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"--mig-minors": "/nonexistent"}, "cannot read /nonexistent"),
        ({"--list": str(FIXTURES / "error-no-devices.txt")}, "lists no profile for GPU 0 MIG device 0"),
        ({"--query-xml": str(FIXTURES / "error-no-driver.txt")}, "nvidia-smi -q -x is not XML"),
    ],
)
def test_broken_input_is_named(change: dict[str, str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert gres.main(_args(**change)) == 1
    assert message in capsys.readouterr().err


def test_missing_minor_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    minors = tmp_path / "mig-minors"
    minors.write_text(
        "\n".join(line for line in (GOLDEN / "mig-minors").read_text().splitlines() if "gpu1/gi13/" not in line)
    )
    assert gres.main(_args(**{"--mig-minors": str(minors)})) == 1
    assert "has no entry gpu1/gi13/access" in capsys.readouterr().err


# --- the apply wrapper -------------------------------------------------------------------------------------------

RECORDER = """#!/bin/bash
echo "$(basename "$0") $*" >> "$CALLS"
"""


def _wrapper(
    tmp_path: Path,
    *,
    matches: bool,
    apply_fails: bool = False,
    running: str = "",
    access: str = "true",
    boot: bool = False,
) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls"
    parted = bin_dir / "nvidia-mig-parted"
    parted.write_text(
        RECORDER
        + f'[[ "$1" == assert ]] && exit {0 if matches else 1}\n'
        + f'[[ "$1" == apply ]] && exit {1 if apply_fails else 0}\nexit 0\n'
    )
    systemctl = bin_dir / "systemctl"
    systemctl.write_text(RECORDER + f'if [[ "$1" == is-active ]]; then [[ " {running} " == *" $3 "* ]]; exit; fi\n')
    for tool in (parted, systemctl):
        tool.chmod(0o755)
    env_file = tmp_path / "mig.env"
    env_file.write_text(
        f"MIG_PARTED={parted}\nMIG_CONFIG_FILE=/etc/gpuinfra/mig/config.yaml\nMIG_CONFIG=a100\n"
        f"MIG_GPU_ACCESS={access}\nMIG_GPU_CLIENTS='nvidia-persistenced.service dcgm-exporter.service slurmd.service'\n"
        "MIG_SLURM_GRES_CONF=''\n"
    )
    argv = [str(FILES / "gpuinfra-mig-apply"), *(["--boot"] if boot else []), str(env_file)]
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "CALLS": str(calls)}
    result = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
    return result, calls.read_text().splitlines() if calls.exists() else []


def test_matching_gpus_are_left_alone(tmp_path: Path) -> None:
    result, calls = _wrapper(tmp_path, matches=True, running="slurmd.service")
    assert result.returncode == 0
    assert result.stdout.splitlines()[-1] == "gpuinfra-mig: unchanged"
    assert calls == ["nvidia-mig-parted assert -f /etc/gpuinfra/mig/config.yaml -c a100"]


def test_a_change_stops_running_clients_and_starts_them_again(tmp_path: Path) -> None:
    result, calls = _wrapper(tmp_path, matches=False, running="nvidia-persistenced.service slurmd.service")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "gpuinfra-mig: changed"
    assert [c for c in calls if not c.startswith("systemctl is-active")] == [
        "nvidia-mig-parted assert -f /etc/gpuinfra/mig/config.yaml -c a100",
        "systemctl stop nvidia-persistenced.service",
        "systemctl stop slurmd.service",
        "nvidia-mig-parted apply -f /etc/gpuinfra/mig/config.yaml -c a100",
        "systemctl start slurmd.service",
        "systemctl start nvidia-persistenced.service",
    ]


def test_clients_are_started_again_when_apply_fails(tmp_path: Path) -> None:
    result, calls = _wrapper(tmp_path, matches=False, apply_fails=True, running="slurmd.service")
    assert result.returncode != 0
    assert calls[-2:] == [
        "nvidia-mig-parted apply -f /etc/gpuinfra/mig/config.yaml -c a100",
        "systemctl start slurmd.service",
    ]


def test_at_boot_nothing_is_stopped(tmp_path: Path) -> None:
    result, calls = _wrapper(tmp_path, matches=False, running="slurmd.service", boot=True)
    assert result.returncode == 0
    assert not [c for c in calls if c.startswith("systemctl")]


def test_without_gpu_access_no_gpu_is_touched(tmp_path: Path) -> None:
    result, calls = _wrapper(tmp_path, matches=False, access="false", boot=True)
    assert result.returncode == 0
    assert result.stdout.strip() == (
        "gpuinfra-mig: skipped: GPU access is off on this host (mig_gpu_access: false), so a100 is not applied"
    )
    assert calls == []
