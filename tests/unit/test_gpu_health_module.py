"""The gpu_health module run through Ansible for real (`ansible localhost -m gpuinfra.cluster.gpu_health`).

nvidia-smi, journalctl, modinfo and dkms are small scripts on PATH that print a fixture and exit with the code the
real tool uses: the fixture is data, the module and its parser are the real ones.
"""

from __future__ import annotations

import ast
import glob
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import AnsibleJson
from ruamel.yaml import YAML

from gpuinfra.model import Cluster
from gpuinfra.render.vars import health
from gpuinfra.resolve import ResolvedCluster, resolve

pytestmark = pytest.mark.tools  # runs Ansible or a system tool (tests/unit/tool_guard.py)

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "unit" / "data" / "nvidia-smi"
MODULE = ROOT / "plugins" / "modules" / "gpu_health.py"
ANSIBLE = Path(sys.executable).parent / "ansible"
PIN = "550.127.05"

GPU3 = "GPU 3 (00000000:5D:00.0)"
GPU6 = "GPU 6 (00000000:BA:00.0)"
UNHEALTHY = [
    f"{GPU3}: temperature 92 C is above the 85 C limit",
    f"{GPU3}: 3 uncorrectable ECC error(s) since the driver loaded (limit 0)",
    f"{GPU3}: row remapping is pending: reset the GPU (or reboot) to apply it",
    f"{GPU3}: clocks slowed down: hw_thermal_slowdown, sw_thermal_slowdown",
    f"{GPU3}: XID 48 (reset the GPU) in the kernel log since boot (1 time): An uncorrectable double bit error (DBE) "
    "has been detected on GPU in the framebuffer at partition 6, subpartition 0.",
    f"{GPU6}: PCIe link width x8 is below its maximum x16",
    f"{GPU6}: PCIe link Gen3 is below its maximum Gen5",
    f"{GPU6}: XID 79 (reboot) in the kernel log since boot (2 times): GPU has fallen off the bus.",
    "node: XID 119 (reset the GPU) in the kernel log since boot for PCI 0000:c1:00, a GPU nvidia-smi does not list "
    "(1 time): Timeout after 6s of waiting for RPC response from GPU1 GSP! Expected function 76 (GSP_RM_CONTROL) "
    "(0x20800a4c 0x4).",
]
# Checks that need tools these tests fake on purpose; switched on only where a test provides them.
NO_HOST_CHECKS = {"check_kernel_module": False, "check_dkms": False}


class Node:
    """A fake node: a folder of tools on PATH, and a way to run the module against them."""

    def __init__(self, tmp: Path, collections: Path, ansible: AnsibleJson) -> None:
        self.bin = tmp / "bin"
        self.bin.mkdir()
        self.tmp = tmp
        self.collections = collections
        self.ansible = ansible
        self.tool("journalctl", "")  # an empty kernel log unless a test says otherwise

    def tool(self, name: str, stdout: str | Path, rc: int = 0, stderr: str = "", sleep: int = 0) -> None:
        source = stdout if isinstance(stdout, Path) else self.tmp / f"{name}.out"
        if not isinstance(stdout, Path):
            source.write_text(stdout)
        script = self.bin / name
        script.write_text(
            "#!/bin/sh\n"
            + (f"sleep {sleep}\n" if sleep else "")
            + f"cat '{source}'\n"
            + (f"printf '%s\\n' '{stderr}' >&2\n" if stderr else "")
            + f"exit {rc}\n"
        )
        script.chmod(0o755)

    def run(self, args: dict[str, Any], *, check: bool = False) -> tuple[int, dict[str, Any], str]:
        command = [str(ANSIBLE), "localhost", "-m", "gpuinfra.cluster.gpu_health", "-a", json.dumps(args)]
        rc, output, stdout = self.ansible([*command, *(["--check"] if check else [])], self.bin)
        result: dict[str, Any] = output["plays"][0]["tasks"][0]["hosts"]["localhost"]
        return rc, result, stdout


@pytest.fixture
def node(tmp_path: Path, collections: Path, ansible_json: AnsibleJson) -> Node:
    return Node(tmp_path, collections, ansible_json)


def loaded_nvidia() -> str | None:
    path = Path("/sys/module/nvidia/version")
    return path.read_text().strip() if path.exists() else None


