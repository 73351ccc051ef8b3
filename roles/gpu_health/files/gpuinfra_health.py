#!/usr/bin/python3
"""gpuinfra-health: check this GPU node, and take it out of scheduling while it is broken.

Slurm runs it as HealthCheckProgram; on Kubernetes a systemd timer runs it. It reads the node with the same code as
the gpu_health Ansible module (node_probe and nvidia_smi, installed beside it), then:
- unhealthy: drains the node in Slurm, or taints it NoSchedule in Kubernetes, with a reason that starts with
  HEALTH_REASON_PREFIX;
- healthy: resumes the node, or removes the taint, only when the drain or taint is its own (the reason carries the
  prefix). A node an admin or an upgrade drained stays drained.

XIDs count from the last check on (a journal cursor, or a file offset, kept in the state file), each judged by its
class (NVIDIA's XID catalog, xid_catalog.py, with the site's overrides). An application's fault (class
`application`) or one with nothing to do (`ignore`) never fails the node: it is reported, with the process, and the
Slurm job and user where `scontrol pidinfo` can still tell them. Application faults on one GPU from several jobs
within a window are the GPU's fault, and fail the node as `reset` does. One that needs a GPU reset or a reboot keeps
the node unhealthy until the node reboots or an operator who repaired it runs `gpuinfra-health --clear-xids`
(`hardware` until the operator does, reboots or not); a `node` XID fails the check that saw it.

A check that could not look (a kernel log it cannot read, a tool missing or failing, the package manager's lock
held past its limit) and found nothing wrong answers `unknown`: it drains nothing and resumes nothing, is retried at
the next check and shown to the node exporter (`textfile`); a node still unknown after `unknown_limit` seconds is
drained, with a reason that says so. A hung nvidia-smi is not a blind check: the driver not answering is the
symptom of a GPU it cannot reach, and the node is unhealthy.

Health checks may hold at most `max_drained` nodes of a Slurm partition drained, or of a Kubernetes node group
tainted, at once (a count or a percentage, at least 1), counted from the scheduler's own state (slurmctld's, the API
server's): past it an unhealthy node is spared, left in service and shown to the node exporter
(`gpuinfra_health_spared`). In `observe` mode the program only reports what it would do.

Exit codes: 0 healthy (or nothing to check), 1 unhealthy (or unknown past the limit, drained), 2 it could not run
(bad configuration, state), 3 unknown, 4 unhealthy but spared by the breaker.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import fcntl
import json
import os
import pwd
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
from collections.abc import Callable, Iterator, Sequence
from typing import Any

LIBRARY = "/usr/local/lib/gpuinfra"
CONFIG = "/etc/gpuinfra/health.json"
STATE = "/var/lib/gpuinfra-health/state.json"
BOOT_ID = "/proc/sys/kernel/random/boot_id"
ACTIVE_RESULT_BYTES = 1024 * 1024  # gpuinfra-active-checks' last result: it writes a few KiB
TAINT_KEY = "gpuinfra.io/gpu-unhealthy"
REASON_ANNOTATION = "gpuinfra.io/gpu-unhealthy-reason"
# When the program tainted the node (UTC, to the millisecond): past the breaker's limit the first ones stay out.
SINCE_ANNOTATION = "gpuinfra.io/gpu-unhealthy-since"
# The label the k8s_tenants role gives each Kubernetes GPU worker with its node group: the breaker's pool.
NODE_GROUP_LABEL = "gpuinfra.io/node-group"
SYSTEM_PATH = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")
# Slurm's drain flags, and the states in which a node is out of service by someone else's hand (an admin's DOWN or
# FAIL, a maintenance reservation, a reboot in progress): the program never changes those.
DRAIN_FLAGS = frozenset({"DRAIN", "DRAINED", "DRAINING"})
# A maintenance reservation's node: Slurm 22.05 says MAINT, 24.11 MAINTENANCE.
HELD_STATES = frozenset({"DOWN", "FAIL", "FAILING", "MAINT", "MAINTENANCE", "REBOOT_ISSUED", "REBOOT_REQUESTED"})
# gpuinfra's own partition of every GPU node, for the admission gate's check jobs: no team's, so the breaker counts
# the teams' partitions only (a fleet-wide count would cap small partitions' limits).
CHECKS_PARTITION = "gpuinfra"
# Slurm's limit on a reason is generous; a short one stays readable in sinfo -R.
REASON_LENGTH = 120

sys.path.insert(0, LIBRARY)
from gpuinfra_node import active_checks  # noqa: E402
from gpuinfra_node.breaker import HEALTH_REASON_PREFIX, drain_limit, held_by_health  # noqa: E402
from gpuinfra_node.node_probe import (  # noqa: E402
    PACKAGE_LOCK_LIMIT,
    KernelLog,
    ProbeOptions,
    inspect,
    read_journal,
    read_log_file,
)
from gpuinfra_node.smi_report import pci_key  # noqa: E402
from gpuinfra_node.verdict import (  # noqa: E402
    CLASS_ACTION,
    HEALTHY,
    UNHEALTHY,
    UNKNOWN,
    VERDICTS,
    Policy,
    RepeatedFault,
    repeated_faults,
    xid_class,
)
from gpuinfra_node.xid_catalog import (  # noqa: E402
    APPLICATION,
    CLASSES,
    DRAINING,
    HARDWARE,
    LASTING,
    NODE,
    REBOOT,
    RESET,
    THROUGH_REBOOTS,
    XID_MAX,
)
from gpuinfra_node.xid_log import XidEvent, parse_xid_log  # noqa: E402

# Exit codes the job prolog lets the job start on (only 1 requeues it): an unknown verdict within its limit, and an
# unhealthy node the breaker left in service (a prolog failure would drain it past the limit).
EXIT_UNKNOWN = 3
EXIT_SPARED = 4


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


# The class of a GPU the repetition rule made faulty, among the XIDs' classes.
REPEATED = "repeated"
# Which failing XID names the drain, the most telling first.
RANK = (HARDWARE, REBOOT, RESET, REPEATED, NODE)


def xid_label(failing: dict[str, Any], gpu_index: dict[str, int]) -> str:
    """`xid 79 on GPU 1: reboot`, `XID 13 from 3 different jobs on GPU 1 within 1h: treated as a GPU fault`: by the
    index nvidia-smi gave the GPU at this or an earlier check, since a GPU that fell off the bus is no longer
    listed; else by its PCI address."""
    index = gpu_index.get(failing["pci"])
    where = f" on GPU {index}" if index is not None else f" on PCI {failing['pci']}"
    if failing["class"] == REPEATED:
        text: str = repeated_of(failing).text(where)
        return text
    action = CLASS_ACTION.get(failing["class"])
    return f"xid {failing['xid']}{where}" + (f": {action}" if action else "")


def drain_reason(verdict: dict[str, Any], xids: Sequence[dict[str, Any]], gpu_index: dict[str, int]) -> str:
    """The reason a scheduler shows: the prefix and the most telling problem, XIDs first."""
    if xids:
        what = xid_label(min(xids, key=lambda x: RANK.index(x["class"])), gpu_index)
    elif verdict["gpus"] and verdict.get("expected_count") and verdict["gpu_count"] != verdict["expected_count"]:
        what = f"{verdict['gpu_count']} of {verdict['expected_count']} GPUs visible"
    else:
        what = next(iter(verdict["problems"]), "unhealthy")
    return reason_text(what)


def reason_text(what: str) -> str:
    """The prefix and `what` on one line, cut to REASON_LENGTH."""
    text = " ".join(f"{HEALTH_REASON_PREFIX} {what}".split())
    return text if len(text) <= REASON_LENGTH else text[: REASON_LENGTH - 3] + "..."


# --- Slurm ------------------------------------------------------------------------------------------------------


def slurm_node(name: str) -> tuple[set[str], str, list[str]]:
    """The node's state flags (IDLE, DRAIN, ...), its reason and its partitions but gpuinfra's own, from `scontrol
    show node`."""
    rc, out, err = run(["scontrol", "show", "node", name, "--oneliner"])
    if rc != 0:
        raise Failure(f"scontrol show node {name}: {err.strip() or f'exit code {rc}'}")
    state = re.search(r"(?:^|\s)State=(\S+)", out)
    reason = re.search(r"(?:^|\s)Reason=(.*?)(?:\s+\[[^\]]*\])?\s*$", out.strip())
    partitions = re.search(r"(?:^|\s)Partitions=(\S+)", out)
    flags = set(re.split(r"[+*~#!%$@^-]+", state.group(1).upper())) - {""} if state else set()
    names = partitions.group(1).split(",") if partitions else []
    return flags, reason.group(1) if reason else "", [p for p in names if p != CHECKS_PARTITION]


def slurm_act(name: str, healthy: bool, reason: str, breaker: Breaker | None = None) -> str:
    """Drain an unhealthy node, resume a healthy one the program drained itself; leave every other state alone.

    A node that is DOWN or FAIL, or drained with a reason the program did not write (an admin's, an upgrade's), is
    someone else's to put back: the program neither renames its reason nor resumes it, healthy or not. With a
    `breaker`, a drain that would take more of a partition out than its limit is not made, or is undone (see
    Breaker); the action then starts with SPARED."""
    flags, current, partitions = slurm_node(name)
    ours = current.startswith(HEALTH_REASON_PREFIX)
    drained = bool(flags & DRAIN_FLAGS)
    held = sorted(flags & HELD_STATES)
    if held or (drained and not ours):
        what = "/".join(held).lower() or "drained"
        return f"left {what} by someone else: {current or 'no reason'}"
    if not healthy:
        if drained:
            return "left drained"
        full = breaker.full(name, partitions) if breaker else None
        if full:
            return f"{SPARED}: {full}"
        scontrol_update(name, "State=DRAIN", f"Reason={reason}")
        # Nodes that failed together each saw the others still in service: the ones past the limit give way.
        over = breaker.over(name, partitions) if breaker else None
        if over:
            scontrol_update(name, "State=RESUME")
            return f"{SPARED}: {over}"
        return f"drained: {reason}"
    if drained:
        scontrol_update(name, "State=RESUME")
        return "resumed"
    return "nothing to do"


def scontrol_update(name: str, *settings: str) -> None:
    command = ["scontrol", "update", f"NodeName={name}", *settings]
    rc, _, err = run(command)
    if rc != 0:
        raise Failure(f"{' '.join(command[:3])}: {err.strip() or f'exit code {rc}'}")


# --- The breaker: how many nodes the health loop may hold drained at once -----------------------------------------

# The start of the action of a node the breaker spared: unhealthy, left in service.
SPARED = "spared by the breaker"
# A pool's nodes (a partition's, a node group's): name, whether the health checks hold it out, and since when.
Rows = Callable[[str], list[tuple[str, bool, str]]]


class Breaker:
    """The limit on nodes health checks hold out of service, per pool of nodes, counted from the scheduler's own
    state, so that the nodes need no coordination among themselves: Slurm's partitions and its nodes drained with
    HEALTH_REASON_PREFIX (slurm_rows), or a Kubernetes node group and its nodes with TAINT_KEY (kube_rows). A fault on
    every node at once (a bad driver pin, a log format that changed) takes at most the limit out of each pool; the
    others stay in service, unhealthy, and say so (SPARED)."""

    def __init__(self, max_drained: Any, rows: Rows, pool: str = "partition", held: str = "drained") -> None:
        self.max_drained, self.rows, self.pool, self.held = max_drained, rows, pool, held

    def _pool(self, name: str, pool: str) -> list[tuple[str, bool, str]]:
        """The pool's nodes, this one among them even where the scheduler does not list it in the pool."""
        rows = self.rows(pool)
        return rows if any(node == name for node, _, _ in rows) else [*rows, (name, False, "")]

    def full(self, name: str, pools: Sequence[str]) -> str:
        """Why taking `name` out would pass a pool's limit; empty when it would not."""
        for pool in pools:
            rows = self._pool(name, pool)
            taken = sum(ours for node, ours, _ in rows if node != name)
            limit = drain_limit(self.max_drained, len(rows))
            if taken >= limit:
                held = f"{taken} of the {len(rows)} nodes of {self.pool} {pool}"
                return f"health checks hold {held} {self.held} (limit {limit})"
        return ""

    def over(self, name: str, pools: Sequence[str]) -> str:
        """After `name` was taken out: why it must give way, when more than the limit are out at once and it is not
        among the first (by the time it was taken out, then by name); empty when it may stay out."""
        for pool in pools:
            rows = self._pool(name, pool)
            out = sorted((since, node) for node, ours, since in rows if ours)
            limit = drain_limit(self.max_drained, len(rows))
            if name not in [node for _, node in out[:limit]] and any(node == name for _, node in out):
                return f"{len(out)} nodes of {self.pool} {pool} were {self.held} at once (limit {limit})"
        return ""


