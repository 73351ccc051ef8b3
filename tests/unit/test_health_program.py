"""gpuinfra-health (roles/gpu_health/files/gpuinfra-health) run as Slurm and the timer run it: a real process, with
the collection's module_utils as its library, recorded nvidia-smi answers and a kernel log file.

Slurm and Kubernetes are replaced by small command-line doubles here (scontrol keeps one node's state and reason in
a file; kubectl records its arguments), so that every decision can be tried in seconds: drain, leave, resume, and
never touching a drain that is not the program's own. The sandbox test (tests/sandbox/test_health_loop.py) proves
the same against the real slurmctld.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROGRAM = ROOT / "roles" / "gpu_health" / "files" / "gpuinfra-health"
GPUS = ROOT / "gpuinfra" / "sandbox" / "gpus"
PIN = "535.261.03"

# scontrol: `show node NAME --oneliner` prints the node from node.json; `update` changes it and logs the call.
SCONTROL = r"""#!/usr/bin/env python3
import json, sys
path = sys.argv[0] + ".json"
node = json.load(open(path))
with open(sys.argv[0] + ".log", "a") as log:
    log.write(json.dumps(sys.argv[1:]) + "\n")
if sys.argv[1:3] == ["show", "node"]:
    reason = f" Reason={node['reason']} [root@2026-11-25T03:00:00]" if node["reason"] else ""
    print(f"NodeName={sys.argv[3]} Arch=x86_64 CPUTot=2 State={node['state']} Partitions=gpu{reason}")
elif sys.argv[1] == "update":
    args = dict(a.split("=", 1) for a in sys.argv[2:])
    if args["State"] == "DRAIN":
        node.update(state=node["state"].split("+")[0] + "+DRAIN", reason=args["Reason"])
    elif args["State"] == "RESUME":
        node.update(state=node["state"].split("+")[0], reason="")
    json.dump(node, open(path, "w"))
"""

# kubectl: `get node` prints the node from node.json; taint/annotate log their arguments and change the taints.
KUBECTL = r"""#!/usr/bin/env python3
import json, sys
path = sys.argv[0] + ".json"
node = json.load(open(path))
args = [a for a in sys.argv[1:] if not a.startswith("--kubeconfig=")]
with open(sys.argv[0] + ".log", "a") as log:
    log.write(json.dumps(args) + "\n")
if args[0] == "get":
    print(json.dumps({"spec": {"taints": node["taints"]}}))
elif args[0] == "taint":
    spec = args[3]
    if spec.endswith("-"):
        node["taints"] = [t for t in node["taints"] if t["key"] != spec.split(":")[0]]
    else:
        key, _, rest = spec.partition("=")
        value, _, effect = rest.partition(":")
        node["taints"].append({"key": key, "value": value, "effect": effect})
    json.dump(node, open(path, "w"))
"""


@dataclass
class Node:
    """One GPU node's files: settings, state, kernel log, the tools on PATH, and the library."""

    root: Path

    @property
    def kern_log(self) -> Path:
        return self.root / "kern.log"

    def gpus(self, state: str) -> None:
        """Answer nvidia-smi with a recorded state; append its kernel messages, as the fault would print them."""
        (self.root / "bin" / "nvidia-smi").write_text(f"#!/bin/sh\nexec cat {shlex.quote(str(GPUS / state))}.xml\n")
        (self.root / "bin" / "nvidia-smi").chmod(0o755)
        messages = GPUS / f"{state}.kern.log"
        if messages.exists():
            with self.kern_log.open("a") as log:
                log.writelines(f"2026-11-25T03:00:00+0000 gpu02 kernel: {line}" for line in messages.open())

    def config(self, **changes: Any) -> None:
        settings = {
            "gpus": 2,
            "emulated": False,
            "scheduler": "slurm",
            "node_name": "gpu02",
            "nvidia_smi": str(self.root / "bin" / "nvidia-smi"),
            "timeout": 30,
            "kernel_log": str(self.kern_log),
            "check_kernel_module": False,
            "check_dkms": False,
            "dkms_module": "",
            "kubeconfig": "/etc/kubernetes/kubelet.conf",
            "kubectl": str(self.root / "bin" / "kubectl"),
            "policy": {
                "expected_count": 2,
                "expected_model": "L4",
                "expected_pci_ids": ["0x27B8"],
                "fabric_manager": False,
                "driver_version": PIN,
                "max_temperature_c": 85,
                "max_uncorrectable_ecc": 0,
                "allowed_xids": [],
                "require_persistence": True,
                "check_pcie_link": True,
                "mig_layouts": {},
            },
        }
        for key, value in changes.items():
            if key in settings["policy"]:
                settings["policy"][key] = value
            else:
                settings[key] = value
        (self.root / "health.json").write_text(json.dumps(settings))

    def slurm(self, state: str = "IDLE", reason: str = "") -> None:
        (self.root / "bin" / "scontrol.json").write_text(json.dumps({"state": state, "reason": reason}))

    @property
    def slurm_node(self) -> dict[str, str]:
        node: dict[str, str] = json.loads((self.root / "bin" / "scontrol.json").read_text())
        return node

    def calls(self, tool: str) -> list[list[str]]:
        log = self.root / "bin" / f"{tool}.log"
        return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []

    def start(self, *args: str) -> subprocess.CompletedProcess[str]:
        """Run the program as Slurm would; the library comes from plugins/module_utils."""
        starter = (
            "import runpy, sys; sys.path.insert(0, sys.argv.pop(1)); sys.argv[0] = 'gpuinfra-health'; "
            "runpy.run_path(sys.argv.pop(1), run_name='__main__')"
        )
        command = [sys.executable, "-c", starter, str(self.root / "lib"), str(PROGRAM)]
        command += ["--config", str(self.root / "health.json"), "--state", str(self.root / "state" / "s.json")]
        env = {**os.environ, "PATH": f"{self.root / 'bin'}{os.pathsep}{os.environ['PATH']}"}
        return subprocess.run([*command, *args], capture_output=True, text=True, env=env, timeout=60)

    def run(self, *args: str) -> tuple[int, dict[str, Any]]:
        """Run it with --json: its exit code and verdict."""
        done = self.start("--json", *args)
        assert done.returncode in (0, 1), done.stderr
        verdict: dict[str, Any] = json.loads(done.stdout)
        return done.returncode, verdict