def test_healthy_node(node: Node) -> None:
    if loaded_nvidia() not in (None, PIN):
        pytest.skip(f"this machine has the nvidia module {loaded_nvidia()} loaded, which the module reads")
    node.tool("nvidia-smi", DATA / "h100-hgx-8x-healthy.xml")
    node.tool("modinfo", f"{PIN}\n")
    node.tool("dkms", f"nvidia-current/{PIN}, 6.1.0-31-amd64, x86_64: installed\n")
    rc, result, _ = node.run({"expected_count": 8, "driver_version": PIN, "dkms_kernels": ["6.1.0-31-amd64"]})
    assert rc == 0, result.get("msg")
    assert (result["healthy"], result["changed"], result["problems"], result["node_problems"]) == (True, False, [], [])
    assert (result["gpu_count"], result["expected_count"], result["driver_version"], result["driver_pin"]) == (
        8,
        8,
        PIN,
        PIN,
    )
    assert (result["nvidia_smi_rc"], result["dtd"], result["kernel_log_source"]) == (
        0,
        "nvsmi_device_v12.dtd",
        "journalctl -k -b",
    )
    assert result["kernel_module_version"] == PIN
    assert result["dkms_kernels"] == ["6.1.0-31-amd64"]
    assert result["dkms"] == [
        {
            "module": "nvidia-current",
            "version": PIN,
            "kernel": "6.1.0-31-amd64",
            "arch": "x86_64",
            "state": "installed",
            "note": "",
        }
    ]
    assert [(g["index"], g["pci_bus_id"], g["problems"]) for g in result["gpus"]][:2] == [
        (0, "00000000:18:00.0", []),
        (1, "00000000:2A:00.0", []),
    ]
    assert result["gpus"][7]["uuid"] == "GPU-9c0e4b23-7f15-4a8d-b6e2-0d3a9c5f1e47"


def test_unhealthy_node_fails_naming_each_gpu_and_reason(node: Node) -> None:
    node.tool("nvidia-smi", DATA / "h100-hgx-8x-unhealthy.xml")
    node.tool("journalctl", DATA / "kernel-log-journal.txt")
    rc, result, stdout = node.run({"expected_count": 8, **NO_HOST_CHECKS})
    assert rc == 2
    assert (result["failed"], result["healthy"], result["changed"]) == (True, False, False)
    assert result["problems"] == UNHEALTHY
    assert result["msg"] == f"GPU node unhealthy (9 problems): {'; '.join(UNHEALTHY)}"
    assert [g["index"] for g in result["gpus"] if g["problems"]] == [3, 6]
    assert result["gpus"][1]["xids"][0]["xid"] == 13  # the application's: reported, not judged
    assert [e["xid"] for e in result["xid_events"]] == [48, 63, 13, 79, 79, 119]
    assert [(r["xid"], r["class"], r["gpu"], r["pid"], r["process"]) for r in result["xid_reports"]] == [
        (63, "ignore", 3, 24511, "python3"),
        (13, "application", 1, 30877, "train.py"),
    ]
    assert f"{GPU3}: temperature 92 C is above the 85 C limit" in stdout


def test_the_sites_xid_classes_override_the_catalog(node: Node) -> None:
    """Ansible hands a dict's keys over as strings: the module reads them back as XID numbers."""
    node.tool("nvidia-smi", DATA / "h100-hgx-8x-healthy.xml")
    node.tool("journalctl", DATA / "kernel-log-journal.txt")
    rc, result, _ = node.run({"xid_classes": {"13": "node", "48": "ignore", "79": "ignore"}, **NO_HOST_CHECKS})
    assert rc == 2
    assert [p.split(" in the kernel log")[0] for p in result["problems"]] == [
        "GPU 1 (00000000:2A:00.0): XID 13",
        "node: XID 119 (reset the GPU)",
    ]


def test_a_wrong_xid_class_is_refused_naming_each(node: Node) -> None:
    node.tool("nvidia-smi", DATA / "h100-hgx-8x-healthy.xml")
    rc, result, _ = node.run({"xid_classes": {"13": "nodes", "x": "node", "1500": "reset"}, **NO_HOST_CHECKS})
    assert rc == 2
    assert result["msg"] == (
        "xid_classes: XID 13: 'nodes' is not a class (application, ignore, node, reset, reboot, hardware); 'x' is not "
        "an XID number (1 to 999); '1500' is not an XID number (1 to 999)"
    )


