#!/usr/bin/python3
"""gpuinfra-health: check this GPU node, and take it out of scheduling while it is broken.

Slurm runs it as HealthCheckProgram; on Kubernetes a systemd timer runs it. It reads the node with the same code as
the gpu_health Ansible module (node_probe and nvidia_smi, installed beside it), then:
- unhealthy: drains the node in Slurm, or taints it NoSchedule in Kubernetes, with a reason that starts with
  REASON_PREFIX;
- healthy: resumes the node, or removes the taint, only when the drain or taint is its own (the reason carries the
  prefix). A node an admin or an upgrade drained stays drained.

XIDs count from the last check on (a journal cursor, or a file offset, kept in the state file). One that needs a
GPU reset or a reboot (STICKY_XIDS) keeps the node unhealthy until the node reboots or an operator who repaired
it runs `gpuinfra-health --clear-xids`; any other XID that the policy does not allow fails the check that saw it.

Exit codes: 0 healthy (or nothing to check), 1 unhealthy, 2 it could not run (bad configuration, state).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import fcntl
import json
import os
import re
import shutil
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Sequence
from typing import Any

LIBRARY = "/usr/local/lib/gpuinfra"
CONFIG = "/etc/gpuinfra/health.json"
STATE = "/var/lib/gpuinfra-health/state.json"
BOOT_ID = "/proc/sys/kernel/random/boot_id"
REASON_PREFIX = "gpuinfra-health:"
TAINT_KEY = "gpuinfra.io/gpu-unhealthy"
REASON_ANNOTATION = "gpuinfra.io/gpu-unhealthy-reason"
# XIDs after which the GPU needs a reset or the node a reboot (NVIDIA's XID catalog): ECC double-bit and
# uncontained errors, row remapping, NVLink, fallen off the bus, GSP and recovery-action errors.
STICKY_XIDS = frozenset({48, 61, 62, 63, 64, 74, 79, 94, 95, 119, 120, 140, 154})
SYSTEM_PATH = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")
# Slurm's drain flags, and the states in which a node is out of service by someone else's hand (an admin's DOWN or
# FAIL, a maintenance reservation, a reboot in progress): the program never changes those.
DRAIN_FLAGS = frozenset({"DRAIN", "DRAINED", "DRAINING"})
HELD_STATES = frozenset({"DOWN", "FAIL", "FAILING", "MAINT", "REBOOT_ISSUED", "REBOOT_REQUESTED"})
# Slurm's limit on a reason is generous; a short one stays readable in sinfo -R.
REASON_LENGTH = 120

sys.path.insert(0, LIBRARY)
from gpuinfra_node.node_probe import (  # noqa: E402
    PACKAGE_LOCK_LIMIT,
    KernelLog,
    ProbeOptions,
    inspect,
    read_journal,
    read_log_file,
)
from gpuinfra_node.smi_report import pci_key  # noqa: E402
from gpuinfra_node.verdict import Policy  # noqa: E402
from gpuinfra_node.xid_log import XidEvent, parse_xid_log  # noqa: E402


class Failure(Exception):
    """The program cannot do its job (configuration, state, a scheduler command): exit 2 with this message."""


# slurmd kills a HealthCheckProgram still running after 60 s, and a killed program drains nothing: each command
# gets at most this long, which leaves the program time to drain after one command hung (nvidia-smi's own limit,
# `timeout` in health.json, is shorter still).
COMMAND_BUDGET = 45
# How long a command killed for running over its budget is waited for: one stuck in the kernel (nvidia-smi on a
# hung GPU) ignores SIGKILL, and is left behind rather than waited for.
KILL_GRACE = 2


def run(argv: Sequence[str], timeout: float = COMMAND_BUDGET) -> tuple[int, str, str]:
    """A command's exit code, output and errors. Its output goes to files, not pipes: a killed command's children
    that keep running (or a process the kernel will not let die) can never keep this program waiting for an end of
    file."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        try:
            process = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=out, stderr=err)
        except OSError as exc:
            return 127, "", f"{argv[0]}: {exc.strerror or exc}"
        try:
            code = process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            try:
                process.wait(timeout=KILL_GRACE)
            except subprocess.TimeoutExpired:
                return 124, "", f"{argv[0]} did not finish in {timeout:.0f} s and is stuck: SIGKILL did not end it"
            return 124, "", f"{argv[0]} did not finish in {timeout:.0f} s"
        out.seek(0)
        err.seek(0)
        return code, out.read().decode(errors="replace"), err.read().decode(errors="replace")