def slurm_rows(partition: str) -> list[tuple[str, bool, str]]:
    """Each node of the partition: name, whether a health check holds it drained, and since when (sinfo's time of
    the reason)."""
    fields = "--format=%N|%T|%H|%E"
    rc, out, err = run(["sinfo", "--noheader", "--Node", f"--partition={partition}", fields])
    if rc != 0:
        raise Failure(f"sinfo --partition={partition}: {err.strip() or f'exit code {rc}'}")
    rows = {}
    for line in out.splitlines():
        node, state, since, reason = [*line.split("|", 3), "", "", ""][:4]
        rows[node] = (node, held_by_health(state, reason), since)
    return list(rows.values())


# --- Kubernetes -------------------------------------------------------------------------------------------------
# The API server is called directly (no kubectl on the node), as the node's own service account: gpuinfra gives each
# GPU node one that may only get and patch that node, and list nodes (the k8s_node_health role), and a kubeconfig in
# JSON with the server, its CA and the token. The kubelet's own credentials cannot do this: NodeRestriction forbids a
# kubelet to change its node's taints.

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
    words = re.sub(r"[^A-Za-z0-9_.-]+", "-", reason[len(HEALTH_REASON_PREFIX) :]).strip("-_.")
    return words[:63].rstrip("-_.") or "unhealthy"