def test_unhealthy_node_reported_without_failing(node: Node) -> None:
    node.tool("nvidia-smi", DATA / "h100-hgx-8x-persistence-off.xml")
    rc, result, _ = node.run({"fail_on_unhealthy": False, **NO_HOST_CHECKS})
    assert rc == 0
    assert (result["healthy"], len(result["problems"]), "failed" in result and result["failed"]) == (False, 8, False)
    assert result["problems"][0] == (
        "GPU 0 (00000000:18:00.0): persistence mode is Disabled (is nvidia-persistenced running?)"
    )


def test_check_mode_gives_the_same_verdict(node: Node) -> None:
    node.tool("nvidia-smi", DATA / "a100-sxm4-4x-mig.xml")
    args = {"expected_count": 4, "mig_layouts": {"0": "halves", "1": "mixed"}, **NO_HOST_CHECKS}
    rc, result, _ = node.run(args, check=True)
    assert (rc, result["healthy"], result["changed"], result["gpu_count"]) == (0, True, False, 4)
    assert [g["mig"]["expected"] for g in result["gpus"]] == ["Enabled", "Enabled", "Disabled", "Disabled"]


def test_mig_mode_against_the_model(node: Node) -> None:
    node.tool("nvidia-smi", DATA / "a100-sxm4-4x-mig.xml")
    rc, result, _ = node.run({"mig_layouts": {"1": "mixed", "2": "halves"}, **NO_HOST_CHECKS})
    assert rc == 2
    assert result["problems"] == [
        "GPU 0 (00000000:07:00.0): MIG mode is Enabled, the model assigns no MIG layout to this GPU",
        "GPU 2 (00000000:47:00.0): MIG mode is Disabled, the model assigns layout 'halves' (MIG enabled)",
    ]


@pytest.mark.parametrize(
    ("fixture", "rc", "problem"),
    [
        ("error-driver-library-mismatch.txt", 18, "nvidia-smi: Driver/library version mismatch: "),
        ("error-no-driver.txt", 9, "nvidia-smi cannot communicate with the NVIDIA driver: "),
        ("error-no-devices.txt", 6, "nvidia-smi finds no GPUs (No devices were found): "),
    ],
)
def test_nvidia_smi_failing_is_a_node_problem(node: Node, fixture: str, rc: int, problem: str) -> None:
    node.tool("nvidia-smi", DATA / fixture, rc=rc)
    ansible_rc, result, _ = node.run({"expected_count": 8, **NO_HOST_CHECKS})
    assert ansible_rc == 2
    assert (result["nvidia_smi_rc"], result["gpus"], result["gpu_count"]) == (rc, [], 0)
    assert len(result["node_problems"]) == 1
    assert result["node_problems"][0].startswith(problem)
    assert result["msg"] == f"GPU node unhealthy (1 problem): node: {result['node_problems'][0]}"
    assert "Traceback" not in json.dumps(result)


def test_nvidia_smi_missing(node: Node) -> None:
    rc, result, _ = node.run({"nvidia_smi": str(node.tmp / "absent" / "nvidia-smi"), **NO_HOST_CHECKS})
    assert rc == 2
    assert result["node_problems"] == [
        f"{node.tmp / 'absent' / 'nvidia-smi'} is not installed: no NVIDIA driver user-space tools on this node"
    ]
    assert result["nvidia_smi_rc"] is None


def test_hung_nvidia_smi(node: Node) -> None:
    node.tool("nvidia-smi", DATA / "h100-hgx-8x-healthy.xml", sleep=30)
    rc, result, _ = node.run({"timeout": 1, **NO_HOST_CHECKS})
    assert rc == 2
    assert result["nvidia_smi_rc"] == 124
    assert result["node_problems"] == ["nvidia-smi did not answer in time: a GPU or the driver is hung"]


def test_unreadable_kernel_log(node: Node) -> None:
    node.tool("nvidia-smi", DATA / "h100-hgx-8x-healthy.xml")
    node.tool("journalctl", "", rc=1, stderr="Failed to open journal: Permission denied")
    node.tool("dmesg", "", rc=1, stderr="dmesg: read kernel buffer failed: Operation not permitted")
    rc, result, _ = node.run(NO_HOST_CHECKS)
    assert rc == 2  # a gate passes on healthy only: unknown fails it, with what could not be read
    assert (result["verdict"], result["node_problems"], result["problems"]) == ("unknown", [], [])
    assert result["unknown"] == [
        "cannot read the kernel log, XIDs are unchecked (journalctl -k -b: Failed to open journal: Permission "
        "denied; dmesg: dmesg: read kernel buffer failed: Operation not permitted)"
    ]
    assert result["msg"].startswith("GPU node health unknown: a check could not look: cannot read the kernel log")