def load_json(path: str, default: Any = None) -> Any:
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except FileNotFoundError:
        if default is not None:
            return default
        raise Failure(f"{path} does not exist") from None
    except (OSError, ValueError) as exc:
        raise Failure(f"{path}: {exc}") from None


def save_json(path: str, data: Any) -> None:
    """Replace the file atomically, so a crash never leaves half a state behind."""
    folder = os.path.dirname(path)
    os.makedirs(folder, mode=0o700, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=folder, prefix=".state-")
    with os.fdopen(handle, "w", encoding="utf-8") as out:
        json.dump(data, out, indent=1, sort_keys=True)
    os.replace(temporary, path)


# How long a run waits for the one holding the state: a check ends within COMMAND_BUDGET and a few quick commands.
LOCK_WAIT = 50


@contextlib.contextmanager
def state_lock(path: str) -> Iterator[None]:
    """One run at a time reads, checks and writes the state: slurmd, the timer, an upgrade's health gate and an
    operator's `--clear-xids` may start the program together, and a check that read the state before the XIDs were
    cleared would write them back."""
    folder = os.path.dirname(path) or "."
    os.makedirs(folder, mode=0o700, exist_ok=True)
    with open(f"{path}.lock", "a", encoding="utf-8") as handle:
        deadline = time.monotonic() + LOCK_WAIT
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise Failure(f"another run has held {path}.lock for over {LOCK_WAIT} s") from None
                time.sleep(0.2)
        yield


def boot_id() -> str:
    try:
        with open(BOOT_ID, encoding="ascii") as handle:
            return handle.read().strip()
    except OSError:
        return ""


def read_kernel_log(config: dict[str, Any], cursor: str) -> KernelLog:
    source = config.get("kernel_log", "journal")
    if source == "journal":
        return read_journal(run, shutil.which, cursor)
    return read_log_file(source, cursor)


def xid_label(event: dict[str, Any], gpu_index: dict[str, int]) -> str:
    """`xid 79 on GPU 1`: by the index nvidia-smi gave the GPU at this or an earlier check, since a GPU that fell
    off the bus is no longer listed; else by its PCI address."""
    index = gpu_index.get(event["pci"])
    return f"xid {event['xid']} on GPU {index}" if index is not None else f"xid {event['xid']} on PCI {event['pci']}"


def drain_reason(verdict: dict[str, Any], xids: Sequence[dict[str, Any]], gpu_index: dict[str, int]) -> str:
    """The reason a scheduler shows: the prefix and the most telling problem, XIDs first."""
    if xids:
        what = xid_label(xids[0], gpu_index)
    elif verdict["gpus"] and verdict.get("expected_count") and verdict["gpu_count"] != verdict["expected_count"]:
        what = f"{verdict['gpu_count']} of {verdict['expected_count']} GPUs visible"
    else:
        what = next(iter(verdict["problems"]), "unhealthy")
    text = " ".join(f"{REASON_PREFIX} {what}".split())
    return text if len(text) <= REASON_LENGTH else text[: REASON_LENGTH - 3] + "..."


# --- Slurm ------------------------------------------------------------------------------------------------------


def slurm_node(name: str) -> tuple[set[str], str]:
    """The node's state flags (IDLE, DRAIN, ...) and its reason, from `scontrol show node`."""
    rc, out, err = run(["scontrol", "show", "node", name, "--oneliner"])
    if rc != 0:
        raise Failure(f"scontrol show node {name}: {err.strip() or f'exit code {rc}'}")
    state = re.search(r"(?:^|\s)State=(\S+)", out)
    reason = re.search(r"(?:^|\s)Reason=(.*?)(?:\s+\[[^\]]*\])?\s*$", out.strip())
    flags = set(re.split(r"[+*~#!%$@^-]+", state.group(1).upper())) - {""} if state else set()
    return flags, reason.group(1) if reason else ""


