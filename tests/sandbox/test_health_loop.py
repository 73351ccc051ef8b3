"""The node health loop on the sandbox's real Slurm: slurmctld runs gpuinfra-health on every GPU node every
`health.check.interval` (10 s in the sandbox), and the program drains and resumes the node through scontrol.

The sandbox's GPUs are emulated: `gpuinfra-sandbox-gpu STATE` on a GPU node makes nvidia-smi answer with a
hand-written output for the installed driver (and appends the fault's kernel messages to the log the program
reads). Everything else is real: the program, its checks, slurmctld, slurmd and the jobs.

"Within one interval" is held to its word: a fault's drain, and the resume after its repair, must be seen within one
interval plus the time one check takes on the node (measured, not assumed) and a poll of sinfo.

Runs after test_apply_e2e.py (files run in name order), which converges the sandbox; run alone, it converges it.
"""

from __future__ import annotations

import itertools
import json
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from harness import MARKS, ROOT, SANDBOX_CLUSTER, converged, gpuinfra, on_host, prometheus_api, sbatch

from gpuinfra.model.grammar import duration_seconds
from gpuinfra.render.vars.health import EMULATED_KERNEL_LOG
from gpuinfra.validate.load import load_cluster

SWITCH = "/usr/local/lib/gpuinfra-sandbox/gpuinfra-sandbox-gpu"
ADMIN_REASON = "disk replacement, ticket 4711"


pytestmark = MARKS


def node(name: str) -> tuple[str, str]:
    """The node's state (drained, draining, idle, mixed, ...) and reason, as slurmctld reports them."""
    done = on_host("ctl01", "sinfo", "--noheader", "--node", name, shlex.quote("--format=%T|%E"))
    assert done.returncode == 0, done.stderr
    state, _, reason = done.stdout.splitlines()[0].partition("|")
    return state.rstrip("*~#!%$@^-"), "" if reason.strip() == "none" else reason.strip()


def drained(state: str) -> bool:
    return state in ("drained", "draining") or "drain" in state


def wait_for(what: str, ready: Callable[[], bool], limit: float) -> float:
    """Poll until `ready()`; the seconds it took. Fails, naming `what`, after `limit` seconds."""
    start = time.monotonic()
    while not ready():
        assert time.monotonic() - start < limit, f"{what}: not within {limit:.0f} s"
        time.sleep(1)
    return time.monotonic() - start


@pytest.fixture(scope="module")
def interval() -> Iterator[int]:
    """The sandbox up and converged, with healthy GPUs and no drain on its GPU nodes before and after."""
    converged()
    seconds = duration_seconds(load_cluster(SANDBOX_CLUSTER).model.health.check.interval)
    _restore()
    yield seconds
    _restore()


def _restore() -> None:
    for host in ("gpu01", "gpu02"):
        assert on_host(host, SWITCH, "healthy").returncode == 0
        on_host(host, "gpuinfra-health", "--clear-xids", "--no-action")
        if drained(node(host)[0]):
            on_host("ctl01", "scontrol", "update", f"NodeName={host}", "State=RESUME")


@pytest.fixture(scope="module")
def one_interval(interval: int) -> float:
    """The most a fault may take to drain its node: the next check starts within one interval, and the check itself
    takes about as long as one run of the program here (measured, SSH included; counted twice, for its variance on a
    loaded machine), plus a one-second poll of sinfo: far less than a second interval."""
    start = time.monotonic()
    assert on_host("gpu02", "gpuinfra-health", "--no-action").returncode == 0
    return interval + 2 * (time.monotonic() - start) + 1


def test_the_program_reads_the_emulated_gpus_as_healthy(interval: int) -> None:
    """The real checks pass on the hand-written healthy answer: count, model, driver pin, DKMS, persistence, XIDs."""
    done = on_host("gpu02", "gpuinfra-health", "--no-action")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("gpuinfra-health: healthy; no action"), done.stdout


def test_a_broken_gpu_drains_its_node_and_the_repair_resumes_it(interval: int, one_interval: float) -> None:
    assert on_host("gpu02", SWITCH, "xid79").returncode == 0
    took = wait_for("gpu02 drained by its health check", lambda: drained(node("gpu02")[0]), one_interval)
    print(f"gpu02 drained {took:.1f} s after its GPU 1 fell off the bus (interval {interval} s)")
    assert node("gpu02")[1] == "gpuinfra-health: xid 79 on GPU 1: reboot"

    # While gpu02 is broken, GPU jobs land on gpu01 only.
    script = shlex.quote("hostname")
    for _ in range(3):
        job = on_host("ctl01", "runuser", "-u", "alice", "--", "srun", "--partition=vision", "--chdir=/tmp",
                      "--immediate=60", "--gres=gpu:1", "sh", "-c", script)  # fmt: skip
        assert (job.returncode, job.stdout.strip()) == (0, "gpu01"), job.stdout + job.stderr

    # The GPU answers again, but XID 79 stays until a reboot or the operator's word: still drained.
    assert on_host("gpu02", SWITCH, "healthy").returncode == 0
    time.sleep(interval * 2 + 2)
    assert node("gpu02") == ("drained", "gpuinfra-health: xid 79 on GPU 1: reboot")
    assert on_host("gpu02", "gpuinfra-health", "--clear-xids", "--no-action").returncode == 0
    took = wait_for("gpu02 resumed by its health check", lambda: not drained(node("gpu02")[0]), one_interval)
    print(f"gpu02 resumed {took:.1f} s after the operator cleared the XID")
    assert node("gpu02")[1] == ""