@pytest.fixture
def node(tmp_path: Path) -> Node:
    (tmp_path / "bin").mkdir()
    library = tmp_path / "lib" / "gpuinfra_node"
    library.mkdir(parents=True)
    for name in ("nvidia_smi.py", "node_probe.py"):
        (library / name).symlink_to(ROOT / "plugins" / "module_utils" / name)
    for name, text in (("scontrol", SCONTROL), ("kubectl", KUBECTL)):
        (tmp_path / "bin" / name).write_text(text)
        (tmp_path / "bin" / name).chmod(0o755)
    (tmp_path / "kern.log").write_text("2026-11-25T02:00:00+0000 gpu02 kernel: Linux version 6.1.0-31-amd64\n")
    result = Node(tmp_path)
    result.config()
    result.gpus("healthy")
    result.slurm()
    return result


def test_a_healthy_node_is_left_alone(node: Node) -> None:
    code, verdict = node.run()
    assert (code, verdict["healthy"], verdict["action"]) == (0, True, "nothing to do")
    assert [c for c in node.calls("scontrol") if c[0] == "update"] == []


def test_a_gpu_off_the_bus_drains_the_node_until_it_is_repaired(node: Node) -> None:
    node.run()  # a healthy check first: the program learns which GPU sits at which PCI address
    node.gpus("xid79")
    code, verdict = node.run()
    assert code == 1
    assert node.slurm_node == {"state": "IDLE+DRAIN", "reason": "gpuinfra-health: xid 79 on GPU 1"}
    assert verdict["reason"] == "gpuinfra-health: xid 79 on GPU 1"
    assert "node: nvidia-smi lists 1 GPU(s), the model expects 2" in verdict["problems"]

    # The GPU is back (a reseat), but XID 79 needs a reboot or an operator's word: the node stays drained.
    node.gpus("healthy")
    code, verdict = node.run()
    assert (code, verdict["action"]) == (1, "left drained")
    assert any("XID 79" in p for p in verdict["problems"]), verdict["problems"]
    assert node.slurm_node["state"] == "IDLE+DRAIN"

    code, verdict = node.run("--clear-xids")
    assert (code, verdict["action"]) == (0, "resumed")
    assert node.slurm_node == {"state": "IDLE", "reason": ""}


def test_a_transient_xid_fails_only_the_check_that_saw_it(node: Node) -> None:
    with node.kern_log.open("a") as log:
        log.write("2026-11-25T03:01:00+0000 gpu02 kernel: NVRM: Xid (PCI:0000:18:00): 13, pid=4242, name=train.py, "
                  "Graphics Exception: ESR 0x514648=0x1000a\n")  # fmt: skip
    code, _ = node.run()
    assert code == 1 and node.slurm_node["reason"] == "gpuinfra-health: xid 13 on GPU 0"
    code, verdict = node.run()
    assert (code, verdict["action"]) == (0, "resumed")


def test_an_allowed_xid_never_drains(node: Node) -> None:
    node.config(allowed_xids=[13])
    with node.kern_log.open("a") as log:
        log.write("2026-11-25T03:01:00+0000 gpu02 kernel: NVRM: Xid (PCI:0000:18:00): 13, pid=1, name=a, x\n")
    code, verdict = node.run()
    assert (code, verdict["action"]) == (0, "nothing to do")


@pytest.mark.parametrize(
    ("state", "reason"),
    [
        ("gpu-missing", "gpuinfra-health: 1 of 2 GPUs visible"),
        (
            "row-remap-pending",
            "gpuinfra-health: GPU 0 (00000000:18:00.0): row remapping is pending: reset the GPU (or reboot) "
            "to apply it",
        ),
    ],
)
def test_each_recorded_fault_drains_with_its_reason(node: Node, state: str, reason: str) -> None:
    node.gpus(state)
    code, verdict = node.run()
    assert code == 1
    assert node.slurm_node == {"state": "IDLE+DRAIN", "reason": reason}
    node.gpus("healthy")
    code, verdict = node.run()
    assert (code, verdict["action"], node.slurm_node["state"]) == (0, "resumed", "IDLE")