def kubernetes_act(config: dict[str, Any], name: str, healthy: bool, reason: str) -> str:
    """Taint an unhealthy node, untaint a healthy one (kube_patch), within the breaker's limit on the node's group
    (`node_group`), counted from the API server's list of the group's nodes: past it, an unhealthy node is left
    untainted (SPARED)."""
    api = KubeApi(config["kubeconfig"])
    if healthy:
        return kube_patch(api, name, None)
    group = config.get("node_group")
    if not isinstance(group, str) or not group:
        raise Failure("the settings name no node_group, the pool the breaker counts tainted nodes in")
    breaker = Breaker(config.get("max_drained", MAX_DRAINED), kube_rows(api), "node group", "tainted")
    action = kube_patch(api, name, reason, lambda: breaker.full(name, [group]))
    # Nodes that failed together each saw the others untainted: the ones past the limit give way.
    over = breaker.over(name, [group]) if action.startswith("tainted") else ""
    if over:
        kube_patch(api, name, None)
        return f"{SPARED}: {over}"
    return action


def kube_patch(api: KubeApi, name: str, reason: str | None, spare: Callable[[], str] = lambda: "") -> str:
    """Set (with a reason) or remove (None) the program's taint and its annotations in one JSON merge patch; the
    action taken. The patch carries the resourceVersion it was computed from, so a node another client changed in
    between is never overwritten (409): it is read and patched again. Taints are a list the API server replaces as
    a whole, so the patch holds every other taint as it was read. Before a taint is added, `spare` says why the node
    must stay untainted (the breaker's limit), if it must."""
    path = "/api/v1/nodes/" + urllib.parse.quote(name, safe="")
    for _ in range(CONFLICT_RETRIES):
        node = api.request("GET", path)
        taints = (node.get("spec") or {}).get("taints") or []
        ours = [t for t in taints if t.get("key") == TAINT_KEY]
        if reason is not None:
            if ours:
                return "left tainted"
            spared = spare()
            if spared:
                return f"{SPARED}: {spared}"
            taints = [*taints, {"key": TAINT_KEY, "value": taint_value(reason), "effect": "NoSchedule"}]
            annotations: dict[str, str | None] = {REASON_ANNOTATION: reason, SINCE_ANNOTATION: utc_now()}
            action = f"tainted {TAINT_KEY}:NoSchedule: {reason}"
        else:
            if not ours:
                return "nothing to do"
            taints = [t for t in taints if t.get("key") != TAINT_KEY]
            annotations = dict.fromkeys((REASON_ANNOTATION, SINCE_ANNOTATION))  # null removes an annotation
            action = f"removed the taint {TAINT_KEY}"
        patch = {
            "metadata": {
                "resourceVersion": node.get("metadata", {}).get("resourceVersion", ""),
                "annotations": annotations,
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


def utc_now() -> str:
    """`2026-12-07T13:05:02.123Z`: one width, so that the breaker orders taints by comparing the strings."""
    now = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now * 1000) % 1000:03d}Z"


