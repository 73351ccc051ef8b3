"""gres_autodetect nvml is refused on a Slurm without its NVML plugin (Debian 12's), and accepted with it.

The slurm_compute role's check (its tasks/nvml.yml, with the role's variables) runs through ansible-runner on this
machine against a plugin folder of the test's own.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from gpuinfra.run import Outcome, RunOptions, run_playbook

pytestmark = pytest.mark.tools  # runs Ansible or a system tool (tests/unit/tool_guard.py)

ROOT = Path(__file__).resolve().parents[2]


def check(tmp_path: Path, plugin_dir: Path) -> tuple[Outcome, str]:
    playbook = tmp_path / "nvml.yml"
    playbook.write_text(
        "- name: Check Slurm's NVML plugin\n"
        "  hosts: all\n"
        "  gather_facts: false\n"
        "  tasks:\n"
        "    - name: Run the role's check\n"
        "      ansible.builtin.include_role:\n"
        f"        name: {ROOT / 'roles' / 'slurm_compute'}\n"
        "        tasks_from: nvml.yml\n"
    )
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    result = run_playbook(
        {"all": {"hosts": {"node": local}}},
        RunOptions(playbook=playbook, extra_vars={"slurm_compute_plugin_dir": str(plugin_dir)}),
    )
    return result.outcome, " ".join(failure.message for failure in result.failures)


def test_a_slurm_without_the_nvml_plugin_is_refused(tmp_path: Path) -> None:
    plugins = tmp_path / "slurm-wlm"
    plugins.mkdir()
    (plugins / "gpu_generic.so").touch()  # what Debian 12's slurm-wlm-basic-plugins ships
    outcome, message = check(tmp_path, plugins)
    assert outcome is Outcome.FAILED
    assert f"{plugins}/gpu_nvml.so is missing" in message
    assert "Set slurm.gres_autodetect: off" in message


def test_a_slurm_with_the_nvml_plugin_passes(tmp_path: Path) -> None:
    plugins = tmp_path / "slurm"
    plugins.mkdir()
    (plugins / "gpu_nvml.so").touch()
    assert check(tmp_path, plugins) == (Outcome.OK, "")