def test_drain_unhealthy_takes_what_a_node_reports_as_data(interval: int, tmp_path: Path) -> None:
    """`gpuinfra health --drain-unhealthy` hands a node's problems back to Ansible for the drain reason. A job user
    names a process so that its XID's text holds Jinja: the literal text reaches the report and slurmctld's reason,
    and nothing runs on the controller (this machine). Passing the reason to Ansible as a plain extra var again
    makes the lookups run: `id -un` fills the reason and the marker appears."""
    marker = tmp_path / "ran-on-the-controller"
    # The short lookup first: Slurm's reason is cut at 240 characters.
    name = f",{{{{ lookup('pipe', 'id -un') }}}}{{{{ lookup('pipe', 'touch {marker}') }}}}"
    line = f"NVRM: Xid (PCI:0000:2a:00): 79, pid=4242, name={name}, GPU has fallen off the bus."
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    append = f"echo {shlex.quote(f'{stamp} gpu02 kernel: {line}')} >> {EMULATED_KERNEL_LOG}"
    assert on_host("gpu02", "sh", "-c", shlex.quote(append)).returncode == 0
    try:
        done = gpuinfra("health", str(SANDBOX_CLUSTER), "--limit", "gpu02", "--drain-unhealthy", "--json")
        doc = json.loads(done.stdout)
        [gpu02] = doc["nodes"]
        assert gpu02["status"] == "unhealthy", doc
        literal = "{{ lookup('pipe', 'id -un') }}"
        assert any(literal in problem for problem in gpu02["problems"]), gpu02
        assert literal in doc["drained"]["gpu02"], doc
        state, reason = node("gpu02")
        assert drained(state) and reason.startswith("gpuinfra health: ") and literal in reason, reason
        assert not marker.exists()
    finally:
        _restore()
    wait_for("gpu02 resumed", lambda: not drained(node("gpu02")[0]), 2 * interval)


def test_a_pending_row_remap_drains_until_the_gpu_is_reset(interval: int, one_interval: float) -> None:
    assert on_host("gpu02", SWITCH, "row-remap-pending").returncode == 0
    wait_for("gpu02 drained for its row remap", lambda: drained(node("gpu02")[0]), one_interval)
    assert node("gpu02")[1].startswith("gpuinfra-health: GPU 0 (00000000:18:00.0): row remapping is pending")
    assert on_host("gpu02", SWITCH, "healthy").returncode == 0
    wait_for("gpu02 resumed after the reset", lambda: not drained(node("gpu02")[0]), one_interval)


def test_an_admin_drain_survives_many_intervals_healthy_or_not(interval: int) -> None:
    update = ["scontrol", "update", "NodeName=gpu01", "State=DRAIN", f"Reason={shlex.quote(ADMIN_REASON)}"]
    assert on_host("ctl01", *update).returncode == 0
    time.sleep(interval * 3 + 2)
    assert node("gpu01") == ("drained", ADMIN_REASON)
    # Broken while drained by the admin: the program leaves the drain and its reason alone.
    assert on_host("gpu01", SWITCH, "gpu-missing").returncode == 0
    time.sleep(interval * 2 + 2)
    assert node("gpu01") == ("drained", ADMIN_REASON)
    assert on_host("gpu01", SWITCH, "healthy").returncode == 0
    time.sleep(interval * 2 + 2)
    assert node("gpu01") == ("drained", ADMIN_REASON)


def _hold(host: str, state: str, reason: str) -> None:
    update = ["scontrol", "update", f"NodeName={host}", f"State={state}", f"Reason={shlex.quote(reason)}"]
    assert on_host("ctl01", *update).returncode == 0