def kube_rows(api: KubeApi) -> Rows:
    """The breaker's count on Kubernetes: the nodes labelled with the group (NODE_GROUP_LABEL), whether each carries
    the program's taint, and since when (SINCE_ANNOTATION). The node's identity may list nodes, as its kubelet's
    may: reading them gives it nothing the node did not have."""

    def rows(group: str) -> list[tuple[str, bool, str]]:
        selector = urllib.parse.quote(f"{NODE_GROUP_LABEL}={group}", safe="")
        listed = api.request("GET", f"/api/v1/nodes?labelSelector={selector}")
        items = listed.get("items") if isinstance(listed, dict) else None
        out = []
        for item in items if isinstance(items, list) else []:
            meta = item.get("metadata") or {}
            taints = (item.get("spec") or {}).get("taints") or []
            held = any(isinstance(t, dict) and t.get("key") == TAINT_KEY for t in taints)
            since = (meta.get("annotations") or {}).get(SINCE_ANNOTATION, "")
            out.append((str(meta.get("name", "")), held, str(since)))
        return out

    return rows


# --- the check --------------------------------------------------------------------------------------------------


def xid_classes_of(policy: dict[str, Any]) -> dict[int, str]:
    """The site's XID classes, keys as JSON writes them ("43"); a wrong one is the settings' error, not a guess."""
    out: dict[int, str] = {}
    for key, value in (policy.get("xid_classes") or {}).items():
        text = str(key).strip()
        if not (text.isascii() and text.isdigit() and 1 <= int(text) <= XID_MAX):
            raise Failure(f"policy.xid_classes: {key!r} is not an XID number (1 to {XID_MAX})")
        if value not in CLASSES:
            raise Failure(f"policy.xid_classes[{text}]: {value!r} is not a class ({', '.join(CLASSES)})")
        out[int(text)] = value
    return out


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
        xid_classes=xid_classes_of(policy),
        require_persistence=bool(policy.get("require_persistence", True)),
        check_pcie_link=bool(policy.get("check_pcie_link", True)),
        mig_layouts={str(k): str(v) for k, v in (policy.get("mig_layouts") or {}).items()},
        xid_window="this boot",
    )