def slurm_act(name: str, healthy: bool, reason: str) -> str:
    """Drain an unhealthy node, resume a healthy one the program drained itself; leave every other state alone.

    A node that is DOWN or FAIL, or drained with a reason the program did not write (an admin's, an upgrade's), is
    someone else's to put back: the program neither renames its reason nor resumes it, healthy or not."""
    flags, current = slurm_node(name)
    ours = current.startswith(REASON_PREFIX)
    drained = bool(flags & DRAIN_FLAGS)
    held = sorted(flags & HELD_STATES)
    if held or (drained and not ours):
        what = "/".join(held).lower() or "drained"
        return f"left {what} by someone else: {current or 'no reason'}"
    if not healthy:
        if drained:
            return "left drained"
        command = ["scontrol", "update", f"NodeName={name}", "State=DRAIN", f"Reason={reason}"]
        action = f"drained: {reason}"
    elif drained:
        command = ["scontrol", "update", f"NodeName={name}", "State=RESUME"]
        action = "resumed"
    else:
        return "nothing to do"
    rc, _, err = run(command)
    if rc != 0:
        raise Failure(f"{' '.join(command[:3])}: {err.strip() or f'exit code {rc}'}")
    return action


# --- Kubernetes -------------------------------------------------------------------------------------------------
# The API server is called directly (no kubectl on the node), as the node's own service account: gpuinfra gives each
# GPU node one that may only get and patch that node (the k8s_node_health role), and a kubeconfig in JSON with the
# server, its CA and the token. The kubelet's own credentials cannot do this: NodeRestriction forbids a kubelet to
# change its node's taints.

API_TIMEOUT = 30
# A node changed by someone else between the read and the patch (HTTP 409) is read and patched again.
CONFLICT_RETRIES = 3
MERGE_PATCH = "application/merge-patch+json"


class ApiError(Failure):
    """The API server answered with an HTTP error."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """Never follow a redirect: urllib would send the bearer token on to wherever it points."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