def _unchanged_through(seconds: float, expected: dict[str, tuple[str, str]]) -> None:
    """Sample every node each second for `seconds`: none may leave the state and reason it was given."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for host, (state, reason) in expected.items():
            seen = node(host)
            assert seen[0].startswith(state) and seen[1] == reason, (host, seen)
        time.sleep(1)


def test_fail_and_an_upgrades_drain_survive_checks_healthy_or_not(interval: int) -> None:
    """An admin's FAIL on gpu01 and a driver upgrade's drain on gpu02, through two broken and two healthy checks:
    the program neither renames the reason nor resumes the node (sampled every second). An admin's DOWN is in the
    unit tests only: with ReturnToService=2 slurmctld itself returns a DOWN node at its next registration."""
    held = {"gpu01": ("FAIL", "fail", "fans failing, ticket 4713"),
            "gpu02": ("DRAIN", "drain", "gpuinfra: driver upgrade to 535.309.01")}  # fmt: skip
    try:
        for host, (state, _, reason) in held.items():
            _hold(host, state, reason)
        expected = {host: (shown, reason) for host, (_, shown, reason) in held.items()}
        for host in held:
            assert on_host(host, SWITCH, "gpu-missing").returncode == 0
        _unchanged_through(interval * 2 + 2, expected)
        for host in held:
            assert on_host(host, SWITCH, "healthy").returncode == 0
        _unchanged_through(interval * 2 + 2, expected)
    finally:
        for host in held:
            on_host("ctl01", "scontrol", "update", f"NodeName={host}", "State=RESUME")
        _restore()


def test_a_job_never_starts_on_a_node_that_broke_since_the_last_check(interval: int) -> None:
    """health.check.on_job_start: the prolog checks the node first. With gpu01 drained by the admin, the job can
    only go to gpu02, broken a moment ago: the prolog fails there, the node is drained, and Slurm puts the job back
    in the queue, pending (not held), without its script having run."""
    drain = ["scontrol", "update", "NodeName=gpu01", "State=DRAIN", f"Reason={shlex.quote(ADMIN_REASON)}"]
    assert on_host("ctl01", *drain).returncode == 0
    assert on_host("gpu02", SWITCH, "gpu-missing").returncode == 0
    job = sbatch("alice", "--partition=vision", "--gres=gpu:1", "--chdir=/tmp", "--output=/tmp/job-%j.out",
                 command="hostname")  # fmt: skip
    try:
        wait_for("gpu02 drained", lambda: drained(node("gpu02")[0]), 2 * interval)
        assert node("gpu02")[1] == "gpuinfra-health: 1 of 2 GPUs visible"

        def queued() -> str:
            done = on_host("ctl01", "squeue", "--noheader", f"--jobs={job}", shlex.quote("--format=%T|%r"))
            return done.stdout.strip()

        # The prolog may still be running on gpu02 (RUNNING|Prolog) when the drain shows: it fails there, and
        # Slurm puts the job back. Its outcome is what counts.
        wait_for("the job out of gpu02's prolog", lambda: queued() != "RUNNING|Prolog", 2 * interval)
        state, _, reason = queued().partition("|")
        assert state == "PENDING" and "held" not in reason.lower(), (state, reason)
        history = on_host("ctl01", "sacct", "--noheader", "--allocations", "--parsable2", "--duplicates",
                          f"--jobs={job}", "--format=State,NodeList")  # fmt: skip
        runs = [tuple(line.split("|")) for line in history.stdout.splitlines()]
        # Either the prolog refused the job on gpu02 (requeued from there), or the periodic check drained gpu02
        # first and the job never went there; in no case did its script run on gpu02.
        assert all(state == "REQUEUED" for state, nodes in runs if nodes == "gpu02"), runs
        assert on_host("gpu02", "test", "-e", f"/tmp/job-{job}.out").returncode != 0
    finally:
        on_host("ctl01", "scancel", job)


def test_apply_names_a_node_its_health_check_keeps_drained(interval: int) -> None:
    """A plain apply never fails without a message: with gpu02's GPU gone, it fails on gpu02 saying that the node's
    health check keeps it drained, and why; once the GPU is back and the check resumed the node, it passes."""
    assert on_host("gpu02", SWITCH, "gpu-missing").returncode == 0
    try:
        wait_for("gpu02 drained", lambda: drained(node("gpu02")[0]), 2 * interval)
        done = gpuinfra("apply", str(SANDBOX_CLUSTER), "--yes", "--json")
        doc = json.loads(done.stdout)
        assert done.returncode == 1, doc
        [failure] = doc["failures"]
        assert failure["host"] == "gpu02"
        assert "stays drained by its node health check" in failure["message"], failure
        assert "gpuinfra-health: 1 of 2 GPUs visible" in failure["message"], failure
    finally:
        _restore()
    wait_for("gpu02 resumed", lambda: not drained(node("gpu02")[0]), 2 * interval)
    done = gpuinfra("apply", str(SANDBOX_CLUSTER), "--yes", "--json")
    assert done.returncode == 0, done.stdout[-3000:]


def test_apply_fails_a_node_whose_gpu_broke_before_its_health_check_drained_it(interval: int) -> None:
    """A no-op apply judges each node in its receipts' probe (`gpuinfra-health --read-only`). With slurmd paused on
    gpu02, its health check cannot drain the node first: only that verdict can send gpu02 to the health sweep,
    which fails it with the program's reason."""
    assert gpuinfra("apply", str(SANDBOX_CLUSTER), "--yes").returncode == 0
    assert on_host("gpu02", "systemctl", "kill", "--signal=SIGSTOP", "slurmd").returncode == 0
    try:
        assert on_host("gpu02", SWITCH, "gpu-missing").returncode == 0
        done = gpuinfra("apply", str(SANDBOX_CLUSTER), "--yes", "--json")
        doc = json.loads(done.stdout)
        assert done.returncode == 1, doc
        [failure] = doc["failures"]
        assert failure["host"] == "gpu02", failure
        assert "nvidia-smi lists 1 GPU(s), the model expects 2" in failure["message"], failure
    finally:
        on_host("gpu02", "systemctl", "kill", "--signal=SIGCONT", "slurmd")
        _restore()
    wait_for("gpu02 in service", lambda: not drained(node("gpu02")[0]), 2 * interval)


# --- XID classes: an application's fault is the job's, until it keeps coming back from different jobs -------------

REPEATED_REASON = "gpuinfra-health: XID 13 from 3 different jobs on GPU 1 within 1h: treated as a GPU fault"


def _job_on_gpu02(*options: str) -> tuple[str, int]:
    """A job of alice's running `sleep` on gpu02 (with sbatch's `options`): its id, and the pid slurmd lists for its
    process."""
    job = sbatch("alice", "--partition=vision", "--nodelist=gpu02", "--chdir=/tmp", "--output=/dev/null", *options,
                 command="exec sleep 600")  # fmt: skip
    find = (f"for p in $(scontrol listpids {job} | awk 'NR > 1 {{print $1}}'); do "
            '[ "$(cat /proc/$p/comm 2>/dev/null)" = sleep ] && echo $p; done; true')  # fmt: skip
    pids: list[str] = []

    def running() -> bool:
        pids[:] = on_host("gpu02", "sh", "-c", shlex.quote(find)).stdout.split()
        return bool(pids)

    wait_for(f"job {job}'s sleep running on gpu02", running, 60)
    return job, int(pids[0])


