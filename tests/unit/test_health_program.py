"""gpuinfra-health (roles/gpu_health/files/gpuinfra_health.py) run as Slurm and the timer run it: a real process, with
the collection's module_utils as its library, recorded nvidia-smi answers and a kernel log file.

Slurm is replaced by a small command-line double here (scontrol keeps one node's state and reason in a file), so
that every decision can be tried in seconds: drain, leave, resume, and never touching a drain that is not the
program's own. The sandbox test (tests/sandbox/test_health_loop.py) proves the same against the real slurmctld.

No Kubernetes API server can run on this machine. The program talks HTTPS to one, so a small HTTPS server stands in
for it (`ApiServer`): it serves one Node, applies JSON merge patches (RFC 7386) with the resourceVersion
precondition, lists the node group's nodes by label (the breaker's count), answers others' nodes as RBAC with
resourceNames would (403), and records every request, so that the tests assert exactly what the program sends:
method, path, headers and body. tests/k8s/test_real_cluster.py checks
the service account's rights against a real cluster.
"""

from __future__ import annotations

import base64
import contextlib
import datetime
import importlib
import importlib.util
import ipaddress
import json
import os
import re
import shlex
import ssl
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from file_module import node_program
from ruamel.yaml import YAML

ROOT = Path(__file__).resolve().parents[2]
PROGRAM = ROOT / "roles" / "gpu_health" / "files" / "gpuinfra_health.py"
# What the role installs beside the program.
LIBRARY = YAML(typ="safe").load((ROOT / "roles" / "gpu_health" / "vars" / "main.yml").read_text())[
    "__gpu_health_library_files"
]
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
    print(f"NodeName={sys.argv[3]} Arch=x86_64 CPUTot=2 State={node['state']} Partitions=gpu,gpuinfra{reason}")
elif sys.argv[1:3] == ["show", "reservation"]:
    if sys.argv[3] not in node.get("reservations", []):
        sys.exit(f"Reservation {sys.argv[3]} not found")
    print(f"ReservationName={sys.argv[3]} Nodes=gpu02 Users=root Flags=MAINT,IGNORE_JOBS,SPEC_NODES")
elif sys.argv[1] == "pidinfo":
    job = node.get("jobs", {}).get(sys.argv[2])
    if job is None:
        sys.exit("slurm_pid2jobid error: Process not found")
    if int(job[0]) % 2:  # Slurm 22.05's wording (Debian 12) for odd job ids, 24.11's (Debian 13) for even ones
        print(f"Slurm job id {job[0]} ends at Tue Nov 25 04:00:00 2026\nslurm_get_rem_time is 3599")
    else:
        print(f"Slurm JobId={job[0]} ends at Tue Nov 25 04:00:00 2026\nJob remaining time is 3599 seconds")
elif sys.argv[1:3] == ["show", "job"]:
    users = {job: user for job, user in node.get("jobs", {}).values()}
    print(f"JobId={sys.argv[3]} JobName=train UserId={users[sys.argv[3]]}(1001) GroupId=users(100) Priority=1")
elif sys.argv[1] == "update":
    args = dict(a.split("=", 1) for a in sys.argv[2:])
    if args["State"] == "DRAIN":
        node.update(state=node["state"].split("+")[0] + "+DRAIN", reason=args["Reason"])
    elif args["State"] == "RESUME":
        node.update(state=node["state"].split("+")[0], reason="")
    json.dump(node, open(path, "w"))
"""

# sinfo: `--noheader --Node --partition=P --format=%N|%T|%H|%E` lists the partition's other nodes from sinfo.json
# (each [name, state, reason time, reason], the ones with "from_call": N only from its Nth call on, as slurmctld's
# view changes between two calls) and this node from scontrol.json, drained at 03:00:05 when drained.
SINFO = r"""#!/usr/bin/env python3
import json, sys
here = sys.argv[0]
count = 1 + sum(1 for _ in open(here + ".log")) if __import__("os").path.exists(here + ".log") else 1
with open(here + ".log", "a") as log:
    log.write(json.dumps(sys.argv[1:]) + "\n")
others = json.load(open(here + ".json"))
me = json.load(open(here.replace("sinfo", "scontrol") + ".json"))
rows = [o["row"] for o in others if o.get("from_call", 1) <= count]
drained = "DRAIN" in me["state"]
rows.append(["gpu02", "drained" if drained else "idle", "2026-11-25T03:00:05" if drained else "Unknown",
             me["reason"] or "none"])
for row in sorted(rows):
    print("|".join(row))
"""

# logger: records each call's arguments.
LOGGER = r"""#!/usr/bin/env python3
import json, sys
with open(sys.argv[0] + ".log", "a") as log:
    log.write(json.dumps(sys.argv[1:]) + "\n")