# Application faults the repetition rule counts by default: from 3 different jobs on one GPU within an hour.
REPEAT_JOBS = 3
REPEAT_WINDOW = 3600
# Seconds all job lookups of one check may take together: slurmd kills the program at 60 s.
LOOKUP_BUDGET = 5
TASK_COMM_LEN = 15


def repeated_of(entry: dict[str, Any]) -> RepeatedFault:
    return RepeatedFault(pci=entry["pci"], xids=list(entry["xids"]), sources=list(entry["sources"]),
                         window=int(entry["window"]))  # fmt: skip


def _proc(pid: int, name: str) -> str | None:
    """/proc/PID/NAME, or None when the process is gone."""
    try:
        with open(f"/proc/{pid}/{name}", encoding="utf-8", errors="replace") as handle:
            return handle.read()
    except OSError:
        return None


def still_running(event: XidEvent) -> bool:
    """The process that logged the XID runs still, as the same program: a pid reused since is someone else's."""
    if event.pid is None:
        return False
    comm = _proc(event.pid, "comm")
    if comm is None:
        return False
    return not event.process or event.process[:TASK_COMM_LEN] == comm.rstrip("\n")[:TASK_COMM_LEN]


def user_of_process(pid: int) -> str:
    """The user a running process runs as (its real uid), by name where the system knows it."""
    status = _proc(pid, "status") or ""
    match = re.search(r"^Uid:\s+([0-9]+)", status, re.M)
    if not match:
        return ""
    try:
        return pwd.getpwuid(int(match.group(1))).pw_name
    except KeyError:
        return match.group(1)


# `scontrol pidinfo PID`: Slurm 22.05 says "Slurm job id 8 ends at ...", 24.11 "Slurm JobId=8 ends at ...".
PIDINFO_JOB = re.compile(r"Slurm (?:job id |JobId=)([0-9]+)")


def identify(events: Sequence[XidEvent], config: dict[str, Any]) -> None:
    """Fill in the Slurm job and the user of each XID's process while it still runs: `scontrol pidinfo` asks slurmd
    which job a process of this node belongs to. A process already gone (an application usually dies of its fault
    before the next check) keeps only its pid and name, which the driver logged."""
    slurm = config.get("scheduler") == "slurm" and shutil.which("scontrol")
    deadline = time.monotonic() + LOOKUP_BUDGET
    known: dict[int, tuple[str, str]] = {}
    for event in events:
        if event.pid is None or not still_running(event):
            continue
        if event.pid not in known:
            job, user = "", ""
            left = deadline - time.monotonic()
            if slurm and left > 0:
                rc, out, _ = run(["scontrol", "pidinfo", str(event.pid)], timeout=left)
                found = PIDINFO_JOB.search(out) if rc == 0 else None
                job = found.group(1) if found else ""
            left = deadline - time.monotonic()
            if job and left > 0:
                rc, out, _ = run(["scontrol", "show", "job", job, "--oneliner"], timeout=left)
                found = re.search(r"(?:^|\s)UserId=([^\s(]+)", out) if rc == 0 else None
                user = found.group(1) if found else ""
            known[event.pid] = (job, user or user_of_process(event.pid))
        event.job, event.user = known[event.pid]