def test_dmesg_when_journalctl_fails(node: Node) -> None:
    node.tool("nvidia-smi", DATA / "v100-sxm2-2x-r460-healthy.xml")
    node.tool("journalctl", "", rc=1, stderr="No journal files were found.")
    node.tool("dmesg", DATA / "kernel-log-dmesg.txt")
    rc, result, _ = node.run({"allowed_xids": [31], **NO_HOST_CHECKS})
    assert rc == 2
    assert result["kernel_log_source"] == "dmesg"
    assert [p.split(": XID")[1].split(" in")[0] for p in result["problems"]] == [" 48 (reset the GPU)"]
    assert all(p.startswith("GPU 1 (00000000:07:00.0): XID") for p in result["problems"])


def test_kernel_module_and_dkms_against_the_pin(node: Node) -> None:
    if loaded_nvidia() is not None:
        pytest.skip(f"this machine has the nvidia module {loaded_nvidia()} loaded, which the module reads")
    node.tool("nvidia-smi", DATA / "a100-sxm4-4x-mig.xml")
    node.tool("modinfo", "535.216.03\n")
    node.tool(
        "dkms",
        "nvidia-current/535.261.03, 6.1.0-31-amd64, x86_64: installed\n"
        "nvidia-current/535.261.03, 6.1.0-32-amd64, x86_64: built\n",
    )
    args = {
        "driver_version": "535.261.03",
        "mig_layouts": {"0": "halves", "1": "mixed"},
        "dkms_kernels": ["6.1.0-31-amd64", "6.1.0-32-amd64"],
    }
    rc, result, _ = node.run(args)
    assert rc == 2
    assert result["node_problems"] == [
        "modinfo: the nvidia kernel module is 535.216.03, the pin is 535.261.03",
        "DKMS: the nvidia module 535.261.03 is not installed for kernel 6.1.0-32-amd64 "
        "(nvidia-current/535.261.03: built)",
    ]
    assert result["kernel_module_version"] == "535.216.03"


def test_dkms_defaults_to_every_installed_kernel(node: Node) -> None:
    kernels = {Path(p).name[len("vmlinuz-") :] for p in glob.glob("/boot/vmlinuz-*")}
    if Path("/lib/modules", os.uname().release).is_dir():
        kernels.add(os.uname().release)
    node.tool("nvidia-smi", DATA / "a100-sxm4-4x-mig.xml")
    node.tool("dkms", "".join(f"nvidia/535.261.03, {k}, x86_64: installed\n" for k in sorted(kernels)[1:]))
    args = {"driver_version": "535.261.03", "mig_layouts": {"0": "a", "1": "b"}, "check_kernel_module": False}
    rc, result, _ = node.run(args)
    assert rc == 2
    assert result["dkms_kernels"] == sorted(kernels)
    if kernels:
        assert result["node_problems"] == [f"DKMS: no nvidia module 535.261.03 for kernel {sorted(kernels)[0]}"]
    else:  # a container without kernels of its own, like the machines these tests were written on
        assert result["node_problems"] == [
            "DKMS: found no installed kernel to check (no /boot/vmlinuz-*, no modules folder)"
        ]


# --- documentation agrees with the code ---------------------------------------------------------------------------


def _module_constants() -> dict[str, Any]:
    tree = ast.parse(MODULE.read_text())
    out: dict[str, Any] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign | ast.AnnAssign):
            target = node.targets[0] if isinstance(node, ast.Assign) else node.target
            if isinstance(target, ast.Name) and target.id in {"DOCUMENTATION", "RETURN", "EXAMPLES", "ARGUMENT_SPEC"}:
                assert node.value is not None
                out[target.id] = ast.literal_eval(node.value)
    return out