def _application_xid(pid: int) -> None:
    """XID 13 on gpu02's GPU 1, from the process `pid`, as the driver logs a user's bad pointer."""
    line = f"NVRM: Xid (PCI:0000:2a:00): 13, pid={pid}, name=sleep, Graphics Exception: ESR 0x514648=0x1000a"
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    append = f"echo {shlex.quote(f'{stamp} gpu02 kernel: {line}')} >> {EMULATED_KERNEL_LOG}"
    assert on_host("gpu02", "sh", "-c", shlex.quote(append)).returncode == 0


def _reported(job: str, pid: int) -> bool:
    """The program logged the XID against this job and its user (the system log, tag gpuinfra-health)."""
    done = on_host("gpu02", "journalctl", "--no-pager", "-q", "-t", "gpuinfra-health", "-o", "cat")
    line = f"XID 13 on GPU 1 (application fault, not drained): pid {pid} (sleep), job {job}, user alice"
    return line in done.stdout.splitlines()


def _reported_check(job: str, pid: int) -> Callable[[], bool]:
    return lambda: _reported(job, pid)


def test_an_application_xid_is_the_jobs_until_several_jobs_have_it(interval: int, one_interval: float) -> None:
    """XID 13 from one job's process leaves gpu02 in service: the health check logs it against that job and alice
    (slurmd's `scontrol pidinfo`), and drains nothing. The same XID on the same GPU from three different jobs within
    the hour is the GPU's fault: gpu02 is drained with the repetition reason, and stays drained until cleared."""
    _restore()
    jobs: list[str] = []
    try:
        for count in (1, 2, 3):
            job, pid = _job_on_gpu02()
            jobs.append(job)
            _application_xid(pid)
            if count < 3:
                wait_for(f"XID 13 of job {job} reported", _reported_check(job, pid), one_interval)
                state, reason = node("gpu02")
                assert not drained(state) and reason == "", (state, reason)
            else:
                took = wait_for("gpu02 drained by the repetition rule", lambda: drained(node("gpu02")[0]), one_interval)
                print(f"gpu02 drained {took:.1f} s after the third job's XID 13")
                assert node("gpu02")[1] == REPEATED_REASON
                assert _reported(job, pid)
            on_host("ctl01", "scancel", job)
        time.sleep(interval * 2 + 2)
        assert node("gpu02") == ("drained", REPEATED_REASON)
    finally:
        for job in jobs:
            on_host("ctl01", "scancel", job)
        _restore()
    wait_for("gpu02 resumed", lambda: not drained(node("gpu02")[0]), 2 * interval)


# --- GPU alerts end to end: the emulated GPUs' DCGM exporter, Prometheus over TLS, Alertmanager, the team --------

# Each team's receiver in the sandbox's cluster file is http://ctl01:9099/<team>; this one keeps every notification
# Alertmanager posts, one JSON document per line, in a file per path.
WEBHOOK = """import http.server
class Keep(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        with open("/run/gpuinfra-test-webhook" + self.path.replace("/", "-") + ".jsonl", "ab") as out:
            out.write(body.replace(b"\\n", b" ") + b"\\n")
        self.send_response(200)
        self.end_headers()
    def log_message(self, *args):
        pass
http.server.HTTPServer(("10.213.42.10", 9099), Keep).serve_forever()
"""


@pytest.fixture
def receivers() -> Iterator[None]:
    """The sandbox's webhook receivers on ctl01, each keeping what Alertmanager posts to it from now on."""
    unit = "gpuinfra-test-webhook"
    on_host("ctl01", "systemctl", "stop", unit)
    on_host("ctl01", "sh", "-c", shlex.quote("rm -f /run/gpuinfra-test-webhook-*.jsonl"))
    started = on_host("ctl01", "systemd-run", f"--unit={unit}", "--collect", "python3", "-c", shlex.quote(WEBHOOK))
    assert started.returncode == 0, started.stderr
    yield
    on_host("ctl01", "systemctl", "stop", unit)


def _notified(team: str) -> list[dict[str, object]]:
    """The alerts Alertmanager has posted to `team`'s receiver, each with its status."""
    done = on_host("ctl01", "cat", f"/run/gpuinfra-test-webhook-{team}.jsonl")
    posts = [json.loads(line) for line in done.stdout.splitlines()] if done.returncode == 0 else []
    return [{"status": a["status"], **a["labels"]} for post in posts for a in post["alerts"]]