def check(
    config: dict[str, Any], state: dict[str, Any], now: float | None = None
) -> tuple[dict[str, Any], dict[str, Any], list[dict[str, Any]]]:
    """Judge the node. Returns the verdict, the new state and the XIDs (and repeated faults) that failed it, each
    with its class."""
    now = time.time() if now is None else now
    policy = policy_of(config)
    settings = config.get("policy", {})
    repeat_jobs = int(settings.get("xid_repeat_jobs", REPEAT_JOBS))
    window = int(settings.get("xid_repeat_window", REPEAT_WINDOW))
    boot = boot_id()
    same_boot = state.get("boot_id") == boot
    log = read_kernel_log(config, state.get("cursor", "") if same_boot else "")
    events: list[XidEvent] = parse_xid_log(log.text) if log.text is not None else []
    classed = [(e, xid_class(e, policy)) for e in events]
    identify([e for e, kind in classed if kind not in DRAINING], config)

    def lasts(entry: dict[str, Any]) -> bool:  # under today's policy: an override may have made it harmless
        kind = xid_class(XidEvent(**entry), policy)
        return kind in THROUGH_REBOOTS or (same_boot and kind in LASTING)

    sticky = [e for e in state.get("sticky", []) if lasts(e)]
    sticky += [e.__dict__ for e, kind in classed if kind in LASTING and e.__dict__ not in sticky]
    transient = [e for e, kind in classed if kind not in LASTING]

    # The repetition rule: application faults kept for the window (across reboots: a bad GPU stays bad).
    faults = [f for f in state.get("app_faults", []) if now - window <= float(f.get("time", 0)) <= now]
    for event, kind in classed:
        if kind == APPLICATION:
            faults.append({"xid": event.xid, "pci": event.pci, "time": now, "pid": event.pid,
                           "job": event.job})  # fmt: skip
    repeated = [r for r in state.get("repeated", []) if same_boot]
    escalated = repeated_faults(faults, now, window, repeat_jobs)
    for fault in escalated:
        repeated.append(fault.__dict__)
        faults = [f for f in faults if f["pci"] != fault.pci]  # counted once: the GPU stays failed until cleared

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
    judged = [XidEvent(**e) for e in sticky] + transient
    blind = [f"cannot read the kernel log, XIDs are unchecked ({log.source})"] if log.text is None else []
    failed, unjudged = active_checks_said(config)
    verdict = inspect(
        run, shutil.which, policy, options, judged, [repeated_of(r) for r in repeated], blind + unjudged, failed
    )
    verdict["kernel_log_source"] = log.source
    verdict["dkms_deferred"] = dkms_verdict.get("deferred", "")
    verdict["xid_repeated"] = [{**r, "new": r in [f.__dict__ for f in escalated]} for r in repeated]
    gpu_index = dict(state.get("gpu_index", {}) if same_boot else {})
    gpu_index.update({pci_key(g["pci_bus_id"]) or "": g["index"] for g in verdict["gpus"]})
    new_state = {
        "boot_id": boot,
        "cursor": log.cursor or state.get("cursor", ""),
        "sticky": sticky,
        "app_faults": faults,
        "repeated": repeated,
        "gpu_index": gpu_index,
        "module_cache": options.module_cache,
        "dkms_verdict": dkms_verdict,
        # Kept while the verdict stays unknown: past the limit, a node no check can look at is drained.
        "unknown_since": (state.get("unknown_since") or now) if verdict["verdict"] == UNKNOWN else None,
    }
    failing = [{**e.__dict__, "class": xid_class(e, policy)} for e in judged]
    failing = [e for e in failing if e["class"] in DRAINING]
    failing += [{**r, "class": REPEATED} for r in repeated]
    return verdict, new_state, failing


def active_checks_said(config: dict[str, Any]) -> tuple[list[str], list[str]]:
    """What the node's last active checks said (gpuinfra-active-checks keeps it; they run at its admission and, on
    a schedule, on idle nodes), while the cluster names any: a failure is a node problem, which drains the node
    through the breaker until checks pass again; a run that could not judge is unknown; a pass, or none yet, is
    nothing to report."""
    if not (config.get("active") or {}).get("checks"):
        return [], []
    try:
        with open(config.get("active_result", active_checks.RESULT), encoding="utf-8") as handle:
            result = json.loads(handle.read(ACTIVE_RESULT_BYTES))
    except (OSError, ValueError):
        return [], []  # no run yet (one cut short by a preempting job keeps none)
    if not isinstance(result, dict) or not isinstance(result.get("reason"), str):
        return [], []
    if result.get("verdict") in (active_checks.FAIL, active_checks.UNKNOWN) and under_admission(config):
        return [], []  # the gate's checks replace this result, and the gate judges theirs itself
    said = result["reason"].removeprefix(f"{active_checks.PREFIX}:").strip()
    if result.get("verdict") == active_checks.FAIL:
        return [f"active checks failed: {said}"], []
    if result.get("verdict") == active_checks.UNKNOWN:
        return [], [f"active checks could not judge the node: {said}"]
    return [], []