def test_documented_options_are_the_argument_spec() -> None:
    constants = _module_constants()
    options = YAML(typ="safe").load(constants["DOCUMENTATION"])["options"]
    spec = constants["ARGUMENT_SPEC"]
    assert set(options) == set(spec)
    for name, documented in options.items():
        for key in ("type", "default", "elements"):
            assert documented.get(key) == spec[name].get(key), f"{name}.{key}"
    YAML(typ="safe").load(constants["EXAMPLES"])


def test_documented_return_values_are_what_the_module_returns(node: Node) -> None:
    node.tool("nvidia-smi", DATA / "h100-hgx-8x-healthy.xml")
    _, result, _ = node.run({"fail_on_unhealthy": False})
    documented = set(YAML(typ="safe").load(_module_constants()["RETURN"]))
    returned = {
        key
        for key in result
        if key not in {"action", "changed", "invocation", "failed", "msg"} and not key.startswith("_")
    }
    assert returned == documented
    gpu_keys = set(YAML(typ="safe").load(_module_constants()["RETURN"])["gpus"]["contains"])
    assert set(result["gpus"][0]) == gpu_keys


# --- the role and its playbook, and the variables gpuinfra renders for them ------------------------------------


def _role_options() -> dict[str, Any]:
    """The options of the roles the health concern sets: the health program's and its active checks' tools."""
    options: dict[str, Any] = {}
    for role in ("gpu_health", "gpu_check_tools"):
        specs = YAML(typ="safe").load((ROOT / "roles" / role / "meta" / "argument_specs.yml").read_text())
        for entry in specs["argument_specs"].values():
            options.update(entry["options"])
    return options


def _cluster(**sections: Any) -> ResolvedCluster:
    groups = {
        "gpu": {"hosts": "gpu[01-02]", "roles": ["slurm_compute"], "gpu": {"model": "H100-SXM5-80GB", "count": 8}}
    }
    return resolve(Cluster.model_validate({"name": "t", "node_groups": groups, **sections}))


@pytest.mark.parametrize(
    ("sections", "expected"),
    [
        (
            {"driver": {"version": "535.261.03"}, "health": {"max_temperature_c": 80, "allowed_xids": [31, 13, 13]}},
            {
                "gpu_health_max_temperature_c": 80,
                "gpu_health_max_uncorrectable_ecc": 0,
                "gpu_health_allowed_xids": [13, 31],
                "gpu_health_xid_classes": {},
                "gpu_health_xid_repeat_jobs": 3,
                "gpu_health_xid_repeat_window": 3600,
                "gpu_health_require_persistence": True,
                "gpu_health_check_pcie_link": True,
                "gpu_health_driver_version": "535.261.03",
            },
        ),
        (
            {"driver": {"branch": 550}, "health": {"require_persistence": False, "check_pcie_link": False}},
            {
                "gpu_health_max_temperature_c": 85,
                "gpu_health_max_uncorrectable_ecc": 0,
                "gpu_health_allowed_xids": [],
                "gpu_health_require_persistence": False,
                "gpu_health_check_pcie_link": False,
                "gpu_health_driver_version": "550",
            },
        ),
        (
            {"health": {"max_uncorrectable_ecc": 2}},
            {"gpu_health_max_uncorrectable_ecc": 2, "gpu_health_driver_version": ""},
        ),
        (
            {"health": {"xid_classes": {94: "reset", 43: "node"}, "xid_repetition": {"jobs": 5, "window": "2h"}}},
            {
                "gpu_health_xid_classes": {"43": "node", "94": "reset"},
                "gpu_health_xid_repeat_jobs": 5,
                "gpu_health_xid_repeat_window": 7200,
            },
        ),
    ],
)
def test_rendered_variables(sections: dict[str, Any], expected: dict[str, Any]) -> None:
    rendered = health.group_vars(_cluster(**sections))
    assert {k: rendered[k] for k in expected} == expected
    options = _role_options()
    assert set(rendered) <= set(options)
    python_types = {"int": int, "bool": bool, "list": list, "str": str, "dict": dict}
    for name, value in rendered.items():
        assert type(value) is python_types[options[name]["type"]], name
    templates = {"health.json.j2", "gpuinfra-health.service.j2", "gpuinfra-health.timer.j2"}
    assert {(a.role, a.template) for a in health.ARTIFACTS} == {("gpu_health", t) for t in templates}