@pytest.mark.usefixtures("receivers")
def test_an_application_xid_alert_reaches_its_team_naming_the_job_and_its_user(
    interval: int, one_interval: float
) -> None:
    """alice's job holds both of gpu02's GPUs; XID 13 from its process on GPU 1. The stand-in DCGM exporter
    publishes it with the job's hpc_job label, Prometheus scrapes it over TLS, GpuApplicationXid fires naming the
    job, alice and her account, and Alertmanager posts it to the vision team's receiver, not to nlp's. gpu02 stays in
    service: an application's fault is not the node's."""
    _restore()
    job = ""
    try:
        job, pid = _job_on_gpu02("--gres=gpu:2")
        _application_xid(pid)
        wanted = {"status": "firing", "alertname": "GpuApplicationXid", "instance": "gpu02", "gpu": "1",
                  "hpc_job": job, "user": "alice", "account": "vision", "severity": "warning"}  # fmt: skip

        def arrived() -> bool:
            return any(wanted.items() <= alert.items() for alert in _notified("vision"))

        took = wait_for("the alert at the vision team's receiver", arrived, 180)
        print(f"GpuApplicationXid of job {job} reached the vision team's receiver {took:.0f} s after the XID")
        assert not [a for a in _notified("nlp") if a.get("hpc_job") == job], _notified("nlp")
        assert not drained(node("gpu02")[0]), node("gpu02")
        targets = prometheus_api(SANDBOX_CLUSTER, "https", "targets")["activeTargets"]
        scraped = {t["scrapeUrl"]: t["health"] for t in targets if t["labels"]["job"] == "dcgm_exporter"}
        assert scraped == {"https://10.213.42.11:9400/metrics": "up", "https://10.213.42.12:9400/metrics": "up"}
    finally:
        if job:
            on_host("ctl01", "scancel", job)
        _restore()


STATE = "/var/lib/gpuinfra-health/state.json"
# The program's state, its clock pushed past the limit under the program's own lock: an unknown this old.
AGED = f"""import json
settings = json.load(open("/etc/gpuinfra/health.json"))
state = json.load(open("{STATE}"))
state["unknown_since"] -= settings["unknown_limit"] + 60
json.dump(state, open("{STATE}", "w"))
"""


def _unknown_in_prometheus() -> bool:
    query = 'query?query=gpuinfra_health_verdict{instance="gpu02",verdict="unknown"}'
    return [r["value"][1] for r in prometheus_api(SANDBOX_CLUSTER, "https", query)["result"]] == ["1"]


def test_a_check_that_cannot_look_leaves_the_node_in_service_until_its_limit(
    interval: int, one_interval: float
) -> None:
    """gpu02's kernel log moved away, as a rotation across the fleet would move it: its checks answer unknown,
    gpu02 stays in service through several intervals, and Prometheus reads the verdict from the node exporter.
    With the unknown older than health.check.unknown_limit, the next check drains gpu02 with a reason that says
    why; the log back, the next check resumes it."""
    _restore()
    moved = f"{EMULATED_KERNEL_LOG}.moved"
    assert on_host("gpu02", "mv", EMULATED_KERNEL_LOG, moved).returncode == 0
    try:
        time.sleep(interval * 3 + 2)
        assert node("gpu02") in (("idle", ""), ("mixed", "")), node("gpu02")
        done = on_host("gpu02", "gpuinfra-health", "--no-action", "--json")
        verdict = json.loads(done.stdout)
        assert (done.returncode, verdict["verdict"], verdict["problems"]) == (3, "unknown", []), done.stdout
        assert verdict["unknown"][0].startswith("cannot read the kernel log, XIDs are unchecked"), verdict
        wait_for("Prometheus reads gpu02's unknown verdict", _unknown_in_prometheus, 120)

        aged = on_host("gpu02", "flock", f"{STATE}.lock", "python3", "-c", shlex.quote(AGED))
        assert aged.returncode == 0, aged.stderr
        took = wait_for("gpu02 drained past the unknown limit", lambda: drained(node("gpu02")[0]), one_interval)
        print(f"gpu02 drained {took:.1f} s after its unknown passed the limit")
        reason = node("gpu02")[1]
        assert reason.startswith("gpuinfra-health: unknown for ") and "cannot read the kernel log" in reason, reason
    finally:
        on_host("gpu02", "mv", moved, EMULATED_KERNEL_LOG)
    wait_for("gpu02 resumed once its check could look", lambda: not drained(node("gpu02")[0]), one_interval)


def _sweep() -> dict[str, Any]:
    """`gpuinfra health --json`: each node's verdict with what the Slurm controller holds of it, and the breakers."""
    done = gpuinfra("health", str(SANDBOX_CLUSTER), "--json", timeout=600)
    assert done.stdout, done.stderr
    doc: dict[str, Any] = json.loads(done.stdout)
    return doc


def _spared(host: str) -> bool:
    metrics = on_host(host, "cat", "/var/lib/prometheus/node-exporter/gpuinfra_health.prom").stdout
    return "gpuinfra_health_spared 1" in metrics.splitlines()