"""

TOKEN = "eyJhbGciOiJSUzI1NiJ9.gpu02-service-account-token.c2lnbmF0dXJl"  # the stand-in's; never printed


# --- a stand-in for the API server ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Pki:
    """A CA and a certificate it signed for 127.0.0.1, as PEM files."""

    ca: Path
    cert: Path
    key: Path


def _pki(folder: Path) -> Pki:
    folder.mkdir()
    now = datetime.datetime.now(datetime.UTC)

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"kubernetes-{folder.name}")])
    server_key = ec.generate_private_key(ec.SECP256R1())

    def certificate(subject: x509.Name, key: ec.EllipticCurvePrivateKey, ca: bool) -> bytes:
        """Signed by the CA, with the extensions kubeadm gives its certificates (Python's strict checks want them)."""
        usage = dict.fromkeys(
            ("content_commitment", "data_encipherment", "key_agreement", "encipher_only", "decipher_only"), False
        )
        builder = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(ca_name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(digital_signature=True, key_encipherment=not ca, key_cert_sign=ca, crl_sign=ca, **usage),
                critical=True,
            )
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        )
        if not ca:
            names = [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
            builder = builder.add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        return builder.sign(ca_key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM)

    server_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver")])
    (folder / "ca.crt").write_bytes(certificate(ca_name, ca_key, True))
    (folder / "apiserver.crt").write_bytes(certificate(server_name, server_key, False))
    key = server_key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    (folder / "apiserver.key").write_bytes(key)
    return Pki(folder / "ca.crt", folder / "apiserver.crt", folder / "apiserver.key")


def _merge(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: objects merge, null deletes, anything else (lists too) replaces."""
    if not isinstance(patch, dict):
        return patch
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = _merge(out.get(key), value)
    return out


GROUP_LABEL = "gpuinfra.io/node-group"


def peer(name: str, since: str = "", group: str = "gpu") -> dict[str, Any]:
    """Another node of the group as a list shows it: tainted by its health check since `since`, or (empty) not."""
    taints = [{"key": "gpuinfra.io/gpu-unhealthy", "value": "xid-79", "effect": "NoSchedule"}] if since else []
    annotations = {"gpuinfra.io/gpu-unhealthy-since": since} if since else {}
    return {"metadata": {"name": name, "labels": {GROUP_LABEL: group}, "annotations": annotations},
            "spec": {"taints": taints}}  # fmt: skip


@dataclass
class ApiServer:
    """One Node, served over HTTPS to the holder of TOKEN, which may get and patch only that node, and list nodes."""

    node_name: str
    pki: Pki
    node: dict[str, Any] = field(default_factory=dict)
    requests: list[dict[str, Any]] = field(default_factory=list)
    # Changes someone else makes to the node just before the next PATCHes are applied (a race).
    interleaved: list[dict[str, Any]] = field(default_factory=list)
    # The other nodes each list shows, one entry per list in turn (the last one from then on): the group changing
    # between the program's two counts is nodes failing together.
    peers: list[list[dict[str, Any]]] = field(default_factory=list)
    url: str = ""

    def set_node(self, taints: list[dict[str, str]], annotations: dict[str, str] | None = None) -> None:
        self.node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": self.node_name,
                "resourceVersion": "1000",
                "annotations": annotations or {"node.alpha.kubernetes.io/ttl": "0"},
                "labels": {"kubernetes.io/hostname": self.node_name, GROUP_LABEL: "gpu"},
            },
            "spec": {"podCIDR": "10.244.2.0/24", "taints": taints},
        }

    def _list(self, query: dict[str, list[str]]) -> dict[str, Any]:
        """The nodes whose label equals the selector's (`key=value`, the only form the program sends)."""
        key, _, value = query["labelSelector"][0].partition("=")
        peers = (self.peers.pop(0) if len(self.peers) > 1 else self.peers[0]) if self.peers else []
        items = [n for n in [self.node, *peers] if n["metadata"]["labels"].get(key) == value]
        return {"kind": "NodeList", "apiVersion": "v1", "metadata": {"resourceVersion": "2000"}, "items": items}

    def _bump(self) -> None:
        self.node["metadata"]["resourceVersion"] = str(int(self.node["metadata"]["resourceVersion"]) + 1)

    def handle(self, method: str, path: str, headers: dict[str, str], body: bytes) -> tuple[int, dict[str, Any]]:
        self.requests.append(
            {
                "method": method,
                "path": path,
                "authorization": headers.get("Authorization"),
                "content_type": headers.get("Content-Type"),
                "accept": headers.get("Accept"),
                "body": json.loads(body) if body else None,
            }
        )
        if headers.get("Authorization") != f"Bearer {TOKEN}":
            return 401, _status(401, "Unauthorized", "Unauthorized")
        user = f"system:serviceaccount:gpuinfra-system:gpuinfra-health-{self.node_name}"
        if method == "GET" and path.startswith("/api/v1/nodes?"):
            return 200, self._list(urllib.parse.parse_qs(urllib.parse.urlsplit(path).query))
        name = path.removeprefix("/api/v1/nodes/")
        verb = {"GET": "get", "PATCH": "patch"}.get(method, method.lower())
        if not path.startswith("/api/v1/nodes/") or name != self.node_name or verb not in ("get", "patch"):
            message = f'nodes "{name}" is forbidden: User "{user}" cannot {verb} resource "nodes" in API group ""'
            return 403, _status(403, "Forbidden", message + " at the cluster scope")
        if method == "GET":
            return 200, self.node
        if headers.get("Content-Type") != "application/merge-patch+json":
            return 415, _status(415, "UnsupportedMediaType", "the body of the request was in an unknown format")
        patch = json.loads(body)
        if self.interleaved:
            self.node = _merge(self.node, self.interleaved.pop(0))
            self._bump()
        wanted = patch.get("metadata", {}).get("resourceVersion")
        if wanted is not None and wanted != self.node["metadata"]["resourceVersion"]:
            message = (
                f'Operation cannot be fulfilled on nodes "{name}": the object has been modified; please apply '
                "your changes to the latest version and try again"
            )
            return 409, _status(409, "Conflict", message)
        self.node = _merge(self.node, patch)
        self._bump()
        return 200, self.node


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message, "reason": reason,
            "code": code}  # fmt: skip


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> tuple[Pki, Pki]:
    """The cluster's CA, and another one the API server's certificate is not signed by."""
    folder = tmp_path_factory.mktemp("pki")
    return _pki(folder / "cluster"), _pki(folder / "other")


@pytest.fixture
def api(pki: tuple[Pki, Pki]) -> Iterator[ApiServer]:
    server_state = ApiServer("gpu02", pki[0])
    server_state.set_node([])

    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            code, document = server_state.handle(self.command, self.path, dict(self.headers), body)
            data = json.dumps(document).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_PATCH = do_POST = do_PUT = do_DELETE = _answer

        def log_message(self, *args: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(pki[0].cert, pki[0].key)
    httpd.socket = tls.wrap_socket(httpd.socket, server_side=True)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    server_state.url = f"https://127.0.0.1:{httpd.server_address[1]}"
    yield server_state
    httpd.shutdown()
    httpd.server_close()


@dataclass
class Node:
    """One GPU node's files: settings, state, kernel log, the tools on PATH, and the library."""

    root: Path

    @property
    def kern_log(self) -> Path:
        return self.root / "kern.log"

    def gpus(self, state: str) -> None:
        """Answer nvidia-smi with a sandbox state, at the pinned driver as the stand-in answers on a node with it
        installed; append its kernel messages, as the fault would print them."""
        answer = self.root / f"{state}.xml"
        answer.write_text(
            re.sub(r"<driver_version>[^<]*<", f"<driver_version>{PIN}<", (GPUS / f"{state}.xml").read_text())
        )
        (self.root / "bin" / "nvidia-smi").write_text(f"#!/bin/sh\nexec cat {shlex.quote(str(answer))}\n")
        (self.root / "bin" / "nvidia-smi").chmod(0o755)
        messages = GPUS / f"{state}.kern.log"
        if messages.exists():
            with self.kern_log.open("a") as log:
                log.writelines(f"2026-11-25T03:00:00+0000 gpu02 kernel: {line}" for line in messages.open())

    def config(self, **changes: Any) -> None:
        settings: dict[str, Any] = {
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
            "kubeconfig": str(self.root / "health-kubeconfig"),
            "node_group": "gpu",
            "policy": {
                "expected_count": 2,
                "expected_model": "L4",
                "expected_pci_ids": ["0x27B8"],
                "fabric_manager": False,
                "driver_version": PIN,
                "max_temperature_c": 85,
                "max_uncorrectable_ecc": 0,
                "allowed_xids": [],
                "xid_classes": {},
                "xid_repeat_jobs": 3,
                "xid_repeat_window": 3600,
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

    def kubeconfig(self, server: str, ca: Path, token: str = TOKEN, user: str = "gpuinfra-health-gpu02") -> None:
        """The kubeconfig k8s_node_health writes: JSON, the server and its CA from the admin kubeconfig, the token."""
        kubeconfig = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "kubernetes",
                    "cluster": {
                        "server": server,
                        "certificate-authority-data": base64.b64encode(ca.read_bytes()).decode(),
                    },
                }
            ],
            "users": [{"name": user, "user": {"token": token}}],
            "contexts": [{"name": "gpuinfra-health", "context": {"cluster": "kubernetes", "user": user}}],
            "current-context": "gpuinfra-health",
        }
        (self.root / "health-kubeconfig").write_text(json.dumps(kubeconfig))

    def slurm(self, state: str = "IDLE", reason: str = "") -> None:
        (self.root / "bin" / "scontrol.json").write_text(json.dumps({"state": state, "reason": reason}))

    def reserve(self, *names: str) -> None:
        """The Slurm reservations `scontrol show reservation` finds (only these)."""
        state = self.root / "bin" / "scontrol.json"
        state.write_text(json.dumps({**json.loads(state.read_text()), "reservations": list(names)}))

    def job(self, pid: int, job: str, user: str) -> None:
        """Make slurmd answer `scontrol pidinfo PID` with this job, of this user."""
        state = self.root / "bin" / "scontrol.json"
        node: dict[str, Any] = json.loads(state.read_text())
        node.setdefault("jobs", {})[str(pid)] = [job, user]
        state.write_text(json.dumps(node))

    def xid(
        self, xid: int, pid: int | None, name: str = "sleep", bus: str = "18", text: str = "Graphics Exception"
    ) -> None:
        """Append an XID line as the driver prints it for the GPU at bus `bus` (GPU 0 at 18, GPU 1 at 2a)."""
        who = f"pid={pid}, name={name}" if pid else "pid='<unknown>', name=<unknown>"
        with self.kern_log.open("a") as log:
            log.write(f"2026-11-25T03:01:00+0000 gpu02 kernel: NVRM: Xid (PCI:0000:{bus}:00): {xid}, {who}, {text}\n")

    def logged(self) -> list[str]:
        """What the program sent to the system log (logger's message arguments)."""
        return [call[-1] for call in self.calls("logger")]

    @property
    def slurm_node(self) -> dict[str, str]:
        node: dict[str, str] = json.loads((self.root / "bin" / "scontrol.json").read_text())
        return node

    def calls(self, tool: str) -> list[list[str]]:
        log = self.root / "bin" / f"{tool}.log"
        return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []

    def start(self, *args: str) -> subprocess.CompletedProcess[str]:
        """Run the program as Slurm would; the library comes from plugins/module_utils."""
        command = node_program(self.root, PROGRAM, LIBRARY, name="gpuinfra-health")
        command += ["--config", str(self.root / "health.json"), "--state", str(self.root / "state" / "s.json")]
        env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}  # the API server is local
        env["PATH"] = f"{self.root / 'bin'}{os.pathsep}{os.environ['PATH']}"
        return subprocess.run([*command, *args], capture_output=True, text=True, env=env, timeout=60)

    def run(self, *args: str) -> tuple[int, dict[str, Any]]:
        """Run it with --json: its exit code and verdict."""
        done = self.start("--json", *args)
        assert done.returncode in (0, 1, 3, 4), done.stderr
        verdict: dict[str, Any] = json.loads(done.stdout)
        return done.returncode, verdict


@pytest.fixture
def node(tmp_path: Path) -> Node:
    (tmp_path / "bin").mkdir()
    node_program(tmp_path, PROGRAM, LIBRARY)  # its library, for the tests that import the program
    (tmp_path / "bin" / "scontrol").write_text(SCONTROL)
    (tmp_path / "bin" / "scontrol").chmod(0o755)
    (tmp_path / "bin" / "sinfo").write_text(SINFO)
    (tmp_path / "bin" / "sinfo").chmod(0o755)
    (tmp_path / "bin" / "sinfo.json").write_text("[]")
    (tmp_path / "bin" / "logger").write_text(LOGGER)  # the system log, recorded (and this machine's left alone)
    (tmp_path / "bin" / "logger").chmod(0o755)
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


