"""The job-mapping prolog and epilog, rendered from the role's templates and run by the real shell.

The environment is the one slurmd 22.05 gives a prolog (PrologFlags=Alloc): SLURM_JOB_ID, and the job's GPU
indices on the node in SLURM_JOB_GPUS and CUDA_VISIBLE_DEVICES. The Molecule scenario checks the same scripts
under a real slurmd.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template

ROOT = Path(__file__).resolve().parents[2]
TEMPLATES = ROOT / "roles" / "slurm_compute" / "templates"


def script(tmp_path: Path, name: str, mapping_dir: str, health_check: str = "") -> Path:
    """The rendered script; `health_check` names the program the prolog runs first (on_job_start), "" none. Its
    hooks are in tmp_path/hooks."""
    source = (TEMPLATES / f"{name}.sh.j2").read_text()
    variables = {
        "slurm_compute_job_mapping_dir": mapping_dir,
        "slurm_compute_health_check_program": health_check,
        "slurm_compute_health_check_on_job_start": bool(health_check),
        "slurm_compute_prolog_hooks": str(tmp_path / "hooks"),
        "slurm_compute_checks_partition": "gpuinfra",
        "ansible_managed": "test",
    }
    text = Templar(loader=DataLoader(), variables=variables).template(trust_as_template(source))
    path = tmp_path / f"{name}.sh"
    path.write_text(str(text))
    path.chmod(0o755)
    return path


def run(path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    # No PATH beyond the basics, as slurmd gives none to prologs.
    base = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
    return subprocess.run([str(path)], env={**base, **env}, capture_output=True, text=True, check=False)


@pytest.fixture
def mapping(tmp_path: Path) -> Path:
    return tmp_path / "job-mapping"


def test_prolog_writes_one_file_per_gpu_and_epilog_removes_them(tmp_path: Path, mapping: Path) -> None:
    prolog, epilog = script(tmp_path, "prolog", str(mapping)), script(tmp_path, "epilog", str(mapping))
    assert run(prolog, SLURM_JOB_ID="42", SLURM_JOB_GPUS="1,3").returncode == 0
    assert sorted(os.listdir(mapping)) == ["1", "3"]
    assert (mapping / "1").read_text() == "42\n"
    assert (mapping / "3").read_text() == "42\n"
    assert run(epilog, SLURM_JOB_ID="42", SLURM_JOB_GPUS="1,3").returncode == 0
    assert os.listdir(mapping) == []


def test_a_folder_with_a_quote_and_a_space_stays_one_path(tmp_path: Path) -> None:
    """The folder is quoted for the shell: a quote or space in it neither breaks the script nor splits the path."""
    odd = tmp_path / "job map's $(touch pwned)"
    prolog, epilog = script(tmp_path, "prolog", str(odd)), script(tmp_path, "epilog", str(odd))
    assert run(prolog, SLURM_JOB_ID="42", SLURM_JOB_GPUS="0").returncode == 0
    assert (odd / "0").read_text() == "42\n"
    assert run(epilog, SLURM_JOB_ID="42", SLURM_JOB_GPUS="0").returncode == 0
    assert os.listdir(odd) == []
    assert not (tmp_path / "pwned").exists() and not Path("pwned").exists()


def test_prolog_falls_back_to_cuda_visible_devices(tmp_path: Path, mapping: Path) -> None:
    prolog = script(tmp_path, "prolog", str(mapping))
    assert run(prolog, SLURM_JOB_ID="7", CUDA_VISIBLE_DEVICES="0").returncode == 0
    assert (mapping / "0").read_text() == "7\n"


def test_epilog_leaves_another_jobs_file(tmp_path: Path, mapping: Path) -> None:
    prolog, epilog = script(tmp_path, "prolog", str(mapping)), script(tmp_path, "epilog", str(mapping))
    run(prolog, SLURM_JOB_ID="8", SLURM_JOB_GPUS="0")
    assert run(epilog, SLURM_JOB_ID="5", SLURM_JOB_GPUS="0").returncode == 0
    assert (mapping / "0").read_text() == "8\n"


def test_job_without_gpus_writes_nothing(tmp_path: Path, mapping: Path) -> None:
    prolog = script(tmp_path, "prolog", str(mapping))
    assert run(prolog, SLURM_JOB_ID="9").returncode == 0
    assert not mapping.exists()


def test_mapping_off_writes_nothing(tmp_path: Path, mapping: Path) -> None:
    prolog = script(tmp_path, "prolog", "")
    assert run(prolog, SLURM_JOB_ID="9", SLURM_JOB_GPUS="0").returncode == 0
    assert list(tmp_path.iterdir()) == [tmp_path / "prolog.sh"]


def test_failures_never_fail_the_prolog(tmp_path: Path) -> None:
    """A failing prolog drains the node; an unwritable folder or a strange index must not."""
    blocked = tmp_path / "file"
    blocked.write_text("")
    prolog = script(tmp_path, "prolog", str(blocked / "job-mapping"))
    assert run(prolog, SLURM_JOB_ID="1", SLURM_JOB_GPUS="0,x").returncode == 0
    prolog = script(tmp_path, "prolog", str(tmp_path / "ok"))
    assert run(prolog, SLURM_JOB_ID="1", SLURM_JOB_GPUS="0,x").returncode == 0
    assert os.listdir(tmp_path / "ok") == ["0"]


@pytest.mark.parametrize(("verdict", "prolog_rc", "mapped"), [(0, 0, True), (1, 1, False), (2, 0, True)])
def test_the_health_check_before_the_job(
    tmp_path: Path, mapping: Path, verdict: int, prolog_rc: int, mapped: bool
) -> None:
    """health.check.on_job_start: an unhealthy node (exit 1) fails the prolog, so Slurm requeues the job and drains
    the node; a check that cannot run (exit 2) lets the job start."""
    check = tmp_path / "gpuinfra-health"
    check.write_text(f"#!/bin/sh\nexit {verdict}\n")
    check.chmod(0o755)
    prolog = script(tmp_path, "prolog", str(mapping), health_check=str(check))
    assert run(prolog, SLURM_JOB_ID="3", SLURM_JOB_GPUS="1", SLURM_JOB_PARTITION="vision").returncode == prolog_rc
    assert (mapping / "1").exists() is mapped


def test_gpuinfras_own_check_jobs_start_on_a_node_whose_last_checks_failed(tmp_path: Path, mapping: Path) -> None:
    """The admission gate's and the scheduled checks' jobs (gpuinfra's partition) judge the node themselves: the
    health check, which counts the last failed active checks, must not keep a repaired node from its next ones."""
    check = tmp_path / "gpuinfra-health"
    check.write_text(f"#!/bin/sh\necho ran > {tmp_path / 'ran'}\nexit 1\n")
    check.chmod(0o755)
    prolog = script(tmp_path, "prolog", str(mapping), health_check=str(check))
    assert run(prolog, SLURM_JOB_ID="4", SLURM_JOB_GPUS="0", SLURM_JOB_PARTITION="gpuinfra").returncode == 0
    assert not (tmp_path / "ran").exists() and (mapping / "0").read_text() == "4\n"


def test_the_prolog_runs_each_executable_hook_with_the_jobs_environment(tmp_path: Path, mapping: Path) -> None:
    """Other roles prepare the node for the job through hooks (each job user's enroot folders): each executable
    `*.sh` runs, in name order, with the job's environment; one that fails is logged and the job goes on."""
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    seen = tmp_path / "seen"
    hook_bodies = {
        "20-second.sh": "exit 3",
        "10-first.sh": f'echo "$SLURM_JOB_UID" >> {seen}',
        "30-not-executable.sh": f"echo no >> {seen}",
        "40-last.sh": f"echo last >> {seen}",
    }
    for name, body in hook_bodies.items():
        (hooks / name).write_text(f"#!/bin/sh\n{body}\n")
        (hooks / name).chmod(0o644 if "not-executable" in name else 0o755)
    prolog = script(tmp_path, "prolog", str(mapping))
    assert run(prolog, SLURM_JOB_ID="42", SLURM_JOB_UID="1001", SLURM_JOB_GPUS="0").returncode == 0
    assert seen.read_text() == "1001\nlast\n"
    assert (mapping / "0").read_text() == "42\n"