class KubeApi:
    """The API server a kubeconfig names, with its CA and its user's token (or client certificate)."""

    def __init__(self, path: str) -> None:
        try:
            with open(path, encoding="utf-8") as handle:
                text = handle.read()
        except OSError as exc:
            raise Failure(f"kubeconfig {path}: {exc.strerror or exc}") from None
        try:
            config = json.loads(text)
        except ValueError:
            raise Failure(f"kubeconfig {path} is not JSON; gpuinfra writes it as JSON (YAML is not read)") from None
        if not isinstance(config, dict):
            raise Failure(f"kubeconfig {path} is not a kubeconfig")
        context = self._named(path, config, "contexts", config.get("current-context"))
        cluster = self._named(path, config, "clusters", context.get("cluster"))
        user = self._named(path, config, "users", context.get("user"))
        self.server = str(cluster.get("server", "")).rstrip("/")
        if not self.server.startswith("https://"):
            raise Failure(f"kubeconfig {path}: the server must be https://, the token is never sent in the clear")
        if cluster.get("insecure-skip-tls-verify"):
            raise Failure(f"kubeconfig {path}: insecure-skip-tls-verify is refused; give the server's CA")
        try:
            if cluster.get("certificate-authority-data"):
                pem = base64.b64decode(cluster["certificate-authority-data"]).decode("ascii")
                tls = ssl.create_default_context(cadata=pem)
            elif cluster.get("certificate-authority"):
                tls = ssl.create_default_context(cafile=cluster["certificate-authority"])
            else:
                tls = ssl.create_default_context()
            if user.get("client-certificate") and user.get("client-key"):
                tls.load_cert_chain(user["client-certificate"], user["client-key"])
        except (OSError, ValueError, ssl.SSLError) as exc:
            raise Failure(f"kubeconfig {path}: cannot read its certificates: {exc}") from None
        self.token = str(user.get("token") or "")
        if not self.token and user.get("tokenFile"):
            try:
                with open(user["tokenFile"], encoding="utf-8") as handle:
                    self.token = handle.read().strip()
            except OSError as exc:
                raise Failure(f"kubeconfig {path}: tokenFile: {exc.strerror or exc}") from None
        if not self.token and not user.get("client-certificate"):
            raise Failure(f"kubeconfig {path}: its user has no token, tokenFile or client-certificate")
        self.opener = urllib.request.build_opener(urllib.request.HTTPSHandler(context=tls), _NoRedirect())

    @staticmethod
    def _named(path: str, config: dict[str, Any], kind: str, name: Any) -> dict[str, Any]:
        """The entry `name` of the list `kind` (the only one when no name is given)."""
        entries = [e for e in config.get(kind) or [] if isinstance(e, dict)]
        if name is None and len(entries) == 1:
            name = entries[0].get("name")
        for entry in entries:
            if entry.get("name") == name:
                value = entry.get(kind[:-1])
                if isinstance(value, dict):
                    return value
        raise Failure(f"kubeconfig {path}: no {kind[:-1]} {name!r}")

    def request(self, method: str, path: str, body: Any = None, content_type: str = "") -> Any:
        request = urllib.request.Request(
            self.server + path,
            data=None if body is None else json.dumps(body).encode(),
            method=method,
            headers={"Accept": "application/json", "User-Agent": "gpuinfra-health"},
        )
        if self.token:
            request.add_header("Authorization", f"Bearer {self.token}")
        if content_type:
            request.add_header("Content-Type", content_type)
        try:
            with self.opener.open(request, timeout=API_TIMEOUT) as response:
                return json.load(response)
        except urllib.error.HTTPError as exc:
            raise ApiError(exc.code, f"{method} {path}: HTTP {exc.code}: {_status_message(exc)}") from None
        except (urllib.error.URLError, OSError, ValueError) as exc:
            why = exc.reason if isinstance(exc, urllib.error.URLError) else exc
            raise Failure(f"{method} {self.server}{path}: {why}") from None


def _status_message(error: urllib.error.HTTPError) -> str:
    """The message of the API server's Status object (`nodes "gpu02" is forbidden: ...`), else the HTTP reason."""
    try:
        status = json.loads(error.read(65536) or b"{}")
    except (OSError, ValueError):
        status = {}
    message = status.get("message") if isinstance(status, dict) else None
    return " ".join(str(message or error.reason).split())[:500]


def taint_value(reason: str) -> str:
    """A taint value is a label value: at most 63 of [A-Za-z0-9_.-]. `xid-79-on-GPU-1`."""
    words = re.sub(r"[^A-Za-z0-9_.-]+", "-", reason[len(REASON_PREFIX) :]).strip("-_.")
    return words[:63].rstrip("-_.") or "unhealthy"


def kubernetes_act(config: dict[str, Any], name: str, healthy: bool, reason: str) -> str:
    """Read the node, then set or remove the taint and the reason annotation in one JSON merge patch. The patch
    carries the resourceVersion it was computed from, so a node another client changed in between is never
    overwritten (409): it is read and patched again. Taints are a list the API server replaces as a whole, so the
    patch holds every other taint as it was read."""
    api = KubeApi(config["kubeconfig"])
    path = "/api/v1/nodes/" + urllib.parse.quote(name, safe="")
    for _ in range(CONFLICT_RETRIES):
        node = api.request("GET", path)
        taints = (node.get("spec") or {}).get("taints") or []
        ours = [t for t in taints if t.get("key") == TAINT_KEY]
        if not healthy:
            if ours:
                return "left tainted"
            taints = [*taints, {"key": TAINT_KEY, "value": taint_value(reason), "effect": "NoSchedule"}]
            annotation: str | None = reason
            action = f"tainted {TAINT_KEY}:NoSchedule: {reason}"
        else:
            if not ours:
                return "nothing to do"
            taints = [t for t in taints if t.get("key") != TAINT_KEY]
            annotation = None  # null removes it
            action = f"removed the taint {TAINT_KEY}"
        patch = {
            "metadata": {
                "resourceVersion": node.get("metadata", {}).get("resourceVersion", ""),
                "annotations": {REASON_ANNOTATION: annotation},
            },
            "spec": {"taints": taints},
        }
        try:
            api.request("PATCH", path, patch, MERGE_PATCH)
        except ApiError as exc:
            if exc.status == 409:
                continue
            raise
        return action
    raise Failure(f"node {name} changed under every one of {CONFLICT_RETRIES} patches; the next check tries again")


