"""A cluster's whole life on the sandbox's real daemons: every day-2 step leaves a cluster that serves.

The cluster is tests/sandbox/life/cluster.yml, its own sandbox (a controller and three GPU nodes, then four), with
the health program on at its 10 s interval. The steps build on each other, in file order:

1. converge;
2. a job per team, within its limits (nlp's GPU quota, normal's per-job and per-user limits), and preemption as
   configured (a scavenger job requeued, a spot job cancelled);
3. a fourth GPU node added while a job runs; then two-node jobs placed by the leaf switches (topology);
4. a driver upgrade to another real version (535.261.03 -> 535.309.01, bookworm-security): a canary, then a window
   of 2, each node restarted, a job running on the canary, and gpuinfra killed mid-run and run again;
5. a kernel update on gpu01: unattended-upgrades installs bookworm-backports' kernel, as a site that follows
   backports' kernels gets it, with its headers and a DKMS build while the node serves; then `gpuinfra upgrade
   --kernel` boots it, first stopped by a held dpkg lock, then by its failing health gate, then retried to the end
   (one node: each node's new kernel costs a DKMS build of about 5 minutes on 2 cores, and the window is step 4's);
6. the Munge key and the slurmdbd password rotated through ansible-vault with plain ansible-playbook, then the key
   through the secrets folder with gpuinfra apply;
7. the monitoring certificates at their renewal time;
8. hand-made drift of every kind a skipped role could hide, on five hosts at once;
9. a user taken out of the cluster file;
and after each of them a job on every GPU node and a no-op, and after every other one a job in a container (pyxis
and enroot, which the first apply built and gpu04 installed from the controller when it joined) on one of them,
each on the next node.

Each step runs inside `sampled()`: slurmctld's view of the GPU nodes is sampled every half second on the controller
through the step and after it, while the jobs run on every GPU node and the next plain apply (the no-op) changes
nothing, for at least 3 health intervals. No node may be out of service unless the step takes it out on purpose,
and none may be out after the step.

The driver image (`$GPUINFRA_NODE_IMAGE`, molecule/shared/build-driver-image) saves the first DKMS build on every
node. `gpuinfra sandbox down tests/sandbox/life/cluster.yml` removes the cluster; a run starts from it removed.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from harness import MARKS, ROOT, gpuinfra, last_reload, on_host, plain_playbook, scrape_health
from ruamel.yaml import YAML

from gpuinfra.model.grammar import duration_seconds
from gpuinfra.validate.load import load_cluster

LIFE = Path(__file__).resolve().parent / "life" / "cluster.yml"
# Makes a container image on a node from local files, as the quickstart does.
MAKE_IMAGE = Path(__file__).resolve().parents[2] / "scripts" / "make-busybox-image"
IMAGE = "/srv/images/busybox.sqsh"
SECRETS = Path.home() / ".local" / "share" / "gpuinfra" / "life" / "secrets"
OLD, NEW = "535.261.03", "535.309.01"
KERNEL_RELEASE = "bookworm-backports"
KERNEL_NODES = ("gpu01",)
SWITCH = "/usr/local/lib/gpuinfra-sandbox/gpuinfra-sandbox-gpu"
SERVING = {"idle", "mixed", "allocated", "completing", "planned"}
# States a node is taken out of service in, by an admin, a program or a failure. A node the controller has not
# heard from since it restarted is `unknown` for a few seconds: not out, but not serving either.
OUT = ("drain", "down", "fail", "maint", "reboot", "power", "inval")
RESERVED = "(reserved for maintenance)"
# A job in these states has not ended (squeue shows an ended job in its final state until it is purged).
ACTIVE = {"PENDING", "CONFIGURING", "RUNNING", "SUSPENDED", "COMPLETING", "REQUEUED", "RESIZING", "SIGNALING"}
CERT = "/etc/gpuinfra/monitoring-tls/host.crt"
SAMPLER, SAMPLES = "life-sinfo-sampler", "/var/tmp/life-sinfo-samples"

pytestmark = MARKS


@dataclass
class Life:
    """What the steps hand on: the cluster file of the moment and the GPU nodes it has."""

    file: Path = LIFE
    nodes: list[str] = field(default_factory=lambda: ["gpu01", "gpu02", "gpu03"])
    interval: int = duration_seconds(load_cluster(LIFE).model.health.check.interval)
    checked: int = 0
    """How many steps' checks have run: every other one's container job goes to the next GPU node."""


NOW = Life()


@pytest.fixture(scope="module")
def life() -> Life:
    """The cluster made anew: the steps start from a driver the upgrade can move away from.

    With GPUINFRA_LIFE_GO_ON=1 the cluster an earlier, stopped run left is kept, to go on from a later step
    (`-k test_5`, for one)."""
    if os.environ.get("GPUINFRA_LIFE_GO_ON") == "1":
        grown = json.loads(gpuinfra("sandbox", "status", str(LIFE), "--json").stdout)["state_dir"]
        resized = Path(grown) / f"{LIFE.stem}-4-gpu-nodes.yml"
        if resized.exists():
            NOW.file, NOW.nodes = resized, ["gpu01", "gpu02", "gpu03", "gpu04"]
        return NOW
    down = gpuinfra("sandbox", "down", str(LIFE))
    assert down.returncode == 0, down.stderr
    up = gpuinfra("sandbox", "up", str(LIFE))
    assert up.returncode == 0, up.stderr
    return NOW


def sh(host: str, script: str) -> subprocess.CompletedProcess[str]:
    return on_host(host, "sh", "-c", shlex.quote(script), cluster=NOW.file)


def ok(host: str, script: str) -> str:
    done = sh(host, script)
    assert done.returncode == 0, (host, script, done.stdout[-2000:], done.stderr[-2000:])
    return done.stdout


def apply_json(life: Life, *args: str) -> tuple[int, dict[str, Any]]:
    done = gpuinfra("apply", str(life.file), "--yes", "--json", "--detailed-exitcode", *args)
    assert done.stdout, done.stderr[-3000:]
    doc: dict[str, Any] = json.loads(done.stdout)
    return done.returncode, doc


def upgrade_json(life: Life, journal: Path, *args: str) -> tuple[int, dict[str, Any]]:
    done = gpuinfra("upgrade", str(life.file), "--yes", "--json", "--journal", str(journal), *args)
    assert done.stdout, done.stderr[-3000:]
    return done.returncode, json.loads(done.stdout)


# --- Slurm's view, sampled --------------------------------------------------------------------------------------


def _bare(state: str) -> str:
    return state.rstrip("*~#!%$@^-")


@dataclass(frozen=True)
class Sample:
    time: float
    nodes: dict[str, tuple[str, str]]
    """Node -> (state without its flags, reason)."""
    flagged: frozenset[str] = frozenset()
    """The nodes whose state carries a flag that keeps jobs off (`*` not responding, `$` maintenance, ...)."""

    def out(self) -> dict[str, str]:
        """The nodes taken out of service, with their reasons; a node reserved for maintenance has none, and shows
        as RESERVED (the admission gate's check job runs in such a reservation)."""
        return {
            node: reason or (RESERVED if "maint" in state else "")
            for node, (state, reason) in self.nodes.items()
            if any(word in state for word in OUT)
        }

    def not_serving(self) -> dict[str, str]:
        return {node: state for node, (state, _) in self.nodes.items() if state not in SERVING}


def _parse(text: str) -> list[Sample]:
    samples = []
    for line in text.splitlines():
        stamp, _, rest = line.partition(" ")
        rows = [row.split("|", 2) for row in rest.split(";") if row.count("|") == 2]
        flagged = frozenset(n for n, s, _ in rows if s.rstrip("-") != _bare(s))  # `-`: planned, still serving
        samples.append(Sample(float(stamp), {n: (_bare(s), "" if r == "none" else r) for n, s, r in rows}, flagged))
    return samples


Allowed = Callable[[str, str], bool]
"""Whether a node may be out of service with this reason during a step."""


def nothing_out(node: str, reason: str) -> bool:
    return False


def in_admission(reason: str) -> bool:
    """Out in the admission gate that ends a node's upgrade: drained for it, or reserved for its check job."""
    return reason in ("gpuinfra: admission", RESERVED)


@contextlib.contextmanager
def sampled(life: Life, allowed: Allowed = nothing_out) -> Iterator[list[Sample]]:
    """Sample sinfo on the controller through the block, and after it while the cluster `serves`, for at least 3
    health intervals; then check that only `allowed` nodes were taken out of service during the block, that every
    node served after it, and give the samples back."""
    script = (
        f"while :; do echo \"$(date +%s.%N) $(sinfo --noheader --Node --partition=vision --format='%N|%T|%E' "
        f"| tr '\\n' ';')\"; sleep 0.5; done > {SAMPLES}"
    )
    sh("ctl01", f"systemctl stop {SAMPLER}")  # one an earlier step's failure left running
    ok("ctl01", f"systemd-run --quiet --collect --unit={SAMPLER} sh -c {shlex.quote(script)}")
    before = periodic_checks(life)
    samples: list[Sample] = []
    yield samples
    ended = time.time()
    serves(life)
    time.sleep(max(0.0, ended + 3 * life.interval - time.time()))
    # The health loop still runs on every node: at least two periodic checks more than before the step, the last one
    # within 2 intervals. A node the step cut off from slurmctld (step 8's wrong Munge key: slurmctld cannot ask it
    # for a check) is given 10 intervals more to catch up once it is back.
    deadline = time.time() + 10 * life.interval
    while (behind := loop_behind(life, before)) and time.time() < deadline:
        time.sleep(life.interval / 2)
    ok("ctl01", f"systemctl stop {SAMPLER}")
    assert behind == {}, f"health checks not running (new checks, seconds since the last): {behind}"
    samples.extend(_parse(ok("ctl01", f"cat {SAMPLES}")))
    assert len(samples) > 6 * life.interval, f"only {len(samples)} samples"
    during = [(s.time, node, reason) for s in samples if s.time <= ended for node, reason in s.out().items()]
    assert all(allowed(node, reason) for _, node, reason in during), [d for d in during if not allowed(*d[1:])][:5]
    after = [(s.time - ended, s.not_serving()) for s in samples if s.time > ended and s.not_serving()]
    assert after == [], f"not serving after the step: {after[:5]}"


def loop_behind(life: Life, before: dict[str, tuple[int, float]]) -> dict[str, tuple[int, float]]:
    """The nodes whose health loop has not run two periodic checks since `before`, or none in the last 2 intervals:
    how many it ran since, and how long ago the last began."""
    now = time.time()
    return {
        node: (count - before.get(node, (0, 0.0))[0], round(now - last))
        for node, (count, last) in periodic_checks(life).items()
        if count < before.get(node, (0, 0.0))[0] + 2 or now - last >= 2 * life.interval + 5
    }


def periodic_checks(life: Life) -> dict[str, tuple[int, float]]:
    """Each GPU node's count of periodic health checks (slurmd's HealthCheckProgram), and when the last began, as
    the program keeps them in its state; (0, 0.0) on a node that never ran one."""
    out = {}
    for node in life.nodes:
        state = sh(node, "cat /var/lib/gpuinfra-health/state.json")
        run = json.loads(state.stdout).get("runs", {}).get("periodic", {}) if state.returncode == 0 else {}
        out[node] = (int(run.get("count", 0)), float(run.get("last", 0.0)))
    return out


def jobs_run_on_every_node(life: Life) -> None:
    """A plain job on every GPU node, and after every other step a job in a container (pyxis and enroot, from an
    image file the node makes once) on one of them, each on the next node, as alice. One job at a time: the normal
    QoS gives a job one GPU. (A container job costs seconds of unpacking and an image made on the node: after
    every step, or on every node, it would lengthen CI's longest stage by minutes.)"""
    for node in life.nodes:
        job = sh("ctl01", f"runuser -u alice -- srun --partition=vision --chdir=/tmp --immediate=120 "
                          f"--nodelist={node} --gres=gpu:1 hostname")  # fmt: skip
        assert (job.returncode, job.stdout.strip()) == (0, node), job.stderr
    step = life.checked
    life.checked += 1
    if step % 2:
        return
    node = life.nodes[step // 2 % len(life.nodes)]
    script = shlex.quote('. /etc/os-release; echo "$(hostname)|$PRETTY_NAME|$(id -un)"')
    ok(node, f"test -e {IMAGE} || bash -c {shlex.quote(MAKE_IMAGE.read_text())} make-image {IMAGE}")
    row = ok("ctl01", f"runuser -u alice -- srun --partition=vision --chdir=/tmp --immediate=120 "
                      f"--nodelist={node} --gres=gpu:1 --container-image={IMAGE} sh -c {script}")  # fmt: skip
    assert row.strip() == f"{node}|gpuinfra test image (busybox)|alice", row


def next_apply_changes_nothing(life: Life) -> None:
    code, doc = apply_json(life)
    assert (code, doc["changes"], doc["failures"]) == (0, [], []), (doc["changes"], doc["failures"])


def serves(life: Life) -> None:
    """The checks after every step."""
    jobs_run_on_every_node(life)
    next_apply_changes_nothing(life)


def sbatch(user: str, *options: str, seconds: int = 300) -> str:
    """A batch job that sleeps; its id."""
    done = sh("ctl01", f"runuser -u {user} -- sbatch --parsable --chdir=/tmp --output=/dev/null "
                       f"{' '.join(options)} --wrap='sleep {seconds}'")  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().split(";")[0]


def state(job: str) -> tuple[str, str]:
    """The job's state and, while it waits, the reason; empty once it has left the controller's queue."""
    found, _, reason = sh("ctl01", f"squeue --noheader --jobs={job} --format='%T|%r'").stdout.strip().partition("|")
    return found, reason


def wait_for(job: str, wanted: str, reason: str | None = None, timeout: int = 90) -> None:
    deadline = time.monotonic() + timeout
    while (now := state(job)) != (wanted, reason if reason is not None else now[1]):
        assert time.monotonic() < deadline, f"job {job}: {now}, not {wanted} {reason or ''}"
        time.sleep(1)


def submit(user: str, partition: str, node: str, seconds: int) -> str:
    """A running batch job holding one GPU of `node` for `seconds`; its id."""
    job = sbatch(user, f"--partition={partition}", f"--nodelist={node}", "--gres=gpu:1", seconds=seconds)
    wait_for(job, "RUNNING")
    return job


def finished(job: str, timeout: int = 600) -> tuple[str, str, float]:
    """Wait for a job's end; its state, exit code and end time, from Slurm's accounting."""
    deadline = time.monotonic() + timeout
    while state(job)[0] in ACTIVE:
        assert time.monotonic() < deadline, f"job {job} still runs"
        time.sleep(2)
    row = ok("ctl01", f"sacct --noheader --parsable2 --allocations --jobs={job} --format=State,ExitCode,End")
    ended, code, end = row.strip().split("|")
    return ended.split()[0], code, float(ok("ctl01", f"date -d {shlex.quote(end)} +%s"))


def _entries(journal: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in journal.read_text().splitlines()] if journal.exists() else []


def with_driver(life: Life, version: str) -> None:
    yaml = YAML()
    data = yaml.load(life.file.read_text())
    data["driver"]["version"] = version
    with life.file.open("w") as out:
        yaml.dump(data, out)


# --- The steps --------------------------------------------------------------------------------------------------


def test_1_converge(life: Life) -> None:
    with sampled(life, allowed=lambda node, reason: True):  # nodes join the cluster during the first apply
        code, doc = apply_json(life)
        assert code in (0, 2) and doc["failures"] == [], doc["failures"]


def test_2_a_job_per_team_within_its_limits_and_preempted_as_configured(life: Life) -> None:
    with sampled(life):
        for user, partition, account in (("alice", "vision", "vision"), ("bob", "nlp", "nlp")):
            done = sh("ctl01", f"runuser -u {user} -- srun --partition={partition} --chdir=/tmp --gres=gpu:1 "
                               "--immediate=120 sh -c 'echo $SLURM_JOB_ACCOUNT'")  # fmt: skip
            assert (done.returncode, done.stdout.strip()) == (0, account), done.stderr

        # nlp's quota of 2 GPUs (GrpTRES): a third waits.
        held = [submit("bob", "nlp", node, 300) for node in ("gpu01", "gpu02")]
        third = sbatch("bob", "--partition=nlp", "--gres=gpu:1")
        wait_for(third, "PENDING", "AssocGrpGRES")
        ok("ctl01", f"scancel {' '.join([*held, third])}")

        # normal's limits: 1 GPU per job, 3 jobs per user.
        two = sbatch("alice", "--gres=gpu:2")
        wait_for(two, "PENDING", "QOSMaxGRESPerJob")
        held = [submit("alice", "vision", node, 300) for node in ("gpu01", "gpu02", "gpu03")]
        fourth = sbatch("alice", "--gres=gpu:1")
        wait_for(fourth, "PENDING", "QOSMaxJobsPerUserLimit")
        ok("ctl01", f"scancel {' '.join([two, *held, fourth])}")

        # A scavenger job is requeued for a normal one (the cluster's mode)...
        scavenged = [sbatch("bob", "--partition=scavenger", "--qos=scavenger", "--nodelist=gpu03", "--gres=gpu:1")
                     for _ in range(2)]  # fmt: skip
        for job in scavenged:
            wait_for(job, "RUNNING")
        urgent = sbatch("alice", "--partition=vision", "--nodelist=gpu03", "--gres=gpu:1", seconds=5)
        wait_for(urgent, "RUNNING")
        requeued = [job for job in scavenged if state(job)[0] != "RUNNING"]
        assert len(requeued) == 1 and state(requeued[0])[0] == "PENDING", [state(job) for job in scavenged]
        assert "Restarts=1 " in ok("ctl01", f"scontrol show job {requeued[0]}")
        ok("ctl01", f"scancel {' '.join(scavenged)}")

        # ... and a spot job is cancelled (its QoS's mode).
        spot = [sbatch("alice", "--partition=scavenger", "--qos=spot", "--nodelist=gpu02", "--gres=gpu:1")
                for _ in range(2)]  # fmt: skip
        for job in spot:
            wait_for(job, "RUNNING")
        urgent = sbatch("bob", "--partition=nlp", "--nodelist=gpu02", "--gres=gpu:1", seconds=5)
        wait_for(urgent, "RUNNING")
        preempted = [job for job in spot if state(job)[0] != "RUNNING"]
        assert [finished(job, timeout=60)[0] for job in preempted] == ["PREEMPTED"], preempted
        ok("ctl01", f"scancel {' '.join(spot)}")


def test_3_a_gpu_node_added_while_a_job_runs(life: Life) -> None:
    job = submit("bob", "nlp", "gpu01", 150)
    slurmd = {node: slurmd_started(node) for node in life.nodes}
    loaded = last_reload(life.file, "https")
    started = time.time()
    with sampled(life, allowed=lambda node, reason: node == "gpu04" and in_admission(reason)) as samples:
        up = gpuinfra("sandbox", "up", str(LIFE), "--gpu-nodes", "4", "--json")
        assert up.returncode == 0, up.stderr
        life.file = Path(json.loads(up.stdout)["file"])
        life.nodes.append("gpu04")
        code, doc = apply_json(life)
        assert code == 2 and doc["failures"] == [], doc["failures"]
        # Configless: the new node and the controller change; no other node's role runs, nor its slurmd restarts.
        assert {c["host"] for c in doc["changes"]} == {"ctl01", "gpu04"}, doc["changes"]
        assert {node: slurmd_started(node) for node in slurmd} == slurmd
        # Prometheus reads the new node's target from its file_sd file: no reload, and the node is scraped.
        assert last_reload(life.file, "https") == loaded
        address = load_cluster(life.file).resolved.hosts["gpu04"].address
        health = scrape_health(life.file, "https")
        assert health.get(f"https://{address}:9100/metrics") == "up", health
    assert finished(job)[:2] == ("COMPLETED", "0:0")

    # The new machine went into service through the admission gate, held out from before its slurmd registered
    # (until then slurmctld lists it not responding, `idle*`): never serving before the gate took it for its check
    # (from then on it is the gate's, in a reservation for root alone), and no job but the gate's ran on it before
    # its DCGM diagnostic passed.
    admitted = admission_times(started)
    assert set(admitted) == {"gpu04"}, admitted
    taken = admitted["gpu04"] - admission_seconds(started)["gpu04"]
    early = [s for s in samples if "gpu04" in s.nodes and s.time < taken]
    serving = [(s.time, s.nodes["gpu04"]) for s in early if s.nodes["gpu04"][0] in SERVING and "gpu04" not in s.flagged]
    assert early and serving == [], (taken, serving[:5])
    jobs = ok("ctl01", "SLURM_TIME_FORMAT=%s sacct --allusers --allocations --noheader --parsable2 "
                       "--nodelist=gpu04 --starttime=now-1hour --format=JobName,Start")  # fmt: skip
    ran = [line.split("|") for line in jobs.splitlines()]
    assert [name for name, start in ran if start.isdigit() and int(start) < admitted["gpu04"]] == [
        "gpuinfra-admission"
    ], ran


def admissions(since: float) -> list[dict[str, Any]]:
    """The admissions that passed since `since`, from the controller's history."""
    history = ok("ctl01", "cat /var/lib/gpuinfra/admission/history.jsonl").splitlines()
    return [e for e in map(json.loads, history) if e["verdict"] == "pass" and e["time"] > since]


def admission_times(since: float) -> dict[str, float]:
    """Node -> when the admission gate put it in service, for the admissions that passed since `since`."""
    return {e["node"]: e["time"] for e in admissions(since)}


def admission_seconds(since: float) -> dict[str, float]:
    """Node -> how long its admission took, from the gate's drain to its verdict."""
    return {e["node"]: e["seconds"] for e in admissions(since)}


def slurmd_started(node: str) -> str:
    """When slurmd's unit last became active: a restart moves it."""
    return ok(node, "systemctl show --property=ActiveEnterTimestampMonotonic --value slurmd.service").strip()


def nodes(job: str) -> str:
    return ok("ctl01", f"squeue --noheader --jobs={job} --format=%N").strip()


def test_3_b_two_node_jobs_kept_under_one_leaf_switch(life: Life) -> None:
    """cluster.yml's leaves: gpu[01-02] under leaf1, gpu[03-04] under leaf2 (gpu04 joined in step 3), a root switch
    above both. A node is held by a job on both its CPUs (no GPU, so no team limit applies)."""
    with sampled(life):
        held = [sbatch("bob", "--partition=nlp", "--nodelist=gpu02", "--cpus-per-task=2")]
        wait_for(held[0], "RUNNING")
        # gpu01, gpu03 and gpu04 are free: one switch means leaf2's two, where the lowest-numbered pair would span.
        one_leaf = sbatch("alice", "--nodes=2", "--switches=1")
        wait_for(one_leaf, "RUNNING")
        assert nodes(one_leaf) == "gpu[03-04]"
        ok("ctl01", f"scancel {one_leaf}")

        # With gpu04 held too, the free gpu01 and gpu03 span both leaves: the job waits for a leaf to free up...
        held.append(sbatch("bob", "--partition=nlp", "--nodelist=gpu04", "--cpus-per-task=2"))
        wait_for(held[1], "RUNNING")
        waiting = sbatch("alice", "--nodes=2", "--switches=1@10:00")
        time.sleep(15)
        assert state(waiting) == ("PENDING", "Resources"), state(waiting)
        ok("ctl01", f"scancel {held[1]}")
        wait_for(waiting, "RUNNING")
        assert nodes(waiting) == "gpu[03-04]"
        ok("ctl01", f"scancel {waiting}")

        # ... while a job that allows any number of switches spans the leaves through the root switch.
        held.append(sbatch("bob", "--partition=nlp", "--nodelist=gpu04", "--cpus-per-task=2"))
        wait_for(held[2], "RUNNING")
        spanning = sbatch("alice", "--nodes=2")
        wait_for(spanning, "RUNNING")
        assert nodes(spanning) == "gpu[01,03]"
        ok("ctl01", f"scancel {spanning} {' '.join(held)}")


def test_4_a_rolling_driver_upgrade_with_a_canary_a_window_of_two_and_a_crash(life: Life, tmp_path: Path) -> None:
    journal = tmp_path / "upgrade.jsonl"
    with_driver(life, NEW)
    job = submit("alice", "vision", "gpu01", 60)  # the canary drains only when it ends
    started = time.time()
    upgrade = f"gpuinfra: driver upgrade to {NEW}"
    with sampled(life, allowed=lambda node, reason: reason == upgrade or in_admission(reason)) as samples:
        first = subprocess.Popen(  # killed once the canary drains, as a crash would
            [sys.executable, "-m", "gpuinfra", "upgrade", str(life.file), "--yes", "--json", "--journal", str(journal)],
            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + 300
        while ("gpu01", "draining") not in {(e["node"], e["state"]) for e in _entries(journal)}:
            assert first.poll() is None and time.monotonic() < deadline, "the canary never started draining"
            time.sleep(1)
        first.kill()
        first.wait()
        code, report = upgrade_json(life, journal)
        assert code == 0, (report["message"], report.get("nodes"))
    assert {n: (r["state"], r["found"], r["left"]) for n, r in report["nodes"].items()} == dict.fromkeys(
        life.nodes, ("resumed", OLD, NEW)
    )

    # The job ran to its end, and only then did the canary go down for its upgrade.
    ended, code_, end = finished(job)
    assert (ended, code_) == ("COMPLETED", "0:0")
    upgrading = {e["node"]: e["time"] for e in _entries(journal) if e["state"] == "upgrading"}
    assert end <= upgrading["gpu01"], (end, upgrading)

    # The canary alone first; then never more than the window of 2 out at once, and the window used.
    outs = [set(s.out()) for s in samples]
    canary = [i for i, out in enumerate(outs) if "gpu01" in out]
    assert canary and all(out <= {"gpu01"} for out in outs[: canary[-1] + 1]), "the canary did not go alone"
    assert max(len(out) for out in outs) == 2, max(outs, key=len)

    # Every node went back into service through the admission gate: its DCGM diagnostic passed as a Slurm job.
    admitted = admission_times(started)
    assert set(admitted) == set(life.nodes), admitted
    assert all(upgrading[node] < admitted[node] for node in life.nodes), (upgrading, admitted)

    # Every node restarted during its own upgrade.
    for node in life.nodes:
        inspect = subprocess.run(["podman", "inspect", "--format", "{{.State.StartedAt}}", f"life-{node}"],
                                 capture_output=True, text=True, check=True)  # fmt: skip
        booted = float(subprocess.run(["date", "-d", inspect.stdout.strip().rsplit(" ", 1)[0], "+%s.%N"],
                                      capture_output=True, text=True, check=True).stdout)  # fmt: skip
        assert started < upgrading[node] < booted, (node, upgrading[node], booted)
        dkms = ok(node, "dpkg-query -W -f '${Version}' nvidia-kernel-dkms")
        smi = ok(node, "/usr/local/lib/gpuinfra-sandbox/nvidia-smi -q -x")
        pin = json.loads(ok(node, "cat /etc/gpuinfra/health.json"))["policy"]["driver_version"]
        assert (dkms.startswith(NEW), f"<driver_version>{NEW}</driver_version>" in smi, pin) == (True, True, NEW)


def _kernel_update(life: Life, journal: Path, *args: str) -> tuple[int, dict[str, Any]]:
    return upgrade_json(life, journal, "--kernel", "--limit", ",".join(KERNEL_NODES),
                        "-e", f"node_upgrade_kernel_release={KERNEL_RELEASE}", *args)  # fmt: skip


# A site that follows backports' kernels: backports among unattended-upgrades' origins, the kernel metapackages
# pinned to it.
SITE_ORIGINS = 'Unattended-Upgrade::Origins-Pattern { "origin=Debian Backports,codename=bookworm-backports"; };'
SITE_PIN = """Package: linux-image-amd64 linux-headers-amd64 linux-image-6.* linux-headers-6.* linux-kbuild-6.*
Pin: release n=bookworm-backports
Pin-Priority: 500
"""


def test_5_a_kernel_from_unattended_upgrades_booted_through_a_held_lock_and_a_failing_health_gate(
    life: Life, tmp_path: Path
) -> None:
    journal = tmp_path / "kernel.jsonl"
    kernels = {node: set(ok(node, "ls /lib/modules").split()) for node in KERNEL_NODES}
    for node in KERNEL_NODES:  # the site takes its newer kernel from backports, signed by the archive's key
        # The test nodes' compilers go through the machine's ccache (molecule/shared/tasks/compiler-cache.yml);
        # backports' kernel builds its modules with the target-prefixed name, which must go through it too.
        ok(node, "if [ -x /usr/bin/ccache ]; then ln -sf /usr/bin/ccache /usr/local/bin/x86_64-linux-gnu-gcc-12; fi")
        ok(node, f"printf '%s\\n' 'Types: deb' 'URIs: http://deb.debian.org/debian' 'Suites: {KERNEL_RELEASE}' "
                 "'Components: main' 'Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg' "
                 "> /etc/apt/sources.list.d/backports.sources")  # fmt: skip
        ok(node, f"printf '%s\\n' {shlex.quote(SITE_ORIGINS)} > /etc/apt/apt.conf.d/60site-origins && "
                 f"printf '%s' {shlex.quote(SITE_PIN)} > /etc/apt/preferences.d/site-backports-kernel.pref && "
                 "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install --yes --no-install-recommends "
                 "unattended-upgrades")  # fmt: skip

    # 0. unattended-upgrades installs the kernel (cluster.yml allows it) with its headers, and DKMS builds the
    #    module inside its dpkg run: no node leaves service meanwhile, and nothing reboots.
    with sampled(life):
        for node in KERNEL_NODES:
            ok(node, "unattended-upgrade --verbose")
    for node in KERNEL_NODES:
        (release,) = set(ok(node, "ls /lib/modules").split()) - kernels[node]
        ok(node, f"dpkg-query --show linux-headers-{release}")
        assert ok(node, f"dkms status -k {release} nvidia-current/{NEW}").strip().endswith("installed"), node

    with sampled(
        life, allowed=lambda node, reason: reason.startswith("gpuinfra: kernel update") or in_admission(reason)
    ):
        # 1. unattended-upgrades holds dpkg's lock on the canary: the run waits, names the holder, and stops there.
        lock = "import fcntl, time; f = open('/var/lib/dpkg/lock-frontend', 'w'); fcntl.lockf(f, 2); time.sleep(900)"
        ok("gpu01", f"systemd-run --quiet --collect --unit=life-dpkg-lock python3 -c {shlex.quote(lock)}")
        code, report = _kernel_update(life, journal, "-e", "node_upgrade_lock_timeout=15")
        assert code == 1 and report["nodes"]["gpu01"]["state"] == "failed", report
        assert "python3 (PID " in report["nodes"]["gpu01"]["reason"], report["nodes"]["gpu01"]
        ok("gpu01", "systemctl stop life-dpkg-lock")

        # 2. The canary's GPU fails after the update: the health gate keeps it drained with the reason.
        ok("gpu01", f"{SWITCH} xid79")
        code, report = _kernel_update(life, journal, "--retry-failed")
        assert code == 1 and report["nodes"]["gpu01"]["reason"].startswith("health: "), report["nodes"]["gpu01"]
        sinfo = ok("ctl01", "sinfo --noheader --Node --nodes=gpu01 --format='%T|%E'")
        assert sinfo.startswith("drained|gpuinfra: kernel update failed") and "health" in sinfo, sinfo

        # 3. Repaired, the retry takes it to the end.
        ok("gpu01", f"{SWITCH} healthy && gpuinfra-health --clear-xids --no-action")
        code, report = _kernel_update(life, journal, "--retry-failed")
        assert code == 0 and {n: r["state"] for n, r in report["nodes"].items()} == dict.fromkeys(
            KERNEL_NODES, "resumed"
        ), report
    for node in KERNEL_NODES:
        new = set(ok(node, "ls /lib/modules").split()) - kernels[node]
        assert len(new) == 1, (node, new)
        (release,) = new
        assert ok(node, f"dkms status -k {release} nvidia-current/{NEW}").strip().endswith("installed"), node


def _hashes(life: Life, path: str) -> set[str]:
    return {ok(host, f"sha256sum < {path}").split()[0] for host in ["ctl01", *life.nodes]}


def test_6_secrets_rotated_through_the_vault_and_through_the_secrets_folder(life: Life, tmp_path: Path) -> None:
    key, password = secrets.token_urlsafe(96), secrets.token_urlsafe(24)
    vault = tmp_path / "vault.yml"
    vault.write_text(json.dumps({"munge_key": key, "slurm_dbd_db_password": password}))
    vault_password = tmp_path / "vault-password"
    vault_password.write_text(secrets.token_urlsafe(24))
    vault_password.chmod(0o600)
    encrypt = subprocess.run(
        [Path(sys.executable).parent / "ansible-vault", "encrypt", "--vault-password-file", str(vault_password),
         str(vault)], capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert encrypt.returncode == 0, encrypt.stderr
    vault_args = ("-e", f"@{vault}", "--vault-password-file", str(vault_password))

    job = submit("alice", "vision", "gpu03", 90)
    with sampled(life):
        stats = plain_playbook(life.file, tmp_path, *vault_args)
        assert all(failures == 0 for _, failures, _ in stats.values()), stats
        assert _hashes(life, "/etc/munge/munge.key") == {hashlib.sha256(key.encode()).hexdigest()}
        assert f"StoragePass={password}" in ok("ctl01", "cat /etc/slurm/slurmdbd.conf").splitlines()
        ok("ctl01", "sacctmgr --noheader --parsable2 show cluster")  # slurmdbd reaches MariaDB with it
        again = plain_playbook(life.file, tmp_path, *vault_args)
        assert again == dict.fromkeys(["ctl01", *life.nodes], (0, 0, 0)), again
        jobs_run_on_every_node(life)

        # gpuinfra apply knows only the secrets folder: moving the key out makes it write and install a new one.
        vaulted = _hashes(life, "/etc/munge/munge.key")
        (SECRETS / "munge.key").rename(tmp_path / "munge.key.old")
        code, doc = apply_json(life)
        assert code == 2 and doc["failures"] == [], doc["failures"]
        rotated = _hashes(life, "/etc/munge/munge.key")
        assert rotated == {hashlib.sha256((SECRETS / "munge.key").read_bytes()).hexdigest()} and rotated != vaulted
    assert finished(job)[:2] == ("COMPLETED", "0:0")


def test_7_the_monitoring_certificates_at_their_renewal_time(life: Life) -> None:
    """Each host's certificate as it is 810 days on (15 left, inside the 30-day renewal margin): re-signed by the
    cluster's CA for 15 days, in the secrets folder and on the host. One plain apply renews every one."""
    hosts = ["ctl01", *life.nodes]
    folder = SECRETS / "monitoring-tls"
    for host in hosts:
        base = folder / host
        subprocess.run(["openssl", "req", "-new", "-key", f"{base}.key", "-subj", f"/CN={host}", "-out", f"{base}.csr"],
                       check=True, capture_output=True)  # fmt: skip
        subprocess.run(["openssl", "x509", "-req", "-in", f"{base}.csr", "-CA", str(SECRETS / "monitoring-ca.crt"),
                        "-CAkey", str(SECRETS / "monitoring-ca.key"), "-days", "15", "-extfile", f"{base}.ext",
                        "-out", f"{base}.crt"], check=True, capture_output=True)  # fmt: skip
        copy = subprocess.run(["podman", "cp", f"{base}.crt", f"life-{host}:{CERT}"],
                              capture_output=True, text=True, check=False)  # fmt: skip
        assert copy.returncode == 0, copy.stderr
        assert sh(host, f"openssl x509 -noout -checkend 2592000 -in {CERT}").returncode == 1, host
    with sampled(life):
        code, doc = apply_json(life)
        assert code == 2 and doc["failures"] == [], doc["failures"]
    for host in hosts:  # valid for the role's 825 days again
        assert sh(host, f"openssl x509 -noout -checkend 70000000 -in {CERT}").returncode == 0, host
    # Prometheus scrapes every host over HTTPS with the renewed certificates, and answers over HTTPS itself.
    health = scrape_health(life.file, "https")
    assert set(health.values()) == {"up"} and len(health) >= len(hosts), health
    assert all(url.startswith("https://") for url in health), health


# Every kind of drift a skipped role could hide, two at most per host, each in a role of its own (on gpu04 the
# receipts folder opened makes every role run, so its other drift is in no other host's roles).
DRIFT = {
    "ctl01": ("systemctl disable --now prometheus-node-exporter",
              "systemctl is-enabled prometheus-node-exporter && systemctl is-active prometheus-node-exporter"),
    "gpu01": ("chmod 0755 /etc/munge && apt-mark unhold libnvidia-ml1", 'test "$(stat -c %a /etc/munge)" = 700 '
              "&& apt-mark showhold | grep -qx libnvidia-ml1"),
    # A slurm.conf copy on a configless node, which its client commands would read instead of slurmd's fetched
    # one; and nvidia-smi alone, off the pin (its libraries stay), as a half-finished upgrade leaves it.
    "gpu02": ("cp /run/slurm/conf/slurm.conf /etc/slurm/ && echo DebugFlags=Gres >> /etc/slurm/slurm.conf && "
              f"cd /tmp && apt-get download -q nvidia-smi={OLD}-1 && dpkg -i --force-depends nvidia-smi_*.deb && "
              "rm -f nvidia-smi_*.deb",
              "test ! -e /etc/slurm/slurm.conf && test -z \"$(dpkg --audit)\" && "
              f"dpkg-query -W -f '${{Version}}' nvidia-smi | grep -q '^{NEW}'"),
    "gpu03": ("systemctl mask --now prometheus-node-exporter && head -c 1024 /dev/urandom > /etc/munge/munge.key "
              "&& systemctl restart munge", "systemctl is-active prometheus-node-exporter"),
    "gpu04": ("chmod 0777 /etc/gpuinfra /var/lib/gpuinfra/receipts", 'test "$(stat -c %a /etc/gpuinfra)" = 755 '
              '&& test "$(stat -c %a /var/lib/gpuinfra/receipts)" = 700'),
}  # fmt: skip


def test_8_hand_made_drift_put_back_by_one_plain_apply(life: Life) -> None:
    """Nine kinds of drift on five hosts, then one plain apply: only those hosts change, and every drift is put
    back (gpu03's Munge key to the secrets folder's)."""
    checks = {host: check for host, (_, check) in DRIFT.items()}
    key = hashlib.sha256((SECRETS / "munge.key").read_bytes()).hexdigest()
    checks["gpu03"] += f" && sha256sum < /etc/munge/munge.key | grep -q {key}"
    for host, (make, _) in DRIFT.items():
        ok(host, make)
        assert sh(host, checks[host]).returncode != 0, host
    with sampled(life):
        code, doc = apply_json(life)
        assert code == 2 and doc["failures"] == [], doc["failures"]
        assert {c["host"] for c in doc["changes"]} == set(DRIFT), doc["changes"]
    for host, check in checks.items():
        assert sh(host, check).returncode == 0, host


def test_9_a_user_taken_out_of_the_cluster_file_loses_access(life: Life) -> None:
    """bob leaves nlp in the cluster file: one plain apply removes his association, so Slurm refuses his jobs."""
    yaml = YAML()
    data = yaml.load(life.file.read_text())
    data["slurm"]["accounts"]["nlp"]["users"] = []
    with life.file.open("w") as out:
        yaml.dump(data, out)
    with sampled(life):
        code, doc = apply_json(life)
        assert code == 2 and doc["failures"] == [], doc["failures"]
    assert ok("ctl01", "sacctmgr --noheader --parsable2 show assoc where user=bob format=Account").strip() == ""
    refused = sh("ctl01", "runuser -u bob -- srun --partition=nlp --chdir=/tmp --immediate=30 true")
    assert refused.returncode != 0 and "Invalid account" in refused.stderr, refused.stderr