def test_the_last_active_checks_fail_the_node_until_checks_pass_again(node: Node) -> None:
    """A scheduled check that failed (gpuinfra-active-checks keeps its result) drains the node with the check's
    reason, through the breaker like any problem; a run that could not judge is unknown; the next pass resumes the
    node. Ignored while the cluster names no active check."""
    result = node.root / "active-checks.json"
    failed = {"verdict": "fail", "finished": 1.0, "checks": [],
              "reason": "gpuinfra admission: dcgm diag -r 2 failed: Memory on GPU 1: bad row"}  # fmt: skip
    result.write_text(json.dumps(failed))
    node.config(active={"checks": []}, active_result=str(result))
    assert node.run()[1]["healthy"] is True
    node.config(active={"checks": ["dcgm_diag"]}, active_result=str(result))
    code, verdict = node.run()
    assert (code, verdict["problems"]) == (
        1,
        ["node: active checks failed: dcgm diag -r 2 failed: Memory on GPU 1: bad row"],
    )
    reason = "gpuinfra-health: node: active checks failed: dcgm diag -r 2 failed: Memory on GPU 1: bad row"
    assert node.slurm_node == {"state": "IDLE+DRAIN", "reason": reason}
    result.write_text(
        json.dumps({**failed, "verdict": "unknown", "reason": "gpuinfra admission: dcgmi is not installed"})
    )
    code, verdict = node.run()
    assert (code, verdict["verdict"], verdict["unknown"]) == (
        3, "unknown", ["active checks could not judge the node: dcgmi is not installed"])  # fmt: skip
    result.write_text(json.dumps({**failed, "verdict": "pass", "reason": "gpuinfra admission: passed dcgm diag"}))
    code, verdict = node.run()
    assert (code, verdict["healthy"], verdict["action"]) == (0, True, "resumed")


def test_a_node_under_admission_is_not_judged_by_its_last_active_checks(node: Node) -> None:
    """The admission gate resumes a node into its reservation before the check job starts there: the last result,
    a failure the gate is about to replace, drains nothing meanwhile (it did, and the gate then refused a node whose
    checks passed as `drained meanwhile`). Once the reservation is gone, the result counts again."""
    result = node.root / "active-checks.json"
    failed = {"verdict": "fail", "finished": 1.0, "checks": [], "reason": "gpuinfra admission: nccl below its floor"}
    result.write_text(json.dumps(failed))
    node.config(active={"checks": ["nccl"]}, active_result=str(result))
    node.reserve("gpuinfra-admission-gpu02")
    code, verdict = node.run()
    assert (code, verdict["healthy"], verdict["action"]) == (0, True, "nothing to do")
    assert ["show", "reservation", "gpuinfra-admission-gpu02"] in node.calls("scontrol")
    node.reserve("gpuinfra-admission-gpu01")  # another node's admission is not this one's
    code, verdict = node.run()
    assert (code, verdict["problems"]) == (1, ["node: active checks failed: nccl below its floor"])


def test_a_check_that_cannot_look_drains_nothing_until_its_limit(node: Node) -> None:
    """Its kernel log moved away (a log rotated across the fleet): the verdict is unknown, shown to the node
    exporter, and the node stays in service; past `unknown_limit` it drains with a reason that says so, and the
    log back, the program resumes it."""
    metrics = node.root / "node-exporter" / "gpuinfra_health.prom"
    metrics.parent.mkdir()
    node.config(unknown_limit=600, textfile=str(metrics))
    assert node.run()[0] == 0
    assert 'gpuinfra_health_verdict{verdict="healthy"} 1' in metrics.read_text().splitlines()

    node.kern_log.rename(node.root / "kern.log.1")
    code, verdict = node.run()
    assert (code, verdict["verdict"], verdict["healthy"], verdict["problems"]) == (3, "unknown", False, [])
    assert verdict["unknown"] == [
        f"cannot read the kernel log, XIDs are unchecked ({node.kern_log}: No such file or directory)"
    ]
    assert verdict["action"] == "no action: a check could not look, and is retried at the next check"
    assert [c for c in node.calls("scontrol") if c[0] == "update"] == [] and node.slurm_node["state"] == "IDLE"
    lines = metrics.read_text().splitlines()
    assert {'gpuinfra_health_verdict{verdict="unknown"} 1', 'gpuinfra_health_verdict{verdict="healthy"} 0'} <= set(
        lines
    ), lines
    state_file = node.root / "state" / "s.json"
    state = json.loads(state_file.read_text())
    since = next(line for line in lines if line.startswith("gpuinfra_health_unknown_since"))
    assert float(since.split()[1]) == state["unknown_since"]
    assert node.run()[0] == 3  # retried, still inside the limit: the clock is not restarted
    assert json.loads(state_file.read_text())["unknown_since"] == state["unknown_since"]

    state["unknown_since"] -= 601  # unknown for longer than the limit
    state_file.write_text(json.dumps(state))
    code, verdict = node.run()
    assert code == 1 and node.slurm_node == {
        "state": "IDLE+DRAIN",
        "reason": "gpuinfra-health: unknown for 10m: cannot read the kernel log, XIDs are unchecked "
        f"({node.kern_log}: No such file or directory)"[:117]
        + "...",
    }, node.slurm_node

    (node.root / "kern.log.1").rename(node.kern_log)
    code, verdict = node.run()
    assert (code, verdict["verdict"], verdict["action"]) == (0, "healthy", "resumed")
    assert json.loads(state_file.read_text())["unknown_since"] is None


XID79_REASON = "gpuinfra-health: xid 79 on GPU 1: reboot"


def partition(node: Node, *others: tuple[str, str, str, str], from_call: int = 1) -> None:
    """The other nodes of partition gpu, as sinfo lists them (name, state, reason time, reason)."""
    (node.root / "bin" / "sinfo.json").write_text(
        json.dumps([{"row": list(o), "from_call": from_call} for o in others])
    )


@pytest.mark.parametrize(
    ("limit", "nodes", "expected"), [("10%", 2, 1), ("10%", 35, 3), ("50%", 4, 2), ("3", 100, 3), (2, 1, 2)]
)
def test_the_drain_limit_is_a_count_or_a_share_never_below_one(
    program: Any, limit: Any, nodes: int, expected: int
) -> None:
    assert program.drain_limit(limit, nodes) == expected


def test_the_breaker_spares_a_node_once_its_partition_holds_the_limit(node: Node) -> None:
    """gpu01 is drained by its health check; with a limit of 25% of 4 nodes, gpu02's failure leaves it in service,
    says why, and shows it to the node exporter; a limit of 2 lets it drain."""
    metrics = node.root / "node-exporter" / "gpuinfra_health.prom"
    metrics.parent.mkdir()
    node.config(max_drained="25%", textfile=str(metrics))
    partition(
        node,
        ("gpu01", "drained", "2026-11-25T02:00:00", XID79_REASON),
        ("gpu03", "drained", "2026-11-25T02:10:00", "disk replacement, ticket 4711"),  # an admin's: not counted
        ("gpu04", "idle", "Unknown", "none"),
    )
    node.run()
    node.gpus("xid79")
    code, verdict = node.run()
    assert code == 4 and verdict["action"] == (
        "spared by the breaker: health checks hold 1 of the 4 nodes of partition gpu drained (limit 1)"
    ), verdict["action"]
    assert node.slurm_node["state"] == "IDLE" and [c for c in node.calls("scontrol") if c[0] == "update"] == []
    assert "gpuinfra_health_spared 1" in metrics.read_text().splitlines()

    node.config(max_drained=2, textfile=str(metrics))
    code, verdict = node.run()
    assert (code, node.slurm_node) == (1, {"state": "IDLE+DRAIN", "reason": XID79_REASON}), verdict["action"]
    assert "gpuinfra_health_spared 0" in metrics.read_text().splitlines()
    # gpuinfra's own partition of every GPU node (the admission gate's) is no team's: it has no limit of its own.
    assert {c[2] for c in node.calls("sinfo")} == {"--partition=gpu"}


def test_nodes_that_fail_together_keep_only_the_limit_drained(node: Node) -> None:
    """gpu01 failed at the same moment: before the drain slurmctld showed it in service, after it drained earlier
    than gpu02. gpu02 is past the limit of 1, so it gives way: resumed, spared."""
    node.config(max_drained=1)
    node.run()
    partition(node, ("gpu01", "drained", "2026-11-25T03:00:04", XID79_REASON), from_call=2)
    node.gpus("xid79")
    code, verdict = node.run()
    assert code == 4 and verdict["action"] == (
        "spared by the breaker: 2 nodes of partition gpu were drained at once (limit 1)"
    ), verdict["action"]
    updates = [c[2:] for c in node.calls("scontrol") if c[0] == "update"]
    assert updates == [["State=DRAIN", f"Reason={XID79_REASON}"], ["State=RESUME"]]
    assert node.slurm_node["state"] == "IDLE"


def test_the_first_of_nodes_that_fail_together_keeps_its_drain(node: Node) -> None:
    node.config(max_drained=1)
    node.run()
    partition(node, ("gpu03", "drained", "2026-11-25T03:00:05", XID79_REASON), from_call=2)  # same second: by name
    node.gpus("xid79")
    assert node.run()[0] == 1 and node.slurm_node == {"state": "IDLE+DRAIN", "reason": XID79_REASON}


