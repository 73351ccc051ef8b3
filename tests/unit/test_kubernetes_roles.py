"""The gpu_operator, k8s_tenants and kueue roles run by Ansible as far as they go without an API server.

With `*_apply: false` the roles write the Helm values and manifests and stop before any call to the cluster. They
run here on localhost, first in check mode (nothing may be written), then for real, then again (nothing may change);
the files they write must be the ones `gpuinfra plan` shows. What needs a cluster (helm install, kubectl apply,
taints and labels) is in tests/k8s, skipped without one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_kubernetes_support import ROOT, loaded, rendered, yaml_load, yaml_load_all

from gpuinfra.render.inventory import group_vars

pytestmark = [
    pytest.mark.tools,  # runs Ansible or a system tool (tests/unit/tool_guard.py)
    pytest.mark.skipif(os.geteuid() != 0, reason="the roles write root-owned files, as on a control host"),
]

PLAYBOOK = """
- name: Write the GPU Operator's, the tenants' and their queues' files without a cluster
  hosts: localhost
  connection: local
  gather_facts: false
  roles:
    - role: gpu_operator
    - role: k8s_tenants
    - role: kueue
"""


def _run(tmp_path: Path, example: str, *extra: str) -> subprocess.CompletedProcess[str]:
    variables = {
        **group_vars(loaded(example).resolved),
        "gpu_operator_apply": False,
        "gpu_operator_config_dir": str(tmp_path / "gpu-operator"),
        "k8s_tenants_apply": False,
        "k8s_tenants_config_dir": str(tmp_path / "k8s-tenants"),
        "kueue_apply": False,
        "kueue_config_dir": str(tmp_path / "kueue"),
        "ansible_python_interpreter": sys.executable,
    }
    (tmp_path / "vars.json").write_text(json.dumps(variables))
    (tmp_path / "play.yml").write_text(PLAYBOOK)
    env = {
        **os.environ,
        "ANSIBLE_ROLES_PATH": str(ROOT / "roles"),
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_STDOUT_CALLBACK": "json",
    }
    return subprocess.run(
        [
            str(Path(sys.executable).parent / "ansible-playbook"),  # beside this Python, on PATH or not
            "-i",
            "localhost,",
            "-e",
            f"@{tmp_path / 'vars.json'}",
            *extra,
            str(tmp_path / "play.yml"),
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        check=False,
    )


def _stats(result: subprocess.CompletedProcess[str]) -> dict[str, int]:
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    stats: dict[str, int] = json.loads(result.stdout)["stats"]["localhost"]
    return stats


@pytest.mark.parametrize("example", ["k8s-mig"])
def test_roles_write_what_plan_shows(tmp_path: Path, example: str) -> None:
    checked = _stats(_run(tmp_path, example, "--check"))
    assert checked["changed"] > 0 and checked["failures"] == 0
    assert not any((tmp_path / folder).exists() for folder in ("gpu-operator", "k8s-tenants", "kueue"))

    assert _stats(_run(tmp_path, example))["changed"] > 0
    plan = rendered(example)
    for path in ("gpu-operator/values.yaml", "gpu-operator/device-plugin-configmap.yaml", "kueue/values.yaml"):
        assert yaml_load((tmp_path / path).read_text()) == yaml_load(plan[path].content), path
    manifests = ("gpu-operator/namespace.yaml", "gpu-operator/mig-parted-configmap.yaml", "k8s-tenants/tenants.yaml")
    for path in (*manifests, "kueue/queues.yaml"):
        assert yaml_load_all((tmp_path / path).read_text()) == yaml_load_all(plan[path].content), path
    assert (tmp_path / "gpu-operator" / "values.yaml").stat().st_mode & 0o777 == 0o640

    assert _stats(_run(tmp_path, example))["changed"] == 0