def under_admission(config: dict[str, Any]) -> bool:
    """Whether the admission gate holds the node (its reservation exists). The gate resumes the node into it before
    its check job starts: a verdict drawn from the last result then would drain the node the gate is about to pass."""
    if config.get("scheduler") != "slurm" or not shutil.which("scontrol"):
        return False
    return run(["scontrol", "show", "reservation", active_checks.admission_reservation(node_name(config))])[0] == 0


def node_name(config: dict[str, Any]) -> str:
    """The node's name in the scheduler: the settings', else the host's."""
    return str(config.get("node_name") or os.uname().nodename)


def report_lines(verdict: dict[str, Any], gpu_index: dict[str, int]) -> list[str]:
    """One line per XID reported rather than judged, and per GPU the repetition rule failed at this check. What the
    host logged (the process name, the message) is data: printed escaped where it holds what a terminal or a log
    reader would act on."""
    lines = []
    for item in verdict.get("xid_reports", []):
        index = gpu_index.get(item["pci"])
        where = f"GPU {index}" if index is not None else f"PCI {item['pci']}"
        who = [f"pid {item['pid']}" if item["pid"] else "no process named"]
        if item["process"]:
            who[0] += f" ({_shown(item['process'])})"
        who += [f"job {item['job']}"] if item["job"] else []
        who += [f"user {_shown(item['user'])}"] if item["user"] else []
        kind = "application fault" if item["class"] == APPLICATION else "reported only"
        lines.append(f"XID {item['xid']} on {where} ({kind}, not drained): {', '.join(who)}")
    for entry in verdict.get("xid_repeated", []):
        if entry.get("new"):
            index = gpu_index.get(entry["pci"])
            where = f" on GPU {index}" if index is not None else f" on PCI {entry['pci']}"
            lines.append(f"{repeated_of(entry).text(where)} ({', '.join(entry['sources'])})")
    return lines


def _shown(text: str) -> str:
    return text if text.isprintable() else ascii(text)


def log_lines(lines: Sequence[str]) -> None:
    """To the system log (the journal), where an operator looks for what happened on a node: through logger, each
    line one argument, so that nothing in it is read as an option or a format."""
    logger = shutil.which("logger")
    if not logger:
        return
    for line in lines:
        run([logger, "--tag", "gpuinfra-health", "--priority", "daemon.warning", "--", line], timeout=5)


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


def cleared(config: dict[str, Any], state: dict[str, Any]) -> dict[str, Any]:
    """The operator's word after a repair: every XID logged until now is forgiven, those no check has read yet too
    (the cursor moves to the log's end), and the repetition rule starts again. XIDs logged later still count."""
    boot = boot_id()
    same_boot = state.get("boot_id") == boot
    log = read_kernel_log(config, state.get("cursor", "") if same_boot else "")
    kept = {**state, "sticky": [], "repeated": [], "app_faults": []}
    if log.cursor:
        kept.update(boot_id=boot, cursor=log.cursor, gpu_index=state.get("gpu_index", {}) if same_boot else {})
    return kept


def judge_and_act(args: argparse.Namespace) -> tuple[dict[str, Any], str, str]:
    """Read the settings and the state, judge the node, keep the new state, and drain, resume or taint."""
    config = load_json(args.config)
    state = load_json(args.state, default={})
    if args.clear_xids:
        state = cleared(config, state)
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
    verdict.setdefault("verdict", HEALTHY if verdict["healthy"] else UNHEALTHY)
    blind_for = unknown_for(verdict, state, config)
    if verdict["healthy"]:
        reason = ""
    elif verdict["verdict"] == UNKNOWN:
        reason = unknown_reason(verdict, blind_for) if blind_for is not None else ""
    else:
        reason = drain_reason(verdict, failing, state.get("gpu_index", {}))
    verdict["reports"] = report_lines(verdict, state.get("gpu_index", {}))
    acting = not (args.no_action or args.read_only)
    if acting:
        log_lines(verdict["reports"])
    scheduler = config.get("scheduler", "none") if acting else "none"
    name = node_name(config)
    if verdict["verdict"] == UNKNOWN and not reason:
        action = "no action: a check could not look, and is retried at the next check"
    elif scheduler != "none" and config.get("mode") == "observe":
        action = f"observe mode: would drain: {reason}" if reason else "observe mode: no action"
    elif scheduler == "slurm":
        breaker = Breaker(config.get("max_drained", MAX_DRAINED), slurm_rows)
        action = slurm_act(name, verdict["healthy"], reason, breaker)
    elif scheduler == "kubernetes":
        action = kubernetes_act(config, name, verdict["healthy"], reason)
    else:
        action = "no action"
    if acting:
        write_metrics(config.get("textfile", ""), verdict, state, action)
    return verdict, reason, action