def test_observe_mode_reports_what_it_would_do_and_does_nothing(node: Node) -> None:
    node.config(mode="observe")
    node.run()  # healthy first: the program learns which GPU sits at which PCI address
    node.gpus("xid79")
    code, verdict = node.run()
    assert (code, verdict["action"]) == (1, f"observe mode: would drain: {XID79_REASON}")
    assert [c for c in node.calls("scontrol") if c[0] == "update"] == [] and node.slurm_node["state"] == "IDLE"


def test_a_problem_found_outweighs_what_could_not_be_seen(node: Node) -> None:
    node.gpus("xid79")  # a GPU off the bus: nvidia-smi lists one of two
    node.kern_log.unlink()
    code, verdict = node.run()
    assert (code, verdict["verdict"]) == (1, "unhealthy")
    assert verdict["unknown"] and node.slurm_node["state"] == "IDLE+DRAIN"


def test_a_gpu_off_the_bus_drains_the_node_until_it_is_repaired(node: Node) -> None:
    node.run()  # a healthy check first: the program learns which GPU sits at which PCI address
    node.gpus("xid79")
    code, verdict = node.run()
    assert code == 1
    assert node.slurm_node == {"state": "IDLE+DRAIN", "reason": "gpuinfra-health: xid 79 on GPU 1: reboot"}
    assert verdict["reason"] == "gpuinfra-health: xid 79 on GPU 1: reboot"
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


# nvidia-smi on a hung GPU: it ignores SIGTERM, and a process it started outside its process group (so that
# `timeout`'s SIGKILL misses it) keeps its output open past slurmd's 60 s, as a process stuck in the kernel would.
HUNG_SMI = """#!/bin/sh
trap '' TERM
setsid sleep 75 &
sleep 75
"""


def test_a_hung_nvidia_smi_drains_the_node_before_slurmd_would_kill_the_program(node: Node) -> None:
    """Node.start gives the program slurmd's 60 s: it must end within them, and drain with a reason that says why."""
    node.config(timeout=2)  # `timeout -k 10 2 nvidia-smi`: SIGTERM at 2 s, ignored; SIGKILL at 12 s
    (node.root / "bin" / "nvidia-smi").write_text(HUNG_SMI)
    code, verdict = node.run()
    assert code == 1 and node.slurm_node["state"] == "IDLE+DRAIN", verdict
    assert "nvidia-smi did not answer in time: a GPU or the driver is hung" in node.slurm_node["reason"], verdict


def test_clearing_xids_forgives_those_no_check_has_read_yet(node: Node) -> None:
    """The operator repairs the node and clears its XIDs before the next check has read the last one: what was logged
    before the clear is forgiven too, and an XID logged after it still counts."""
    node.run()
    node.gpus("xid79")
    node.run()
    node.gpus("healthy")
    node.xid(79, 4242, "train.py", text="GPU has fallen off the bus.")  # logged after that check
    code, verdict = node.run("--clear-xids")
    assert (code, verdict["action"]) == (0, "resumed"), verdict
    assert node.slurm_node == {"state": "IDLE", "reason": ""}
    node.xid(79, 4243, "train.py", text="GPU has fallen off the bus.")
    assert node.run()[0] == 1 and node.slurm_node["state"] == "IDLE+DRAIN"


def test_xids_cleared_while_a_check_runs_stay_cleared(node: Node) -> None:
    """An operator's --clear-xids while slurmd's check is still asking nvidia-smi: the check read the state with the
    XID before the clear, and must not write it back after it."""
    node.run()
    node.gpus("xid79")
    node.run()  # XID 79 is sticky now
    node.gpus("healthy")
    smi = node.root / "bin" / "nvidia-smi"
    slow = node.root / "slow-once"  # the first check (slurmd's) takes 3 s, the operator's not
    smi.write_text(smi.read_text().replace("exec cat", f"[ -e {slow} ] || {{ touch {slow}; sleep 3; }}; exec cat"))
    check = threading.Thread(target=node.run)
    check.start()
    time.sleep(1)
    cleared = node.start("--clear-xids", "--no-action")
    check.join()
    assert cleared.returncode in (0, 1), cleared.stderr
    assert json.loads((node.root / "state" / "s.json").read_text())["sticky"] == []


def test_a_transient_xid_fails_only_the_check_that_saw_it(node: Node) -> None:
    """An XID NVIDIA's catalog does not list is class `node`: it drains until a check passes."""
    node.xid(200, 4242, "train.py", text="an XID of a driver newer than the catalog")
    code, _ = node.run()
    assert code == 1 and node.slurm_node["reason"] == "gpuinfra-health: xid 200 on GPU 0"
    code, verdict = node.run()
    assert (code, verdict["action"]) == (0, "resumed")


def test_a_read_only_check_leaves_a_transient_xid_to_the_check_that_acts(node: Node) -> None:
    """The receipts' probe asks with --read-only at each apply: it sees the XID, and so does slurmd's check after it,
    which drains the node."""
    state = node.root / "state" / "s.json"
    node.run()
    before = state.read_bytes()
    node.xid(200, 1, "a")
    code, verdict = node.run("--read-only")
    assert (code, verdict["action"], state.read_bytes()) == (1, "no action", before)
    assert node.slurm_node["reason"] == ""
    code, _ = node.run()
    assert code == 1 and node.slurm_node["reason"] == "gpuinfra-health: xid 200 on GPU 0"


def test_an_allowed_xid_never_drains(node: Node) -> None:
    node.config(allowed_xids=[200, 13], xid_repeat_jobs=2)
    node.xid(200, 1, "a")
    code, verdict = node.run()
    assert (code, verdict["action"]) == (0, "nothing to do")
    for pid in (2, 3):  # not even from several processes: allowed is never
        node.xid(13, pid, "a")
    code, verdict = node.run()
    assert (code, verdict["action"]) == (0, "nothing to do")


# --- XID classes: the application's faults, and when they are the GPU's after all ----------------------------------


@pytest.fixture
def processes() -> Iterator[Callable[[], int]]:
    """Start a real process (`sleep`, so its name is `sleep`) and give its pid: a job's process, still running when
    the check looks it up."""
    started: list[subprocess.Popen[bytes]] = []

    def start() -> int:
        started.append(subprocess.Popen(["sleep", "300"]))
        return started[-1].pid

    yield start
    for process in started:
        process.kill()
        process.wait()


def test_an_application_xid_leaves_the_node_in_service_and_names_its_job(
    node: Node, processes: Callable[[], int]
) -> None:
    """XID 13 (NVIDIA: RESTART_APP) from a job's process: no drain; the verdict and the system log name the process,
    and the job and user `scontrol pidinfo` finds for it."""
    pid = processes()
    node.job(pid, "4711", "alice")
    node.xid(13, pid)
    code, verdict = node.run()
    assert (code, verdict["healthy"], verdict["action"]) == (0, True, "nothing to do")
    assert [c for c in node.calls("scontrol") if c[0] == "update"] == []
    [report] = verdict["xid_reports"]
    assert {k: report[k] for k in ("xid", "class", "gpu", "pid", "process", "job", "user")} == {
        "xid": 13, "class": "application", "gpu": 0, "pid": pid, "process": "sleep", "job": "4711", "user": "alice"
    }  # fmt: skip
    line = f"XID 13 on GPU 0 (application fault, not drained): pid {pid} (sleep), job 4711, user alice"
    assert node.logged() == [line]
    assert node.calls("logger")[0][:5] == ["--tag", "gpuinfra-health", "--priority", "daemon.warning", "--"]


def test_a_process_gone_or_replaced_is_reported_by_its_pid_and_name(node: Node, processes: Callable[[], int]) -> None:
    """An application usually dies of its fault before the next check: its pid and name, as the driver logged them,
    are all there is. A pid now held by another program is not looked up: it is someone else's."""
    reused = processes()  # `sleep`, where the XID names train.py
    node.job(reused, "4711", "alice")
    node.xid(31, reused, "train.py", text="MMU Fault")
    done = node.start()
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[1:] == [
        f"gpuinfra-health: XID 31 on GPU 0 (application fault, not drained): pid {reused} (train.py)"
    ]
    assert [c[0] for c in node.calls("scontrol")] == ["show"]  # the node's state only: no pidinfo


def test_a_process_name_is_data(node: Node) -> None:
    """What a job names its process reaches the report escaped, never read as anything."""
    node.xid(13, 99999999, "{{ lookup('pipe' 'id') }}$(id)\x1b[2J")
    code, verdict = node.run()
    assert code == 0
    assert verdict["xid_reports"][0]["process"] == "{{ lookup('pipe' 'id') }}$(id)\x1b[2J"
    assert node.logged() == [
        "XID 13 on GPU 0 (application fault, not drained): pid 99999999 "
        + ascii("{{ lookup('pipe' 'id') }}$(id)\x1b[2J").join("()")
    ]