# --- the check --------------------------------------------------------------------------------------------------


def policy_of(config: dict[str, Any]) -> Policy:
    policy = config.get("policy", {})
    return Policy(
        expected_count=policy.get("expected_count") or None,
        expected_model=policy.get("expected_model", ""),
        expected_pci_ids=tuple(policy.get("expected_pci_ids", ())),
        fabric_manager=bool(policy.get("fabric_manager", False)),
        driver_version=policy.get("driver_version", ""),
        max_temperature_c=int(policy.get("max_temperature_c", 85)),
        max_uncorrectable_ecc=int(policy.get("max_uncorrectable_ecc", 0)),
        allowed_xids=tuple(policy.get("allowed_xids", ())),
        require_persistence=bool(policy.get("require_persistence", True)),
        check_pcie_link=bool(policy.get("check_pcie_link", True)),
        mig_layouts={str(k): str(v) for k, v in (policy.get("mig_layouts") or {}).items()},
        xid_window="this boot",
    )


def check(config: dict[str, Any], state: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], list[dict[str, Any]]]:
    """Judge the node. Returns the verdict, the new state and the XIDs that failed it."""
    policy = policy_of(config)
    boot = boot_id()
    same_boot = state.get("boot_id") == boot
    log = read_kernel_log(config, state.get("cursor", "") if same_boot else "")
    events: list[XidEvent] = parse_xid_log(log.text) if log.text is not None else []
    new = [e.__dict__ for e in events if e.xid not in policy.allowed_xids]
    sticky = [e for e in (state.get("sticky", []) if same_boot else []) if e["xid"] not in policy.allowed_xids]
    sticky += [e for e in new if e["xid"] in STICKY_XIDS and e not in sticky]
    failing = sticky + [e for e in new if e["xid"] not in STICKY_XIDS]
    dkms_verdict = dict(state.get("dkms_verdict", {}))
    options = ProbeOptions(
        nvidia_smi=config.get("nvidia_smi", "nvidia-smi"),
        timeout=int(config.get("timeout", 30)),
        check_kernel_module=bool(config.get("check_kernel_module", True)),
        check_dkms=bool(config.get("check_dkms", True)),
        dkms_module=config.get("dkms_module") or None,
        module_cache=dict(state.get("module_cache", {})),
        dkms_verdict=dkms_verdict,
        package_lock_limit=max(0, int(config.get("package_lock_limit", PACKAGE_LOCK_LIMIT))),
    )
    verdict = inspect(run, shutil.which, policy, options, [XidEvent(**e) for e in failing])
    if log.text is None:
        verdict["node_problems"].append(f"cannot read the kernel log, XIDs are unchecked ({log.source})")
        verdict["problems"].append(f"node: cannot read the kernel log, XIDs are unchecked ({log.source})")
        verdict["healthy"] = False
    verdict["kernel_log_source"] = log.source
    verdict["dkms_deferred"] = dkms_verdict.get("deferred", "")
    gpu_index = dict(state.get("gpu_index", {}) if same_boot else {})
    gpu_index.update({pci_key(g["pci_bus_id"]) or "": g["index"] for g in verdict["gpus"]})
    new_state = {
        "boot_id": boot,
        "cursor": log.cursor or state.get("cursor", ""),
        "sticky": sticky,
        "gpu_index": gpu_index,
        "module_cache": options.module_cache,
        "dkms_verdict": dkms_verdict,
    }
    return verdict, new_state, failing