@pytest.mark.usefixtures("receivers")
def test_a_fault_on_every_gpu_node_takes_at_most_the_limit_out(interval: int, one_interval: float) -> None:
    """Both GPU nodes lose a GPU at once, as a fault of the check itself would show everywhere: with the sandbox's
    limit (10% of a partition's nodes, at least 1) one is drained, the other stays in service, unhealthy, says so to
    the node exporter, takes jobs, and GpuHealthSpared reaches Alertmanager's critical receiver. Two checks in the
    same second each see the other still in service: the later drain is undone within its own check, so a second
    drained node is seen for a moment at most."""
    _restore()
    try:
        for host in ("gpu01", "gpu02"):
            assert on_host(host, SWITCH, "gpu-missing").returncode == 0
        wait_for("a GPU node drained", lambda: any(drained(node(h)[0]) for h in ("gpu01", "gpu02")), one_interval)
        drained_at = time.monotonic()
        both = []
        for _ in range(int(3 * interval)):
            both.append(all(drained(node(h)[0]) for h in ("gpu01", "gpu02")))
            time.sleep(1)
        assert not any(a and b for a, b in itertools.pairwise(both)), both  # never two samples running
        [out] = [h for h in ("gpu01", "gpu02") if drained(node(h)[0])]
        [kept] = [h for h in ("gpu01", "gpu02") if h != out]
        assert node(out)[1] == "gpuinfra-health: 1 of 2 GPUs visible", node(out)
        assert node(kept) in (("idle", ""), ("mixed", "")) and _spared(kept), node(kept)
        job = on_host("ctl01", "runuser", "-u", "alice", "--", "srun", "--partition=vision", "--chdir=/tmp",
                      "--immediate=60", f"--nodelist={kept}", "hostname")  # fmt: skip
        assert (job.returncode, job.stdout.strip()) == (0, kept), job.stderr
        spared = {"status": "firing", "alertname": "GpuHealthSpared", "instance": kept, "severity": "critical"}
        arrived = lambda: any(spared.items() <= a.items() for a in _notified("alerts"))  # noqa: E731
        wait_for("GpuHealthSpared at the operators' receiver", arrived, 240)
        took = time.monotonic() - drained_at
        print(f"GpuHealthSpared for {kept} reached Alertmanager's receiver at most {took:.0f} s after the drain")
        # The sweep shows what the nodes decided: the drained one with its reason, the kept one spared, and each
        # partition's breaker at its limit.
        doc = _sweep()
        seen = {n["node"]: n for n in doc["nodes"]}
        assert seen[out]["slurm"]["state"] == "drained", seen[out]
        assert seen[out]["slurm"]["reason"] == "gpuinfra-health: 1 of 2 GPUs visible", seen[out]
        assert (seen[kept]["status"], seen[kept]["slurm"]["state"], seen[kept]["slurm"]["spared"]) == (
            "unhealthy", "in service", True), seen[kept]  # fmt: skip
        vision = next(b for b in doc["breakers"] if b["partition"] == "vision")
        assert (vision["held"], vision["limit"], vision["at_limit"]) == ([out], 1, True), doc["breakers"]
    finally:
        _restore()
    wait_for("both in service", lambda: not any(drained(node(h)[0]) for h in ("gpu01", "gpu02")), one_interval)


def _admit(host: str) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "gpuinfra", "health", str(SANDBOX_CLUSTER), "--admit", host, "--json"]
    return subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _job(job: str, time_field: str = "Start") -> tuple[str, str, str]:
    """A finished or running job's state, node and start (or `time_field`) time in epoch seconds, from slurmdbd."""
    done = on_host("ctl01", "env", "SLURM_TIME_FORMAT=%s", "sacct", "--noheader", "--allocations", "--parsable2",
                   f"--jobs={job}", f"--format=State,NodeList,{time_field}")  # fmt: skip
    state, nodes, start = done.stdout.strip().splitlines()[-1].split("|")
    return state, nodes, start


def _hold_as_the_gate_does(host: str) -> None:
    """The gate's reservation of the node for root, and the node resumed into it; without the gate's MAINT flag,
    which Slurm shows seconds later and the health check honours on its own."""
    name = f"ReservationName=gpuinfra-admission-{host}"
    made = on_host("ctl01", "scontrol", "create", "reservation", name, f"Nodes={host}", "Users=root",
                   "StartTime=now", "Duration=infinite", "Flags=IGNORE_JOBS")  # fmt: skip
    assert made.returncode == 0, made.stderr
    assert on_host("ctl01", "scontrol", "update", f"NodeName={host}", "State=RESUME").returncode == 0