def test_application_xids_from_several_jobs_make_it_the_gpus_fault(node: Node, processes: Callable[[], int]) -> None:
    """3 different jobs' XID 13 on GPU 0 within the hour: the GPU's fault. The node is drained with a reason that says
    why, and stays drained (the GPU is the suspect now) until an operator clears it."""
    pids = [processes() for _ in range(3)]
    for number, pid in enumerate(pids):
        node.job(pid, f"{100 + number}", "alice")
    node.xid(13, pids[0])
    node.xid(13, pids[0])  # the same job twice counts once
    node.xid(13, pids[1], bus="2a")  # another GPU's
    code, _ = node.run()
    assert code == 0
    node.xid(13, pids[1])
    code, _ = node.run()
    assert code == 0 and node.slurm_node["state"] == "IDLE"
    node.xid(13, pids[2])
    code, verdict = node.run()
    reason = "gpuinfra-health: XID 13 from 3 different jobs on GPU 0 within 1h: treated as a GPU fault"
    assert code == 1 and (node.slurm_node["state"], node.slurm_node["reason"]) == ("IDLE+DRAIN", reason)
    assert (
        "GPU 0 (00000000:18:00.0): XID 13 from 3 different jobs within 1h: treated as a GPU fault"
        in verdict["problems"]
    )
    assert node.logged()[-1] == (
        "XID 13 from 3 different jobs on GPU 0 within 1h: treated as a GPU fault (job 100, job 101, job 102)"
    )
    code, verdict = node.run()
    assert (code, verdict["action"]) == (1, "left drained")
    code, verdict = node.run("--clear-xids")
    assert (code, verdict["action"]) == (0, "resumed")


def test_without_jobs_different_processes_count(node: Node) -> None:
    """On a node whose processes are gone (or with no Slurm to ask), the pids the driver logged tell the faults
    apart. XIDs without a process cannot be told apart, and are not counted."""
    node.config(xid_repeat_jobs=2)
    node.xid(31, None)
    node.xid(31, None)
    node.xid(43, 71, "b")  # ignore-class (NVIDIA: IGNORE): reported, never counted
    node.xid(31, 70, "a")
    code, verdict = node.run()
    assert code == 0 and [r["class"] for r in verdict["xid_reports"]] == [
        "application", "application", "ignore", "application"
    ]  # fmt: skip
    node.xid(13, 72, "c")
    code, verdict = node.run()
    assert code == 1
    assert node.slurm_node["reason"] == (
        "gpuinfra-health: XIDs 13, 31 from 2 different processes on GPU 0 within 1h: treated as a GPU fault"
    )


def test_application_faults_older_than_the_window_are_forgotten(node: Node) -> None:
    node.config(xid_repeat_jobs=2, xid_repeat_window=600)
    node.xid(13, 70, "a")
    assert node.run()[0] == 0
    state_file = node.root / "state" / "s.json"
    state = json.loads(state_file.read_text())
    [fault] = state["app_faults"]
    assert (fault["xid"], fault["pci"], fault["pid"]) == (13, "0000:18:00", 70)
    fault["time"] -= 601  # as if the first fault were 10 minutes and a second old
    state_file.write_text(json.dumps(state))
    node.xid(13, 71, "b")
    code, _ = node.run()
    assert code == 0 and node.slurm_node["state"] == "IDLE"
    assert [f["pid"] for f in json.loads(state_file.read_text())["app_faults"]] == [71]  # the state stays small
    node.xid(13, 72, "c")
    assert node.run()[0] == 1


def test_an_application_xid_never_names_a_drain_it_did_not_cause(node: Node) -> None:
    node.xid(13, 70, "a")
    node.gpus("gpu-missing")
    code, _ = node.run()
    assert code == 1 and node.slurm_node["reason"] == "gpuinfra-health: 1 of 2 GPUs visible"


@pytest.mark.parametrize(
    ("xid", "reason"),
    [
        (79, "gpuinfra-health: xid 79 on GPU 0: reboot"),
        (119, "gpuinfra-health: xid 119 on GPU 0: reset the GPU"),
        (54, "gpuinfra-health: xid 54 on GPU 0: hardware fault: repair or replace the GPU"),
    ],
)
def test_each_class_drains_with_what_it_needs(node: Node, xid: int, reason: str) -> None:
    node.xid(xid, None, text="x")
    code, _ = node.run()
    assert code == 1 and node.slurm_node["reason"] == reason


def test_hardware_stays_through_a_reboot_reset_and_reboot_do_not(node: Node) -> None:
    node.xid(48, None, bus="2a", text="DBE")  # reset
    node.xid(54, None, text="power brake")  # hardware (NVIDIA: CHECK_MECHANICALS)
    assert node.run()[0] == 1
    state_file = node.root / "state" / "s.json"
    state = json.loads(state_file.read_text())
    state["boot_id"] = "the boot before"
    state_file.write_text(json.dumps(state))
    node.kern_log.write_text("2026-11-25T04:00:00+0000 gpu02 kernel: Linux version 6.1.0-31-amd64\n")  # this boot's
    code, verdict = node.run()
    assert code == 1
    assert [p.split(" in the kernel log")[0] for p in verdict["problems"]] == [
        "GPU 0 (00000000:18:00.0): XID 54 (hardware fault: repair or replace the GPU)"
    ]
    assert node.run("--clear-xids")[0] == 0


def test_the_sites_classes_override_the_catalog(node: Node) -> None:
    node.config(xid_classes={"13": "node", "79": "ignore"})
    node.xid(79, None, bus="2a", text="GPU has fallen off the bus.")
    node.xid(13, 70, "a")
    code, verdict = node.run()
    assert code == 1 and node.slurm_node["reason"] == "gpuinfra-health: xid 13 on GPU 0"
    assert [(r["xid"], r["class"]) for r in verdict["xid_reports"]] == [(79, "ignore")]


@pytest.mark.parametrize(
    ("classes", "message"),
    [
        (
            {"13": "nodes"},
            "policy.xid_classes[13]: 'nodes' is not a class (application, ignore, node, reset, reboot, hardware)",
        ),
        ({"0x0d": "node"}, "policy.xid_classes: '0x0d' is not an XID number (1 to 999)"),
    ],
)
def test_a_wrong_xid_class_in_the_settings_exits_2(node: Node, classes: dict[str, str], message: str) -> None:
    node.config(xid_classes=classes)
    done = node.start()
    assert (done.returncode, done.stderr.strip()) == (2, f"gpuinfra-health: {message}")


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


@pytest.mark.parametrize(
    ("state", "reason", "action"),
    [
        ("MIXED+DRAIN", "disk replacement, ticket 4711", "left drained by someone else: disk replacement, ticket 4711"),
        ("IDLE+DRAIN", "gpuinfra: driver upgrade to 535.309.01", "left drained by someone else: gpuinfra: driver"),
        ("DOWN", "cable swap", "left down by someone else: cable swap"),
        ("DOWN+DRAIN", "gpuinfra-health: 1 of 2 GPUs visible", "left down by someone else: gpuinfra-health: 1 of"),
        ("IDLE+FAIL", "PSU failing", "left fail by someone else: PSU failing"),
        ("ALLOCATED+FAILING", "PSU failing", "left failing by someone else: PSU failing"),
        ("IDLE+MAINT", "", "left maint by someone else: no reason"),  # Slurm 22.05 (Debian 12)
        ("IDLE+MAINTENANCE+RESERVED", "", "left maintenance by someone else: no reason"),  # 24.11 (Debian 13)
    ],
)
def test_a_state_set_by_another_is_never_resumed_nor_renamed(node: Node, state: str, reason: str, action: str) -> None:
    """An admin's drain, DOWN or FAIL, an upgrade's drain or a maintenance reservation: healthy or broken, the
    program leaves the node's state and reason exactly as they are."""
    node.slurm(state, reason)
    code, verdict = node.run()
    assert code == 0 and verdict["action"].startswith(action), verdict["action"]
    node.gpus("gpu-missing")
    code, verdict = node.run()
    assert code == 1 and verdict["action"].startswith(action), verdict["action"]
    assert node.slurm_node == {"state": state, "reason": reason}
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