def test_an_admin_drain_is_never_resumed_nor_renamed(node: Node) -> None:
    node.slurm("MIXED+DRAIN", "disk replacement, ticket 4711")
    code, verdict = node.run()
    assert code == 0 and verdict["action"].startswith("left drained by someone else")
    node.gpus("gpu-missing")
    code, verdict = node.run()
    assert code == 1 and verdict["action"].startswith("left drained (drained by someone else")
    assert node.slurm_node == {"state": "MIXED+DRAIN", "reason": "disk replacement, ticket 4711"}
    assert [c for c in node.calls("scontrol") if c[0] == "update"] == []


def test_the_wrong_gpu_model_fails(node: Node) -> None:
    node.config(expected_model="H100-SXM5-80GB", expected_pci_ids=["0x2330"])
    code, verdict = node.run("--no-action")
    assert code == 1 and verdict["action"] == "no action"
    assert verdict["problems"][0] == (
        "GPU 0 (00000000:18:00.0): is a NVIDIA L4 (PCI device 0x27B8), the model expects H100-SXM5-80GB"
    )


def test_a_node_without_gpus_resumes_its_own_drain(node: Node) -> None:
    node.config(gpus=0)
    node.slurm("IDLE+DRAIN", "gpuinfra-health: 1 of 2 GPUs visible")
    code, verdict = node.run()
    assert (code, verdict["action"], node.slurm_node["state"]) == (0, "resumed", "IDLE")


def test_kubernetes_taints_then_untaints_only_its_own_key(node: Node) -> None:
    node.config(scheduler="kubernetes")
    other = {"key": "dedicated", "value": "vision", "effect": "NoSchedule"}
    (node.root / "bin" / "kubectl.json").write_text(json.dumps({"taints": [other]}))
    node.gpus("gpu-missing")
    code, _ = node.run()
    assert code == 1
    taints = json.loads((node.root / "bin" / "kubectl.json").read_text())["taints"]
    assert taints == [
        other,
        {"key": "gpuinfra.io/gpu-unhealthy", "value": "1-of-2-GPUs-visible", "effect": "NoSchedule"},
    ]
    assert ["annotate", "node", "gpu02", "gpuinfra.io/gpu-unhealthy-reason=gpuinfra-health: 1 of 2 GPUs visible",
            "--overwrite"] in node.calls("kubectl")  # fmt: skip
    node.gpus("healthy")
    code, verdict = node.run()
    assert (code, verdict["action"]) == (0, "removed the taint gpuinfra.io/gpu-unhealthy")
    assert json.loads((node.root / "bin" / "kubectl.json").read_text())["taints"] == [other]


def test_the_kernel_log_is_read_from_where_the_last_check_stopped(node: Node) -> None:
    node.run()
    size = node.kern_log.stat().st_size
    state = json.loads((node.root / "state" / "s.json").read_text())
    assert state["cursor"] == f"{size}:{node.kern_log.stat().st_ino}"
    # A rotated log (renamed away, a new file in its place) is read from its start.
    node.kern_log.rename(node.kern_log.with_suffix(".log.1"))
    node.kern_log.write_text("2026-11-25T04:00:00+0000 gpu02 kernel: NVRM: Xid (PCI:0000:2a:00): 48, pid=1, name=a\n")
    code, _ = node.run()
    assert code == 1 and node.slurm_node["reason"] == "gpuinfra-health: xid 48 on GPU 1"


def test_a_broken_configuration_exits_2_without_a_traceback(node: Node) -> None:
    (node.root / "health.json").write_text("{not json")
    done = node.start()
    assert done.returncode == 2
    assert done.stderr.startswith("gpuinfra-health: ") and "Traceback" not in done.stderr


def test_the_journal_is_read_after_the_cursor_of_the_last_check(node: Node) -> None:
    node.config(kernel_log="journal")
    journalctl = node.root / "bin" / "journalctl"
    journalctl.write_text(
        "#!/bin/sh\n"
        f'echo "$@" >> {shlex.quote(str(journalctl))}.log\n'
        "echo '2026-11-25T03:00:00+0000 gpu02 kernel: NVRM: Xid (PCI:0000:18:00): 48, pid=1, name=a'\n"
        "echo '-- cursor: s=0f1e;i=2a'\n"
    )
    journalctl.chmod(0o755)
    code, verdict = node.run()
    assert code == 1 and verdict["kernel_log_source"] == "journalctl -k -b"
    node.run()
    first, second = (journalctl.with_suffix(".log")).read_text().splitlines()
    assert "-b" in first.split() and "--after-cursor" not in first
    assert "--after-cursor=s=0f1e;i=2a" in second.split()