def test_the_admission_gate_keeps_a_node_out_until_its_active_checks_pass(interval: int) -> None:
    """`gpuinfra health --admit gpu02` with its all-reduce under the L4's floor: the gate drains gpu02 (`gpuinfra:
    admission`), runs the three checks as a root job in gpuinfra's own partition, inside a reservation no user job
    may use, and leaves the node drained with the check and its figure, which the sweep shows with the refused
    admission. A job alice sent to gpu02 meanwhile never starts. With the checks passing, the next admission puts
    gpu02 back, and only then does alice's job start; the controller keeps each admission in its history."""
    _restore()
    history = "/var/lib/gpuinfra/admission/history.jsonl"
    before = len(on_host("ctl01", "cat", history).stdout.splitlines())
    job = ""
    try:
        assert on_host("gpu02", SWITCH, "--checks", "nccl-fail").returncode == 0
        gate = _admit("gpu02")
        wait_for("gpu02 in admission", lambda: node("gpu02")[1] == "gpuinfra: admission" or gate.poll() is not None,
                 120)  # fmt: skip
        job = sbatch("alice", "--partition=vision", "--nodelist=gpu02", "--chdir=/tmp", command="hostname")
        out, err = gate.communicate(timeout=300)
        assert gate.returncode == 1, out + err
        [refused] = json.loads(out)["admissions"]
        floor = "gpuinfra admission: nccl all_reduce busbw 4.6 GB/s below the 7.8 GB/s floor of L4 at PCIe Gen4"
        assert (refused["admitted"], refused["reason"]) == (False, floor), refused
        assert node("gpu02") == ("drained", floor)
        assert _job(job)[0] == "PENDING"
        # The sweep shows the gate's state: gpu02 drained with the check's figure, and its last admission refused.
        [seen] = [n for n in _sweep()["nodes"] if n["node"] == "gpu02"]
        last = seen["slurm"]["last_admission"]
        assert (seen["slurm"]["state"], seen["slurm"]["reason"]) == ("drained", floor), seen
        assert (last["verdict"], last["reason"]) == ("fail", floor), seen
        # The gate resumes a node into its reservation before the check job starts there. The node's own check, run
        # then, leaves the last result (this failure) to the gate, which is about to replace it: it does not drain.
        _hold_as_the_gate_does("gpu02")
        try:
            done = on_host("gpu02", "gpuinfra-health", "--json")
            assert (done.returncode, json.loads(done.stdout)["action"]) == (0, "nothing to do"), done.stdout
            assert node("gpu02") in (("idle", ""), ("reserved", "")), node("gpu02")  # Slurm marks it in a while
        finally:  # back as the refused admission left it, before alice's job can take the node
            on_host("ctl01", "scontrol", "update", "NodeName=gpu02", "State=DRAIN", f"Reason={shlex.quote(floor)}")
            on_host("ctl01", "scontrol", "delete", "ReservationName=gpuinfra-admission-gpu02")

        assert on_host("gpu02", SWITCH, "--checks", "pass").returncode == 0
        gate = _admit("gpu02")
        out, err = gate.communicate(timeout=300)
        assert gate.returncode == 0, out + err
        assert json.loads(out)["admissions"] == [{"node": "gpu02", "admitted": True, "reason": ""}]
        assert not drained(node("gpu02")[0]) and node("gpu02")[1] == "", node("gpu02")
        wait_for("alice's job ran", lambda: _job(job)[0] == "COMPLETED", 60)
        checks = on_host("ctl01", "env", "SLURM_TIME_FORMAT=%s", "sacct", "--noheader", "--allocations",
                         "--parsable2", "--user=root", "--name=gpuinfra-admission", "--partition=gpuinfra",
                         "--format=State,NodeList,End")  # fmt: skip
        last_check_end = max(int(line.split("|")[2]) for line in checks.stdout.splitlines() if "|gpu02|" in line)
        assert int(_job(job)[2]) >= last_check_end, (_job(job), checks.stdout)
        kept = [json.loads(line) for line in on_host("ctl01", "cat", history).stdout.splitlines()[before:]]
        assert [(k["node"], k["verdict"]) for k in kept] == [("gpu02", "fail"), ("gpu02", "pass")], kept
    finally:
        on_host("gpu02", SWITCH, "--checks", "pass")
        if job:
            on_host("ctl01", "scancel", job)
        _restore()


SCHEDULED = "/usr/local/sbin/gpuinfra-scheduled-checks"
SCHEDULED_TEST = "/tmp/gpuinfra-scheduled-checks-test"


def _scheduled_pass() -> dict[str, str]:
    """One pass of the controller's scheduled checks with the installed settings, but every idle node due (the
    sandbox's schedule is a week) and a history of the test's own: node -> the check job it started there."""
    done = on_host("ctl01", SCHEDULED, "--config", f"{SCHEDULED_TEST}.json", "--state", f"{SCHEDULED_TEST}.state")
    assert done.returncode == 0, done.stdout + done.stderr
    found = (line.split(": ") for line in done.stdout.splitlines() if line.endswith(" started"))
    return {parts[1]: parts[2].split()[1] for parts in found}


def _alice(node: str, command: str) -> str:
    return sbatch("alice", "--partition=vision", "--chdir=/tmp", "--gres=gpu:1", f"--nodelist={node}", command=command)


def test_scheduled_checks_take_only_idle_nodes_and_yield_to_any_user_job(interval: int, one_interval: float) -> None:
    """The controller's timer runs a pass of gpuinfra-scheduled-checks now and then. With gpu01 running alice's job
    and gpu02 idle, a pass starts a check job on gpu02 alone. The check is slow (the two minutes of a real DCGM
    diagnostic), and alice's job for gpu02 preempts it at once: her job runs, the check job is cancelled, and the
    next pass records it as preempted. With both idle and gpu01's DCGM diagnostic failing, the failure of gpu01's
    next check drains it through its health check with the check's reason, gpu02 passing stays in service;
    repaired, gpu01 passes the admission gate (whose job its health check does not refuse) and is back."""
    _restore()
    assert on_host("ctl01", "systemctl", "is-active", "gpuinfra-scheduled-checks.timer").stdout.strip() == "active"
    installed = json.loads(on_host("ctl01", "cat", "/etc/gpuinfra/scheduled-checks.json").stdout)
    settings = json.dumps({**installed, "every": 1, "history": f"{SCHEDULED_TEST}.jsonl"})
    written = on_host("ctl01", "sh", "-c", shlex.quote(f"echo {shlex.quote(settings)} > {SCHEDULED_TEST}.json"))
    assert written.returncode == 0, written.stderr
    jobs: list[str] = []
    try:
        jobs.append(_alice("gpu01", "sleep 600"))
        wait_for("alice's job on gpu01", lambda: _job(jobs[0])[0] == "RUNNING", 60)
        assert on_host("gpu02", SWITCH, "--checks", "dcgm-slow").returncode == 0
        started = _scheduled_pass()
        assert list(started) == ["gpu02"], started
        check = started["gpu02"]
        wait_for("the check job running", lambda: _job(check)[0] == "RUNNING", 60)
        time.sleep(5)  # well into the slow diagnostic
        jobs.append(_alice("gpu02", "sleep 600"))
        wait_for("alice's job running on gpu02", lambda: _job(jobs[1])[0] == "RUNNING", 90)
        assert _job(check)[0].split()[0] in ("PREEMPTED", "CANCELLED"), _job(check)
        preempted_at, ran_from = int(_job(check, "End")[2]), int(_job(jobs[1])[2])
        assert _scheduled_pass() == {}  # both nodes busy

        assert on_host("gpu01", SWITCH, "--checks", "dcgm-fail").returncode == 0
        assert on_host("gpu02", SWITCH, "--checks", "pass").returncode == 0
        on_host("ctl01", "scancel", *jobs)
        wait_for("both idle", lambda: node("gpu01")[0] == node("gpu02")[0] == "idle", 60)
        started = _scheduled_pass()
        assert sorted(started) == ["gpu01", "gpu02"], started
        wait_for("both check jobs ended", lambda: all(_job(j)[0] not in ("PENDING", "RUNNING", "COMPLETING")
                                                      for j in started.values()), 120)  # fmt: skip
        _scheduled_pass()
        kept = [json.loads(line) for line in on_host("ctl01", "cat", f"{SCHEDULED_TEST}.jsonl").stdout.splitlines()]
        assert [(k["node"], k["verdict"]) for k in kept][:3] == [("gpu02", "preempted"), ("gpu01", "fail"),
                                                                 ("gpu02", "pass")], kept  # fmt: skip
        failed = "gpuinfra-health: node: active checks failed: dcgm diag -r 2 failed memory on GPU 1"
        wait_for("gpu01 drained by its health check", lambda: node("gpu01")[1].startswith(failed), one_interval)
        assert not drained(node("gpu02")[0]), node("gpu02")
        print(f"alice's job ran on gpu02 {ran_from - preempted_at} s after the check job it preempted ended")

        assert on_host("gpu01", SWITCH, "--checks", "pass").returncode == 0
        gate = _admit("gpu01")
        out, err = gate.communicate(timeout=300)
        assert gate.returncode == 0, out + err
        time.sleep(interval + 5)  # a health check after the admission: the passing checks keep it in service
        assert node("gpu01") == ("idle", ""), node("gpu01")
    finally:
        for host in ("gpu01", "gpu02"):
            on_host(host, SWITCH, "--checks", "pass")
        if jobs:
            on_host("ctl01", "scancel", *jobs)
        on_host("ctl01", "scancel", "--name=gpuinfra-scheduled-check")
        on_host("ctl01", "rm", "-f", *(f"{SCHEDULED_TEST}.{end}" for end in ("json", "state", "jsonl")))
        _restore()