def test_role_defaults_read_the_inventory_host_facts() -> None:
    defaults = YAML(typ="safe").load((ROOT / "roles" / "gpu_health" / "defaults" / "main.yml").read_text())
    assert "gpuinfra_gpu_count" in defaults["gpu_health_expected_count"]
    assert "gpuinfra_mig_layouts" in defaults["gpu_health_mig_layouts"]


def test_health_playbook_fails_only_the_unhealthy_node(node: Node) -> None:
    """Two nodes: gpu01 as modelled, gpu02 with MIG on a GPU the model leaves whole. Only gpu02 fails."""
    node.tool("smi-h100", DATA / "h100-hgx-8x-healthy.xml")
    node.tool("smi-a100", DATA / "a100-sxm4-4x-mig.xml")
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    inventory = {
        "all": {
            "vars": {"gpu_health_check_kernel_module": False, "gpu_health_check_dkms": False},
            "children": {
                "gpu_nodes": {
                    "hosts": {
                        "gpu01": {
                            **local,
                            "gpuinfra_gpu_count": 8,
                            "gpuinfra_mig_layouts": {},
                            "gpu_health_nvidia_smi": str(node.bin / "smi-h100"),
                        },
                        "gpu02": {
                            **local,
                            "gpuinfra_gpu_count": 4,
                            "gpuinfra_mig_layouts": {"0": "halves"},
                            "gpu_health_nvidia_smi": str(node.bin / "smi-a100"),
                        },
                    }
                }
            },
        }
    }
    (node.tmp / "inventory.json").write_text(json.dumps(inventory))
    env = {
        **os.environ,
        "PATH": f"{node.bin}:{ANSIBLE.parent}:/usr/local/bin:/usr/bin:/bin",
        "ANSIBLE_COLLECTIONS_PATH": str(node.collections),
        "ANSIBLE_LOCAL_TEMP": str(node.tmp / "ansible-local"),
        "ANSIBLE_HOME": str(node.tmp / "ansible-home"),
        "ANSIBLE_NOCOLOR": "1",
    }
    proc = subprocess.run(
        [
            str(ANSIBLE.parent / "ansible-playbook"),
            "-i",
            str(node.tmp / "inventory.json"),
            str(ROOT / "playbooks" / "health.yml"),
        ],
        env=env,
        cwd=node.tmp,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    recap = {line.split()[0]: line for line in proc.stdout.splitlines() if line.startswith("gpu0")}
    assert "failed=0" in recap["gpu01"] and "failed=1" in recap["gpu02"]
    assert '"Healthy: 8 GPU(s), driver 550.127.05"' in proc.stdout
    assert (
        "GPU node unhealthy (1 problem): GPU 1 (00000000:0F:00.0): MIG mode is Enabled, "
        "the model assigns no MIG layout to this GPU"
    ) in proc.stdout


def test_a_node_health_programs_verdict_is_the_modules(node: Node) -> None:
    """Emulated GPUs (the sandbox) are judged by the node health program, which reads their stand-in: the module
    runs it read-only and fails with its problems, so `gpuinfra health` drains the node like one with real GPUs.
    Its texts stay data: a problem holding Jinja comes back as written."""
    problem = "GPU 1 (00000000:2A:00.0): XID 79 in the kernel log this boot (1 time): {{ lookup('pipe', 'id') }}"
    verdict = {"healthy": False, "problems": [problem], "node_problems": [], "gpus": [{"index": 0}, {"index": 1}]}
    node.tool("gpuinfra-health", json.dumps(verdict) + "\n", rc=1)
    rc, result, _ = node.run({"program": str(node.bin / "gpuinfra-health")})
    assert rc != 0 and result["failed"] is True
    assert (result["healthy"], result["problems"], result["gpu_count"]) == (False, [problem], 2)
    assert result["msg"] == f"GPU node unhealthy (1 problem): {problem}"
    node.tool("gpuinfra-health", json.dumps({**verdict, "healthy": True, "problems": []}) + "\n")
    rc, result, _ = node.run({"program": str(node.bin / "gpuinfra-health")})
    assert (rc, result["healthy"], result["problems"]) == (0, True, [])
    node.tool("gpuinfra-health", "", rc=2, stderr="cannot read /etc/gpuinfra/health.json")
    rc, result, _ = node.run({"program": str(node.bin / "gpuinfra-health")})
    assert rc != 0 and "problems" not in result and "could not judge the node (exit code 2)" in result["msg"]