# How many nodes of a partition health checks may hold drained at once, when the settings name no limit.
MAX_DRAINED = "10%"

# What a node's health is left unknown for before it drains, when the settings name no limit.
UNKNOWN_LIMIT = 1800


def unknown_for(verdict: dict[str, Any], state: dict[str, Any], config: dict[str, Any]) -> float | None:
    """How long the verdict has been unknown, once that is past the limit (`unknown_limit` seconds); else None."""
    since = state.get("unknown_since")
    if verdict["verdict"] != UNKNOWN or not isinstance(since, (int, float)):
        return None
    held = max(0.0, time.time() - since)
    return held if held >= int(config.get("unknown_limit", UNKNOWN_LIMIT)) else None


def unknown_reason(verdict: dict[str, Any], held: float) -> str:
    """`gpuinfra-health: unknown for 31m: cannot read the kernel log, ...`: the first thing no check could see."""
    what = next(iter(verdict["unknown"]), "a check could not look")
    return reason_text(f"unknown for {held / 60:.0f}m: {what}")


def write_metrics(path: str, verdict: dict[str, Any], state: dict[str, Any], action: str) -> None:
    """The verdict for the node exporter's textfile collector (`path`, a .prom file; empty: none), replaced
    atomically so that a scrape never reads half of it. A folder that is missing (no node exporter) is skipped."""
    folder = os.path.dirname(path)
    if not path or not os.path.isdir(folder):
        return
    since = state.get("unknown_since")
    lines = [
        "# HELP gpuinfra_health_verdict The GPU node health check's last verdict: 1 for the one it gave.",
        "# TYPE gpuinfra_health_verdict gauge",
        *(f'gpuinfra_health_verdict{{verdict="{kind}"}} {int(verdict["verdict"] == kind)}' for kind in VERDICTS),
        "# HELP gpuinfra_health_unknown_since_timestamp_seconds When the verdict became unknown; 0 when it is not.",
        "# TYPE gpuinfra_health_unknown_since_timestamp_seconds gauge",
        f"gpuinfra_health_unknown_since_timestamp_seconds {since if isinstance(since, (int, float)) else 0}",
        "# HELP gpuinfra_health_spared 1: unhealthy, but left in service, the breaker's limit being reached.",
        "# TYPE gpuinfra_health_spared gauge",
        f"gpuinfra_health_spared {int(action.startswith(SPARED))}",
        "# HELP gpuinfra_health_last_check_timestamp_seconds When the last check ended.",
        "# TYPE gpuinfra_health_last_check_timestamp_seconds gauge",
        f"gpuinfra_health_last_check_timestamp_seconds {time.time():.3f}",
    ]
    handle, temporary = tempfile.mkstemp(dir=folder, prefix=".gpuinfra_health.")
    with os.fdopen(handle, "w", encoding="utf-8") as out:
        out.write("\n".join(lines) + "\n")
    os.chmod(temporary, 0o644)
    os.replace(temporary, path)


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
    parser.add_argument(
        "--clear-xids",
        action="store_true",
        help="forget every XID logged so far and the application faults counted (after a repair)",
    )
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
        found = [*verdict["problems"], *(f"could not look: {u}" for u in verdict.get("unknown", []))]
        print(f"gpuinfra-health: {verdict['verdict']}; {action}" + "".join(f"\n  {p}" for p in found))
        print("".join(f"gpuinfra-health: {line}\n" for line in verdict.get("reports", [])), end="")
    if verdict["verdict"] == UNKNOWN and not reason:
        return EXIT_UNKNOWN
    if action.startswith(SPARED):
        return EXIT_SPARED
    return 0 if verdict["healthy"] else 1


if __name__ == "__main__":
    sys.exit(main())