def test_a_drain_cancels_a_scheduled_check_rather_than_wait_for_it(interval: int) -> None:
    """gpu02's scheduled check is slow (a DCGM level 2's two minutes) and alice's job runs on gpu01. The drain an
    upgrade makes of both (playbooks/drain.yml, waiting for their jobs, as node_drain does in an upgrade) cancels
    the check job, whose QoS any user job preempts, and drains gpu02 at once; gpu01 stays draining for alice's job,
    which is never touched."""
    from gpuinfra.render.inventory import inventory_yaml
    from gpuinfra.run import Outcome, RunOptions, run_playbook

    _restore()
    installed = json.loads(on_host("ctl01", "cat", "/etc/gpuinfra/scheduled-checks.json").stdout)
    settings = json.dumps({**installed, "every": 1, "history": f"{SCHEDULED_TEST}.jsonl"})
    written = on_host("ctl01", "sh", "-c", shlex.quote(f"echo {shlex.quote(settings)} > {SCHEDULED_TEST}.json"))
    assert written.returncode == 0, written.stderr
    reason = "gpuinfra: maintenance (test)"
    alices = ""
    try:
        alices = _alice("gpu01", "sleep 600")
        wait_for("alice's job on gpu01", lambda: _job(alices)[0] == "RUNNING", 60)
        assert on_host("gpu02", SWITCH, "--checks", "dcgm-slow").returncode == 0
        started = _scheduled_pass()
        assert list(started) == ["gpu02"], started
        check = started["gpu02"]
        wait_for("the check job running", lambda: _job(check)[0] == "RUNNING", 60)
        inventory = inventory_yaml(load_cluster(SANDBOX_CLUSTER).resolved)
        drain = {"node_drain_reason": reason, "node_drain_wait": True, "node_drain_timeout": 60, "node_drain_poll": 2}
        result = run_playbook(
            inventory, RunOptions(playbook="drain.yml", limit="gpu02", extra_vars=drain), hosts=["gpu02"]
        )
        assert result.outcome in (Outcome.OK, Outcome.CHANGED), result.failures or result.errors
        assert _job(check)[0].split()[0] == "CANCELLED", _job(check)
        assert node("gpu02") == ("drained", reason), node("gpu02")
        # A user's job is waited for, never cancelled: gpu01 is still draining, alice's job running.
        options = RunOptions(playbook="drain.yml", limit="gpu01", extra_vars={**drain, "node_drain_wait": False})
        result = run_playbook(inventory, options, hosts=["gpu01"])
        assert result.outcome in (Outcome.OK, Outcome.CHANGED), result.failures or result.errors
        assert (node("gpu01")[0], _job(alices)[0]) == ("draining", "RUNNING"), (node("gpu01"), _job(alices))
    finally:
        on_host("gpu02", SWITCH, "--checks", "pass")
        if alices:
            on_host("ctl01", "scancel", alices)
        on_host("ctl01", "scancel", "--name=gpuinfra-scheduled-check")
        on_host("ctl01", "rm", "-f", *(f"{SCHEDULED_TEST}.{end}" for end in ("json", "state", "jsonl")))
        for host in ("gpu01", "gpu02"):
            on_host("ctl01", "scontrol", "update", f"NodeName={host}", "State=RESUME")
        _restore()