def test_kubernetes_taints_then_untaints_only_its_own_key(node: Node, api: ApiServer) -> None:
    """Exactly what reaches the API server: a GET of the node, the list of its node group (the breaker's count),
    one merge patch with every other taint as it was, the reason and the time annotations, and the resourceVersion
    it was computed from, then the group's list again; the node's own token on each request."""
    node.config(scheduler="kubernetes")
    node.kubeconfig(api.url, api.pki.ca)
    other = {"key": "dedicated", "value": "vision", "effect": "NoSchedule"}
    api.set_node([other])
    node.gpus("gpu-missing")
    before = datetime.datetime.now(datetime.UTC)
    code, verdict = node.run()
    assert code == 1
    ours = {"key": "gpuinfra.io/gpu-unhealthy", "value": "1-of-2-GPUs-visible", "effect": "NoSchedule"}
    assert verdict["action"] == "tainted gpuinfra.io/gpu-unhealthy:NoSchedule: gpuinfra-health: 1 of 2 GPUs visible"
    since = api.node["metadata"]["annotations"]["gpuinfra.io/gpu-unhealthy-since"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", since), since
    taken = datetime.datetime.strptime(since, "%Y-%m-%dT%H:%M:%S.%f%z")
    assert before - datetime.timedelta(seconds=1) <= taken <= datetime.datetime.now(datetime.UTC), (before, since)
    headers = {"authorization": f"Bearer {TOKEN}", "accept": "application/json"}
    group = {**headers, "method": "GET", "path": "/api/v1/nodes?labelSelector=gpuinfra.io%2Fnode-group%3Dgpu",
             "content_type": None, "body": None}  # fmt: skip
    assert api.requests == [
        {**headers, "method": "GET", "path": "/api/v1/nodes/gpu02", "content_type": None, "body": None},
        group,
        {
            **headers,
            "method": "PATCH",
            "path": "/api/v1/nodes/gpu02",
            "content_type": "application/merge-patch+json",
            "body": {
                "metadata": {
                    "resourceVersion": "1000",
                    "annotations": {
                        "gpuinfra.io/gpu-unhealthy-reason": "gpuinfra-health: 1 of 2 GPUs visible",
                        "gpuinfra.io/gpu-unhealthy-since": since,
                    },
                },
                "spec": {"taints": [other, ours]},
            },
        },
        group,
    ]
    assert api.node["spec"]["taints"] == [other, ours]
    assert api.node["metadata"]["annotations"] == {
        "node.alpha.kubernetes.io/ttl": "0",
        "gpuinfra.io/gpu-unhealthy-reason": "gpuinfra-health: 1 of 2 GPUs visible",
        "gpuinfra.io/gpu-unhealthy-since": since,
    }

    # Still broken: the taint stays, and nothing is written.
    api.requests.clear()
    code, verdict = node.run()
    assert (code, verdict["action"]) == (1, "left tainted")
    assert [r["method"] for r in api.requests] == ["GET"]

    # Healthy again: only its own taint and annotation go (null deletes an annotation in a merge patch).
    api.requests.clear()
    node.gpus("healthy")
    code, verdict = node.run()
    assert (code, verdict["action"]) == (0, "removed the taint gpuinfra.io/gpu-unhealthy")
    assert [r["body"] for r in api.requests] == [
        None,
        {
            "metadata": {
                "resourceVersion": "1001",
                "annotations": {"gpuinfra.io/gpu-unhealthy-reason": None, "gpuinfra.io/gpu-unhealthy-since": None},
            },
            "spec": {"taints": [other]},
        },
    ]
    assert api.node["spec"]["taints"] == [other]
    assert api.node["metadata"]["annotations"] == {"node.alpha.kubernetes.io/ttl": "0"}

    api.requests.clear()
    code, verdict = node.run()
    assert (code, verdict["action"]) == (0, "nothing to do")
    assert [r["method"] for r in api.requests] == ["GET"]


def test_kubernetes_a_node_changed_in_between_is_read_again_and_nothing_is_lost(node: Node, api: ApiServer) -> None:
    """Another client adds a taint between the program's read and its patch: the API server refuses the stale patch
    (409), and the program reads the node again, keeping that taint."""
    node.config(scheduler="kubernetes")
    node.kubeconfig(api.url, api.pki.ca)
    cordon = {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}
    api.interleaved.append({"spec": {"taints": [cordon]}})
    node.gpus("gpu-missing")
    code, _ = node.run()
    assert code == 1
    listed = ("GET", "/api/v1/nodes?labelSelector=gpuinfra.io%2Fnode-group%3Dgpu", None)
    assert [(r["method"], r["path"], (r["body"] or {}).get("metadata", {}).get("resourceVersion"))
            for r in api.requests] == [
        ("GET", "/api/v1/nodes/gpu02", None), listed, ("PATCH", "/api/v1/nodes/gpu02", "1000"),
        ("GET", "/api/v1/nodes/gpu02", None), listed, ("PATCH", "/api/v1/nodes/gpu02", "1001"), listed,
    ]  # fmt: skip
    assert api.node["spec"]["taints"] == [
        cordon,
        {"key": "gpuinfra.io/gpu-unhealthy", "value": "1-of-2-GPUs-visible", "effect": "NoSchedule"},
    ]


def test_kubernetes_breaker_spares_a_node_past_its_groups_limit(node: Node, api: ApiServer) -> None:
    """gpu01 of gpu02's node group tainted by its health check, a limit of 1: gpu02's fault is spared (exit 4) and
    nothing is written. A node of another group does not count; with a limit of 50% of four nodes, it is tainted."""
    node.config(scheduler="kubernetes", max_drained=1)
    node.kubeconfig(api.url, api.pki.ca)
    api.peers = [[peer("gpu01", "2026-12-07T10:00:00.000Z"), peer("gpu09", "2026-12-07T10:00:00.000Z", "infer")]]
    node.gpus("gpu-missing")
    code, verdict = node.run()
    spared = "spared by the breaker: health checks hold 1 of the 2 nodes of node group gpu tainted (limit 1)"
    assert (code, verdict["action"]) == (4, spared)
    assert [r["method"] for r in api.requests] == ["GET", "GET"]
    assert api.node["spec"]["taints"] == []

    node.config(scheduler="kubernetes", max_drained="50%")
    api.peers = [[peer("gpu01", "2026-12-07T10:00:00.000Z"), peer("gpu03"), peer("gpu04")]]
    code, verdict = node.run()
    assert (code, verdict["action"]) == (1, "tainted gpuinfra.io/gpu-unhealthy:NoSchedule: gpuinfra-health: 1 of 2 "
                                            "GPUs visible")  # fmt: skip


@pytest.mark.parametrize(
    ("other_since", "kept"), [("2026-12-07T10:00:00.000Z", False), ("9999-12-31T00:00:00.000Z", True)]
)
def test_kubernetes_nodes_tainted_at_once_the_later_gives_way(
    node: Node, api: ApiServer, other_since: str, kept: bool
) -> None:
    """gpu01 and gpu02 fail together, each seeing the other untainted before its patch, with a limit of 1: the one
    tainted later takes its taint and annotations off again and is spared; the first keeps its taint."""
    node.config(scheduler="kubernetes", max_drained=1)
    node.kubeconfig(api.url, api.pki.ca)
    api.peers = [[peer("gpu01")], [peer("gpu01", other_since)]]
    node.gpus("gpu-missing")
    code, verdict = node.run()
    ours = [t["key"] for t in api.node["spec"]["taints"]]
    annotations = set(api.node["metadata"]["annotations"])
    if kept:
        assert (code, ours) == (1, ["gpuinfra.io/gpu-unhealthy"]), verdict["action"]
        assert "gpuinfra.io/gpu-unhealthy-since" in annotations
    else:
        spared = "spared by the breaker: 2 nodes of node group gpu were tainted at once (limit 1)"
        assert (code, verdict["action"], ours) == (4, spared, [])
        assert annotations == {"node.alpha.kubernetes.io/ttl"}
        assert [r["method"] for r in api.requests] == ["GET", "GET", "PATCH", "GET", "GET", "PATCH"]


def test_kubernetes_settings_without_a_node_group_are_refused(node: Node, api: ApiServer) -> None:
    """Without its group the breaker could count nothing: the program stops (exit 2) before it taints."""
    node.config(scheduler="kubernetes", node_group="")
    node.kubeconfig(api.url, api.pki.ca)
    node.gpus("gpu-missing")
    done = node.start()
    assert done.returncode == 2, done.stderr
    assert "no node_group" in done.stderr
    assert api.node["spec"]["taints"] == []


def test_kubernetes_another_node_is_forbidden_and_the_token_never_printed(node: Node, api: ApiServer) -> None:
    """The API server's refusal is the program's error (exit 2), word for word; the token appears nowhere."""
    node.config(scheduler="kubernetes", node_name="gpu03")
    node.kubeconfig(api.url, api.pki.ca)
    done = node.start()
    assert done.returncode == 2
    assert done.stderr.strip() == (
        'gpuinfra-health: GET /api/v1/nodes/gpu03: HTTP 403: nodes "gpu03" is forbidden: User '
        '"system:serviceaccount:gpuinfra-system:gpuinfra-health-gpu02" cannot get resource "nodes" in API group "" '
        "at the cluster scope"
    )
    assert TOKEN not in done.stdout + done.stderr
    node.kubeconfig(api.url, api.pki.ca, token="not-the-token")
    done = node.start()
    assert done.returncode == 2 and "HTTP 401: Unauthorized" in done.stderr


def test_kubernetes_a_server_the_ca_did_not_sign_never_sees_the_token(
    node: Node, api: ApiServer, pki: tuple[Pki, Pki]
) -> None:
    node.config(scheduler="kubernetes")
    node.kubeconfig(api.url, pki[1].ca)
    done = node.start()
    assert done.returncode == 2 and "CERTIFICATE_VERIFY_FAILED" in done.stderr, done.stderr
    assert api.requests == []


@pytest.mark.parametrize(
    ("kubeconfig", "message"),
    [
        ("apiVersion: v1\nkind: Config\n", "is not JSON; gpuinfra writes it as JSON (YAML is not read)"),
        (
            json.dumps(
                {
                    "clusters": [{"name": "c", "cluster": {"server": "http://127.0.0.1:8080"}}],
                    "users": [{"name": "u", "user": {"token": TOKEN}}],
                    "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                }
            ),
            "the server must be https://, the token is never sent in the clear",
        ),
        (
            json.dumps(
                {
                    "clusters": [{"name": "c", "cluster": {"server": "https://k", "insecure-skip-tls-verify": True}}],
                    "users": [{"name": "u", "user": {"token": TOKEN}}],
                    "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                }
            ),
            "insecure-skip-tls-verify is refused",
        ),
        (json.dumps({"clusters": [], "contexts": []}), "no context None"),
    ],
)
def test_kubernetes_an_unsafe_or_unreadable_kubeconfig_exits_2(node: Node, kubeconfig: str, message: str) -> None:
    node.config(scheduler="kubernetes")
    (node.root / "health-kubeconfig").write_text(kubeconfig)
    done = node.start()
    assert done.returncode == 2 and message in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_the_kernel_log_is_read_from_where_the_last_check_stopped(node: Node) -> None:
    node.run()
    size = node.kern_log.stat().st_size
    state = json.loads((node.root / "state" / "s.json").read_text())
    assert state["cursor"] == f"{size}:{node.kern_log.stat().st_ino}"
    # A rotated log (renamed away, a new file in its place) is read from its start.
    node.kern_log.rename(node.kern_log.with_suffix(".log.1"))
    node.kern_log.write_text("2026-11-25T04:00:00+0000 gpu02 kernel: NVRM: Xid (PCI:0000:2a:00): 48, pid=1, name=a\n")
    code, _ = node.run()
    assert code == 1 and node.slurm_node["reason"] == "gpuinfra-health: xid 48 on GPU 1: reset the GPU"


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


@pytest.mark.parametrize("ca_from", ["admin kubeconfig", "token Secret"])
def test_the_kubeconfig_k8s_node_health_writes_takes_the_node_out_of_scheduling(
    node: Node, api: ApiServer, ca_from: str
) -> None:
    """The role's kubeconfig template, rendered as Ansible renders it from what its tasks read (the admin
    kubeconfig's server and CA, else the CA in the token Secret, and the token), is one the program works with."""
    role = ROOT / "roles" / "k8s_node_health"
    variables: dict[str, Any] = {
        name: trust_as_template(value) if isinstance(value, str) else value
        for name, value in YAML(typ="safe").load((role / "vars" / "main.yml").read_text()).items()
    }
    ca = base64.b64encode(api.pki.ca.read_bytes()).decode()
    variables.update(
        k8s_node_health_node_name="gpu02",
        __k8s_node_health_api={"server": api.url, "ca": ca if ca_from == "admin kubeconfig" else ""},
        __k8s_node_health_secret={
            "resources": [
                {"data": {"token": base64.b64encode(TOKEN.encode()).decode(), "ca.crt": ca, "namespace": "Z3B1"}}
            ]
        },
    )
    source = (role / "templates" / "kubeconfig.json.j2").read_text()
    text = Templar(loader=DataLoader(), variables=variables).template(trust_as_template(source))
    (node.root / "health-kubeconfig").write_text(str(text))
    kubeconfig = json.loads(str(text))
    assert kubeconfig["users"] == [{"name": "gpuinfra-health-gpu02", "user": {"token": TOKEN}}]

    node.config(scheduler="kubernetes")
    node.gpus("gpu-missing")
    code, verdict = node.run()
    assert code == 1 and verdict["action"].startswith("tainted gpuinfra.io/gpu-unhealthy:NoSchedule")
    assert {r["authorization"] for r in api.requests} == {f"Bearer {TOKEN}"}


# --- modinfo and dkms answers kept between checks ---------------------------------------------------------------

# modinfo and `dkms status` each unpack the compressed nvidia module: seconds of CPU on every check of every node.
COUNTED_MODINFO = f"""#!/bin/sh
echo "$@" >> "$0.calls"
[ -e "$0.fails" ] && exit 1
echo {PIN}
"""


def _modinfo_calls(node: Node) -> int:
    calls = node.root / "bin" / "modinfo.calls"
    return len(calls.read_text().splitlines()) if calls.exists() else 0


def test_modinfo_is_asked_again_only_when_what_it_reads_changed(node: Node) -> None:
    modinfo = node.root / "bin" / "modinfo"
    modinfo.write_text(COUNTED_MODINFO)
    modinfo.chmod(0o755)
    node.config(check_kernel_module=True)
    for _ in range(3):
        node.run()
    assert _modinfo_calls(node) == 1
    state = json.loads((node.root / "state" / "s.json").read_text())
    assert [answer[1] for answer in state["module_cache"]["answers"].values()] == [f"{PIN}\n"]

    os.utime(modinfo, ns=(0, 0))  # a new modinfo (kmod upgraded) is asked again
    node.run()
    assert _modinfo_calls(node) == 2

    (node.root / "bin" / "modinfo.fails").touch()
    os.utime(modinfo, ns=(1, 1))
    node.run()
    node.run()  # a failed answer is never kept
    assert _modinfo_calls(node) == 4


@pytest.fixture
def program(probe: Any) -> Any:
    """The program itself, imported with its library (node_probe's fixture puts it on the path)."""
    spec = importlib.util.spec_from_file_location("gpuinfra_health_under_test", PROGRAM)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def probe(node: Node) -> Iterator[Any]:
    """node_probe.py imported as the program imports it (its library folder first on the path)."""
    sys.path.insert(0, str(node.root / "lib"))
    try:
        yield importlib.import_module("gpuinfra_node.node_probe")
    finally:
        sys.path.remove(str(node.root / "lib"))
        for name in [n for n in sys.modules if n.startswith("gpuinfra_node")]:
            del sys.modules[name]


def test_the_module_files_digest_follows_dkms_the_kernels_and_the_tools(node: Node, probe: Any) -> None:
    dkms_tree, modules = node.root / "var-lib-dkms", node.root / "lib-modules"
    built = dkms_tree / "nvidia-current" / PIN / "6.1.0-31-amd64" / "x86_64" / "module"
    built.mkdir(parents=True)
    (modules / "6.1.0-31-amd64" / "updates" / "dkms").mkdir(parents=True)
    options = probe.ProbeOptions(module_trees=[str(dkms_tree)], modules_dir=str(modules))
    tools = [str(node.root / "bin" / "scontrol"), None]

    def digest(kernels: tuple[str, ...] = ("6.1.0-31-amd64",)) -> str:
        result: str = probe.module_files_digest(list(kernels), tools, options)
        return result

    before = digest()
    assert digest() == before
    changes: list[Callable[[], object]] = [
        lambda: (built / "nvidia-current.ko.xz").write_bytes(b"built"),  # DKMS built it
        lambda: (modules / "6.1.0-31-amd64" / "updates" / "dkms" / "nvidia-current.ko.xz").write_bytes(b"built"),
        lambda: os.utime(node.root / "bin" / "scontrol", ns=(0, 0)),  # the tool was upgraded
    ]
    for change in changes:
        change()
        assert digest() != before
        before = digest()
    assert digest(("6.1.0-31-amd64", "6.1.0-32-amd64")) != before  # a kernel was installed


def test_a_kept_answer_is_dropped_when_the_digest_changes(probe: Any) -> None:
    asked: list[list[str]] = []

    def run(argv: Any) -> tuple[int, str, str]:
        asked.append(list(argv))
        return (0, "answer", "") if argv[0] == "dkms" else (1, "", "failed")

    cache: dict[str, Any] = {}
    for digest in ("a", "a", "b"):
        remembered = probe.remembered(run, cache, digest)
        assert remembered(["dkms", "status"]) == (0, "answer", "")
        assert remembered(["modinfo", "nvidia"]) == (1, "", "failed")
    dkms, modinfo = ["dkms", "status"], ["modinfo", "nvidia"]
    assert asked == [dkms, modinfo, modinfo, dkms, modinfo]  # digest a, a again (modinfo failed), b


# --- DKMS while the package manager runs ------------------------------------------------------------------------

KERNELS = ["6.1.0-31-amd64", "6.12.95+deb12-amd64"]


@contextlib.contextmanager
def _held(lock: Path, how: str = "w LOCK_EX") -> Iterator[int]:
    """Another process holding `lock` as dpkg does (opened for writing, an fcntl write lock), or as `how` says,
    until the block ends; yields its PID."""
    mode, kind = how.split()
    holder = subprocess.Popen(
        [sys.executable, "-c", f"import fcntl, sys; f = open(sys.argv[1], {mode!r}); fcntl.lockf(f, fcntl.{kind}); "
         "print('held', flush=True); sys.stdin.read()", str(lock)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        yield holder.pid
    finally:
        holder.communicate("")


def test_dkms_is_not_judged_while_the_package_manager_runs(probe: Any, tmp_path: Path) -> None:
    """unattended-upgrades installing a kernel holds dpkg's lock while DKMS builds the module for it (minutes): the
    health program keeps its last DKMS judgement until the lock is free, so a build in progress drains no node and
    a node drained for a missing module is not resumed on the way."""
    lock = tmp_path / "lock-frontend"
    lock.touch(mode=0o640)  # dpkg's: only root may open it for writing
    answer = {"status": ""}

    def run(argv: Any) -> tuple[int, str, str]:
        return 0, answer["status"], ""

    def which(name: str) -> str:
        return name

    def judge(kept: dict[str, Any] | None) -> list[str]:
        locks = [str(tmp_path / "absent"), str(lock)]
        options = probe.ProbeOptions(dkms_kernels=KERNELS, dkms_verdict=kept, package_locks=locks)
        return list(probe.dkms_state(run, which, PIN, options)[2])

    installed = "".join(f"nvidia-current/{PIN}, {k}, x86_64: installed\n" for k in KERNELS)
    answer["status"] = installed
    kept: dict[str, Any] = {}
    assert judge(kept) == [] and kept == {"kernels": KERNELS, "problems": [], "unknown": []}

    answer["status"] = installed.splitlines(keepends=True)[0]  # the new kernel's module is still being built
    with _held(lock) as pid:
        assert judge(kept) == []
        assert kept["deferred"].startswith(f"DKMS not judged while the package manager runs (PID {pid} holds {lock})")
        assert judge(None) == [f"DKMS: no nvidia module {PIN} for kernel {KERNELS[1]}"]  # the upgrade's gate judges
    assert judge(kept) == [f"DKMS: no nvidia module {PIN} for kernel {KERNELS[1]}"]  # the build failed
    assert "deferred" not in kept

    answer["status"] = installed  # a drained node is not resumed while packages change, only once judged again
    with _held(lock):
        assert judge(kept) == [f"DKMS: no nvidia module {PIN} for kernel {KERNELS[1]}"]
    assert judge(kept) == []


MISSING = f"DKMS: no nvidia module {PIN} for kernel {KERNELS[1]}"
MINUTE = 60.0


@dataclass
class Dkms:
    """dkms_state as the program calls it, with a clock the test sets and a lock file of its own."""

    probe: Any
    lock: Path
    built: bool = True
    now: float = 1_764_000_000.0
    kept: dict[str, Any] = field(default_factory=dict)

    def judge(self) -> list[str]:
        """The problems found."""
        return self.judged()[0]

    def judged(self) -> tuple[list[str], list[str]]:
        """The problems found, and what could not be judged."""
        kernels = KERNELS if self.built else KERNELS[:1]
        status = "".join(f"nvidia-current/{PIN}, {k}, x86_64: installed\n" for k in kernels)
        options = self.probe.ProbeOptions(
            dkms_kernels=KERNELS, dkms_verdict=self.kept, package_locks=[str(self.lock)], clock=lambda: self.now
        )
        _, _, problems, unknown = self.probe.dkms_state(lambda argv: (0, status, ""), lambda name: name, PIN, options)
        return list(problems), list(unknown)


@pytest.fixture
def dkms(probe: Any, tmp_path: Path) -> Dkms:
    lock = tmp_path / ".rpm.lock"
    lock.touch(mode=0o644)  # rpm's: any user may read it, only root write it
    checker = Dkms(probe, lock)
    assert checker.judge() == []  # judged healthy while no package manager ran
    checker.built = False  # a kernel is being installed; DKMS has not built its module yet
    return checker


def test_a_held_lock_defers_the_dkms_judgement_until_the_limit(dkms: Dkms) -> None:
    start = dkms.now
    with _held(dkms.lock) as pid:
        for minutes in (0, 10, 29.9):
            dkms.now = start + minutes * MINUTE
            assert dkms.judge() == [], minutes  # the last judgement stands
        assert dkms.kept["lock_since"] == start
        assert dkms.kept["deferred"] == (
            f"DKMS not judged while the package manager runs (PID {pid} holds {dkms.lock}): the last judgement "
            "stands for up to 30 min"
        )


def test_a_lock_held_past_the_limit_leaves_what_dkms_lacks_unknown(dkms: Dkms) -> None:
    """An apt left at its prompt, or a hung dpkg, holds the lock for good: past the limit DKMS is judged again, and
    a missing module is unknown (it may still be building), never a problem that drains by itself."""
    start = dkms.now
    with _held(dkms.lock) as pid:
        dkms.judge()
        for minutes in (30, 31, 24 * 60):
            dkms.now = start + minutes * MINUTE
            held = f"(the package manager has held its lock for {minutes} min: PID {pid} holds {dkms.lock})"
            assert dkms.judged() == ([], [f"{MISSING} {held}"]), minutes
        assert dkms.kept["deferred"] == (
            f"DKMS judged: the package manager has held its lock for {24 * 60} min (PID {pid} holds {dkms.lock}), "
            "longer than the 30 min a deferral may last"
        )
        dkms.built = True  # the build finished after all: healthy again, the lock still held
        assert dkms.judged() == ([], [])


def test_the_deferral_starts_again_once_the_lock_was_free(dkms: Dkms) -> None:
    start = dkms.now
    with _held(dkms.lock):
        dkms.judge()
        dkms.now = start + 40 * MINUTE
        assert dkms.judged()[1][0].startswith(MISSING)  # past the limit: unknown
    dkms.built = True
    dkms.now = start + 41 * MINUTE
    assert dkms.judge() == [] and dkms.kept == {"kernels": KERNELS, "problems": [], "unknown": []}  # no lock left
    dkms.built = False
    with _held(dkms.lock):  # the next package run gets the whole limit again
        dkms.now = start + 42 * MINUTE
        assert dkms.judge() == []
        dkms.now = start + 71 * MINUTE
        assert dkms.judge() == []
        assert dkms.kept["lock_since"] == start + 42 * MINUTE


def test_a_first_check_under_a_held_lock_judges_dkms(probe: Any, tmp_path: Path) -> None:
    """With no judgement kept (a new node, a lost state file), there is nothing to stand: a held lock cannot pass a
    node whose DKMS was never judged."""
    lock = tmp_path / "lock"
    lock.touch(mode=0o644)
    checker = Dkms(probe, lock, built=False)
    with _held(lock) as pid:
        assert checker.judge() == [MISSING]
        assert checker.kept["deferred"] == (
            f"DKMS judged although the package manager runs (PID {pid} holds {lock}): no judgement to keep"
        )
        assert checker.judge() == [MISSING]  # from now on it is deferred: the judgement it keeps is a real one


@pytest.mark.parametrize(
    ("how", "mode", "counts"),
    [
        ("w LOCK_EX", 0o644, True),  # dpkg's and rpm's own lock: a write lock, by root
        ("r LOCK_SH", 0o644, False),  # a read lock: any user may take one on rpm's 0644 lock file
        ("w LOCK_EX", 0o666, False),  # a write lock on a file any user may open for writing
    ],
)
def test_only_a_write_lock_only_root_could_take_defers(
    probe: Any, tmp_path: Path, how: str, mode: int, counts: bool
) -> None:
    lock = tmp_path / ".rpm.lock"
    lock.touch()
    lock.chmod(mode)
    with _held(lock, how) as pid:
        assert probe.lock_holder([str(lock)]) == (f"PID {pid} holds {lock}" if counts else None)
    assert probe.lock_holder([str(lock)]) is None


def test_each_kind_of_run_is_counted_so_a_stopped_loop_is_seen(node: Node, monkeypatch: pytest.MonkeyPatch) -> None:
    """The state counts the periodic checks apart from the prolog's before a job (SLURM_JOB_ID set) and an admin's
    --no-action: a health loop that stopped running shows as a count that no longer grows."""
    node.run()
    node.run()
    node.run("--no-action")
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    node.run()
    runs = json.loads((node.root / "state" / "s.json").read_text())["runs"]
    assert {kind: run["count"] for kind, run in runs.items()} == {"periodic": 2, "manual": 1, "job_start": 1}
    assert runs["periodic"]["last"] <= runs["job_start"]["last"] <= time.time()


def test_the_breakers_pool_on_kubernetes_is_the_label_apply_gives(program: Any) -> None:
    """The program counts the nodes labelled with its node group: the label k8s_tenants puts on every GPU worker of
    the group, and the group the program's settings name, from the same inventory."""
    from test_kubernetes_support import loaded, rendered

    from gpuinfra.k8s_resources import NODE_GROUP_LABEL
    from gpuinfra.render.vars import kubernetes as k8s_vars

    assert program.NODE_GROUP_LABEL == NODE_GROUP_LABEL == GROUP_LABEL
    resolved = loaded("k8s-mig").resolved
    for pool in k8s_vars.group_vars(resolved)["k8s_tenants_nodes"]:
        groups = {resolved.hosts[name].group for name in pool["nodes"]}
        assert groups == {pool["labels"][GROUP_LABEL]}, pool
    settings = json.loads(rendered("k8s-mig")["gpu-health/health.json"].content)
    first = min(h.name for h in resolved.with_role("k8s_gpu_worker"))
    assert (settings["scheduler"], settings["node_group"]) == ("kubernetes", resolved.hosts[first].group)