def add_system_path() -> None:
    """Slurm runs health checks with an almost empty environment: make sure the system's tool folders (dkms,
    modinfo, scontrol live in sbin) are searched, after whatever PATH the caller gave."""
    folders = [f for f in os.environ.get("PATH", "").split(os.pathsep) if f]
    folders += [f for f in SYSTEM_PATH if f not in folders]
    os.environ["PATH"] = os.pathsep.join(folders)


def run_kind(args: argparse.Namespace) -> str:
    """Who asked: the Slurm prolog before a job (it sets SLURM_JOB_ID), an admin's --no-action, else the periodic
    loop (slurmd's HealthCheckProgram, the Kubernetes timer, apply's check with new settings)."""
    if os.environ.get("SLURM_JOB_ID"):
        return "job_start"
    return "manual" if args.no_action else "periodic"


def counted(runs: Any, kind: str) -> dict[str, Any]:
    """How many checks of each kind this node has run, and when the last began: a loop that stopped is seen."""
    out = {k: dict(v) for k, v in runs.items() if isinstance(v, dict)} if isinstance(runs, dict) else {}
    count = out.get(kind, {}).get("count")
    out[kind] = {"count": (count if isinstance(count, int) else 0) + 1, "last": round(time.time(), 3)}
    return out


def judge_and_act(args: argparse.Namespace) -> tuple[dict[str, Any], str, str]:
    """Read the settings and the state, judge the node, keep the new state, and drain, resume or taint."""
    config = load_json(args.config)
    state = load_json(args.state, default={})
    if args.clear_xids:
        state["sticky"] = []
        save_json(args.state, state)
    if not config.get("gpus"):
        verdict: dict[str, Any] = {"healthy": True, "problems": [], "note": "no GPUs on this node"}
        failing: list[dict[str, Any]] = []
    elif config.get("emulated") and not os.access(config.get("nvidia_smi", ""), os.X_OK):
        verdict = {"healthy": True, "problems": [], "note": "emulated GPUs without a recorded responder"}
        failing = []
    else:
        verdict, new_state, failing = check(config, state)
        new_state["runs"] = counted(state.get("runs"), run_kind(args))
        state = new_state
        if not args.read_only:
            save_json(args.state, state)
    reason = drain_reason(verdict, failing, state.get("gpu_index", {})) if not verdict["healthy"] else ""
    scheduler = "none" if args.no_action or args.read_only else config.get("scheduler", "none")
    name = config.get("node_name") or os.uname().nodename
    if scheduler == "slurm":
        action = slurm_act(name, verdict["healthy"], reason)
    elif scheduler == "kubernetes":
        action = kubernetes_act(config, name, verdict["healthy"], reason)
    else:
        action = "no action"
    return verdict, reason, action


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpuinfra-health", description=__doc__.split("\n")[0])
    parser.add_argument("--config", default=CONFIG, help=f"settings (default {CONFIG})")
    parser.add_argument(
        "--state",
        default=STATE,
        help=f"XID cursor, sticky XIDs, kept module answers and DKMS judgement (default {STATE})",
    )
    parser.add_argument("--no-action", action="store_true", help="only report; never drain, resume or taint")
    # The receipts' probe asks this way at each apply: XIDs it sees stay new for the check that acts on them.
    parser.add_argument(
        "--read-only", action="store_true", help="only report, and keep no state: the next check sees the same XIDs"
    )
    parser.add_argument("--clear-xids", action="store_true", help="forget sticky XIDs (after the GPU was repaired)")
    parser.add_argument("--json", action="store_true", help="print the whole verdict as JSON")
    args = parser.parse_args(argv)
    add_system_path()
    try:
        with state_lock(args.state):
            verdict, reason, action = judge_and_act(args)
    except Failure as exc:
        print(f"gpuinfra-health: {exc}", file=sys.stderr)
        return 2
    verdict.update(reason=reason, action=action)
    if args.json:
        print(json.dumps(verdict, indent=1, sort_keys=True))
    else:
        status = "healthy" if verdict["healthy"] else "unhealthy"
        print(f"gpuinfra-health: {status}; {action}" + "".join(f"\n  {p}" for p in verdict["problems"]))
    return 0 if verdict["healthy"] else 1


if __name__ == "__main__":
    sys.exit(main())
