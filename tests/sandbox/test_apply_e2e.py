"""`gpuinfra apply` against the sandbox cluster: podman containers with systemd, reached over real SSH.

This is the test of the whole stack (playbooks/site.yml, as a user runs it); each role's own Molecule scenario is
under molecule/.

The steps build on each other (converge -> re-apply -> check), so they run in file order in one module. The
sandbox is brought up once (`gpuinfra sandbox up` is idempotent) and left running, so the next run starts from a
converged cluster; `gpuinfra sandbox down` removes it. `$GPUINFRA_NODE_IMAGE` picks the hosts' image for a sandbox
that does not exist yet (the driver image saves the DKMS build on both GPU nodes).

Every exit code of apply is reached here: 0 (nothing changed), 1 (failed: unreachable host), 2 (changes, with
--detailed-exitcode), 3 (invalid input) and 4 (timeout). 130 (cancelled) is tested in tests/unit/test_apply_cli.py.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

import pytest
from harness import MARKS, ROOT, SANDBOX_CLUSTER, VENV_ENV, gpuinfra, on_host, plain_playbook, scrape_health
from ruamel.yaml import YAML

# A file the driver role writes on every GPU node (the unattended-upgrades blacklist): cheap to take away and
# for apply to put back.
MANAGED_FILE = "/etc/apt/apt.conf.d/51gpuinfra-nvidia-driver"


# Makes the quickstart's container image on a node from local files (scripts/quickstart runs it the same way).
MAKE_IMAGE = ROOT / "scripts" / "make-busybox-image"

# tests/infra is the suite users run on a fleet: on the sandbox's emulated GPUs its checks that need a GPU skip (its
# GPU tier), so it runs without CI's rule that a skip fails, and the test below allows those skips and no other.
FLEET_SUITE_ENV = {key: value for key, value in VENV_ENV.items() if key != "CI"}
GPU_ABSENT = re.compile(r"no NVIDIA GPU on this host|the module cannot load here")


pytestmark = MARKS


def apply_json(cluster: Path, *args: str) -> tuple[int, dict[str, Any]]:
    done = gpuinfra("apply", str(cluster), "--json", *args)
    assert done.stdout, done.stderr
    doc: dict[str, Any] = json.loads(done.stdout)
    assert doc["exit_code"] == done.returncode
    return done.returncode, doc


@pytest.fixture(scope="module")
def sandbox() -> Path:
    up = gpuinfra("sandbox", "up")
    assert up.returncode == 0, up.stderr
    return SANDBOX_CLUSTER


@pytest.fixture(scope="module")
def converged(sandbox: Path) -> tuple[int, dict[str, Any]]:
    """The module's first apply, which converges the sandbox: for every test that needs a converged sandbox,
    whichever of them runs first (`-k` may pick one alone)."""
    return apply_json(sandbox, "--yes", "--detailed-exitcode")


def test_the_sandbox_hosts_have_their_fake_gpus(sandbox: Path) -> None:
    listing = on_host("gpu01", "ls", "/dev")
    assert listing.returncode == 0, listing.stderr
    assert {"nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm"} <= set(listing.stdout.split())
    assert "nvidia2" not in listing.stdout.split()
    assert on_host("ctl01", "ls", "/dev/nvidia0").returncode != 0


def test_apply_converges_then_reapply_changes_nothing(sandbox: Path, converged: tuple[int, dict[str, Any]]) -> None:
    code, first = converged
    assert first["failures"] == [], first["failures"]
    assert code in (0, 2) and first["targets"] == ["ctl01", "gpu01", "gpu02"]
    code, second = apply_json(sandbox, "--yes", "--detailed-exitcode")
    assert second["failures"] == [], second["failures"]
    assert (code, second["status"], second["changes"]) == (0, "ok", [])
    assert {name: stats["changed"] for name, stats in second["hosts"].items()} == dict.fromkeys(second["hosts"], 0)


def test_plain_ansible_playbook_with_the_inventory_plugin_changes_nothing(
    sandbox: Path, converged: tuple[int, dict[str, Any]], tmp_path: Path
) -> None:
    """`ansible-playbook -i cluster.yml gpuinfra.cluster.site` without gpuinfra's CLI, with docs/ansible.cfg, on
    the sandbox apply converged: the inventory plugin gives the playbooks the inputs apply gives them, so nothing
    changes. The outcome is read from the JSON callback's stats, never from printed output."""
    assert converged[1]["failures"] == [], converged[1]["failures"]
    outcome = plain_playbook(sandbox, tmp_path)
    assert outcome == dict.fromkeys(["ctl01", "gpu01", "gpu02"], (0, 0, 0)), outcome


def test_a_gpu_job_runs_on_both_gpu_nodes_through_slurm(sandbox: Path) -> None:
    """The README's main job ends with this job (scripts/quickstart): one GPU on each GPU node."""
    # ssh joins the words into one line for the remote shell, so the script is quoted once more.
    script = shlex.quote('echo "$(hostname) $CUDA_VISIBLE_DEVICES"')
    srun = ["runuser", "-u", "alice", "--", "srun", "--partition=vision", "--chdir=/tmp", "--immediate=120",
            "--nodes=2", "--ntasks-per-node=1", "--gres=gpu:1"]  # fmt: skip
    job = on_host("ctl01", *srun, "bash", "-c", script)
    assert job.returncode == 0, job.stderr
    lines = sorted(line.split() for line in job.stdout.splitlines())
    assert [host for host, _ in lines] == ["gpu01", "gpu02"], job.stdout
    assert all(visible in ("0", "1") for _, visible in lines), job.stdout


def test_the_same_job_runs_in_a_container_as_alice(sandbox: Path) -> None:
    """The quickstart's container job, on Debian 13's Slurm 24.11 with the pyxis and enroot packages the first
    apply built on ctl01: an image file each GPU node makes (no registry), one GPU on each node, the task inside the
    image as alice with its GPU variable."""
    for node in ("gpu01", "gpu02"):
        image = "/srv/images/busybox.sqsh"
        made = on_host(node, "bash", "-c", shlex.quote(MAKE_IMAGE.read_text()), "make-image", image)
        assert made.returncode == 0, made.stderr
    script = shlex.quote('. /etc/os-release; echo "$(hostname)|$PRETTY_NAME|$(id -un)|$CUDA_VISIBLE_DEVICES"')
    srun = ["runuser", "-u", "alice", "--", "srun", "--partition=vision", "--chdir=/tmp", "--immediate=120",
            "--nodes=2", "--ntasks-per-node=1", "--gres=gpu:1",
            "--container-image=/srv/images/busybox.sqsh"]  # fmt: skip
    job = on_host("ctl01", *srun, "sh", "-c", script)
    assert job.returncode == 0, job.stderr
    rows = sorted(line.split("|") for line in job.stdout.splitlines())
    assert [row[:3] for row in rows] == [
        [node, "gpuinfra test image (busybox)", "alice"] for node in ("gpu01", "gpu02")
    ], job.stdout
    assert all(row[3] in ("0", "1") for row in rows), job.stdout


def _uid(user: str) -> str:
    done = on_host("gpu01", "id", "-u", user)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def _folder(path: str) -> str:
    done = on_host("gpu01", "stat", "-c", shlex.quote("%U %a"), path)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_one_users_containers_are_out_of_anothers_reach(sandbox: Path) -> None:
    """enroot's folders on a GPU node: the prolog made alice's own (0700, hers) for her container job, under
    parents only root can write. bob can neither read hers nor make one in her name; a folder planted in her name
    (as the 1777 parents of older releases allowed) is replaced by her own at her next job, and her container still
    runs. Made with 1777 parents again, or without the prolog's check of the owner, this fails."""
    alice, bob = _uid("alice"), _uid("bob")
    parents = ["/var/lib/enroot/data", "/var/lib/enroot/cache", "/run/enroot"]
    for parent in parents:
        assert _folder(parent) == "root 755", parent
        assert _folder(f"{parent}/user-{alice}") == "alice 700", parent
    as_bob = ["runuser", "-u", "bob", "--"]
    for parent in parents:
        assert on_host("gpu01", *as_bob, "ls", f"{parent}/user-{alice}").returncode != 0, parent
        made = on_host("gpu01", *as_bob, "mkdir", f"{parent}/user-{alice}/pyxis_mine")
        assert "Permission denied" in made.stderr, (parent, made.stderr)
        made = on_host("gpu01", *as_bob, "mkdir", f"{parent}/user-{int(bob) + 1}")
        assert "Permission denied" in made.stderr, (parent, made.stderr)

    planted = f"/var/lib/enroot/data/user-{alice}"
    plant = f"rm -rf {planted} && install -d -o bob -m 0777 {planted} && touch {planted}/planted"
    assert on_host("gpu01", "sh", "-c", shlex.quote(plant)).returncode == 0
    srun = ["runuser", "-u", "alice", "--", "srun", "--partition=vision", "--chdir=/tmp", "--immediate=120",
            "--nodelist=gpu01", "--gres=gpu:1", "--container-image=/srv/images/busybox.sqsh"]  # fmt: skip
    job = on_host("ctl01", *srun, "sh", "-c", shlex.quote(". /etc/os-release; echo $PRETTY_NAME $(id -un)"))
    assert (job.returncode, job.stdout.strip()) == (0, "gpuinfra test image (busybox) alice"), job.stderr
    assert _folder(planted) == "alice 700"
    assert on_host("gpu01", "test", "-e", f"{planted}/planted").returncode != 0


def test_every_partition_serves_both_gpu_nodes_and_monitoring_runs(sandbox: Path) -> None:
    """The rest of site.yml's end state: each partition of the cluster file, and monitoring at work."""
    sinfo = on_host("ctl01", "sinfo", "--noheader", shlex.quote("--format=%R %D %G"))
    assert sinfo.returncode == 0, sinfo.stderr
    partitions = ["nlp 2 gpu:l4:2", "scavenger 2 gpu:l4:2", "vision 2 gpu:l4:2"]
    assert sorted(sinfo.stdout.splitlines()) == ["gpuinfra 2 gpu:l4:2", *partitions]
    # gpuinfra's own partition, where the admission gate's check jobs run, is root's: users neither see nor use it.
    seen = on_host("ctl01", "runuser", "-u", "alice", "--", "sinfo", "--noheader", "--format=%R")
    assert sorted(seen.stdout.split()) == ["nlp", "scavenger", "vision"], seen.stdout
    sbatch = ["runuser", "-u", "alice", "--", "sbatch", "--partition=gpuinfra", "--chdir=/tmp", "--wrap", "hostname"]
    refused = on_host("ctl01", *sbatch)
    assert refused.returncode != 0 and "Access/permission denied" in refused.stderr, refused.stderr
    units = {
        "ctl01": ["prometheus-node-exporter", "prometheus", "prometheus-alertmanager"],
        "gpu01": ["prometheus-node-exporter", "gpuinfra-dcgm-exporter"],
        "gpu02": ["prometheus-node-exporter", "gpuinfra-dcgm-exporter"],
    }
    for host, names in units.items():
        active = on_host(host, "systemctl", "is-active", *names)
        assert active.stdout.split() == ["active"] * len(names), (host, active.stdout)
    # HTTPS with basic auth: Prometheus scrapes every host's node exporter, the GPU nodes' DCGM exporters (the
    # sandbox's stand-in behind the real web configuration), Alertmanager and itself.
    health = scrape_health(sandbox, "https")
    assert set(health.values()) == {"up"} and len(health) >= 7, health
    assert all(url.startswith("https://") for url in health), health
    assert {f"https://10.213.42.1{i}:9400/metrics" for i in (1, 2)} <= set(health), health


def test_a_template_in_a_value_is_written_literally_and_runs_nothing(sandbox: Path, tmp_path: Path) -> None:
    """A real run of the alertmanager role, with a webhook URL holding a lookup that would touch a file on the
    controller. The cluster file's grammar refuses such a URL, so it is set behind validation's back: the layer
    under test is the inventory, which hands every value to Ansible as unsafe. Nothing runs, the literal text
    lands in alertmanager.yml, byte-identical to what `gpuinfra plan` renders; the original config is put back."""
    from gpuinfra.render.inventory import inventory_yaml
    from gpuinfra.render.plan import render
    from gpuinfra.render.vars import monitoring
    from gpuinfra.run import RunOptions, run_playbook
    from gpuinfra.validate.load import load_cluster

    marker = tmp_path / "MARKER"
    url = "http://ctl01:9099/alerts?x={{lookup('pipe','touch${IFS}" + str(marker) + "')}}"
    loaded = load_cluster(sandbox)
    mon = loaded.model.monitoring
    receiver = mon.receivers["local"].model_copy(update={"url": url})
    receivers = {**mon.receivers, "local": receiver}
    model = loaded.model.model_copy(update={"monitoring": mon.model_copy(update={"receivers": receivers})})
    tampered = dataclasses.replace(loaded, resolved=dataclasses.replace(loaded.resolved, model=model))
    playbook = RunOptions(playbook=ROOT / "tests" / "sandbox" / "playbooks" / "alertmanager.yml")
    try:
        result = run_playbook(inventory_yaml(tampered.resolved), playbook)
        assert result.rc == 0, result.status
        assert not marker.exists(), "the lookup ran on the controller"
        written = on_host("ctl01", "cat", "/etc/prometheus/alertmanager.yml")
        assert written.returncode == 0, written.stderr
        assert url in written.stdout
        [planned] = render(tampered.resolved, [a for a in monitoring.ARTIFACTS if a.template == "alertmanager.yml.j2"])
        assert planned.content == written.stdout, "plan and apply wrote different files"
    finally:
        assert run_playbook(inventory_yaml(loaded.resolved), playbook).rc == 0, "the original config was not put back"


def test_the_testinfra_suite_passes_on_the_gpu_nodes(sandbox: Path, tmp_path: Path) -> None:
    """tests/infra, as a user runs it against a real fleet: over SSH, with the inventory gpuinfra renders."""
    from gpuinfra.render.inventory import inventory_yaml
    from gpuinfra.validate.load import load_cluster

    inventory = tmp_path / "inventory.json"  # the YAML inventory plugin reads JSON as YAML
    inventory.write_text(json.dumps(inventory_yaml(load_cluster(sandbox).resolved)))
    report = tmp_path / "report.xml"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(ROOT / "tests" / "infra"),
         "--hosts=ansible://gpu_nodes", f"--ansible-inventory={inventory}", f"--junitxml={report}"],
        cwd=ROOT, capture_output=True, text=True, timeout=600, check=False, env=FLEET_SUITE_ENV,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    suite = ElementTree.parse(report).getroot().find("testsuite")
    assert suite is not None
    ran = int(suite.get("tests", 0)) - int(suite.get("skipped", 0))
    # Both nodes: DKMS per kernel, nouveau, held packages, unattended-upgrades; what needs a GPU skips, and only that.
    assert ran >= 8 and int(suite.get("failures", 0)) == 0, done.stdout[-3000:]
    reasons = [skipped.get("message", "") for skipped in suite.iter("skipped")]
    assert all(GPU_ABSENT.search(reason) for reason in reasons), reasons


def test_check_reports_pending_changes_without_making_them(sandbox: Path) -> None:
    assert on_host("gpu01", "rm", "-f", MANAGED_FILE).returncode == 0
    code, doc = apply_json(sandbox, "--check", "--diff", "--detailed-exitcode")
    assert doc["failures"] == [], doc["failures"]
    assert (code, doc["status"], doc["check"]) == (2, "changed", True)
    assert {change["host"] for change in doc["changes"]} == {"gpu01"}
    # The diff is of the file's content: what --check would have written into the missing file.
    assert any("Unattended-Upgrade::Package-Blacklist" in change["diff"] for change in doc["changes"]), doc["changes"]
    assert on_host("gpu01", "test", "-e", MANAGED_FILE).returncode == 1, "--check wrote the file"
    # Without --detailed-exitcode, a run that changes something exits 0.
    code, doc = apply_json(sandbox, "--yes", "--limit", "gpu01")
    assert (code, doc["status"], doc["targets"]) == (0, "changed", ["gpu01"])
    assert on_host("gpu01", "test", "-e", MANAGED_FILE).returncode == 0


def test_check_after_apply_reports_nothing_pending(sandbox: Path) -> None:
    code, doc = apply_json(sandbox, "--check", "--detailed-exitcode")
    assert (code, doc["status"], doc["changes"]) == (0, "ok", [])


def test_a_no_op_apply_skips_the_roles_its_receipts_vouch_for_and_full_runs_them_all(
    sandbox: Path, converged: tuple[int, dict[str, Any]]
) -> None:
    """On the converged sandbox, a plain apply costs each GPU node one task, the probe: its receipts' checks found
    it healthy and in service. No play of site.yml has a host left, so site.yml is never loaded: the controller
    adds one task, the question that found that out. `--full` runs every task of every role of the host it is
    limited to, and finds nothing to change either (every role on every host runs in the plain ansible-playbook test
    above: once is enough of that cost)."""
    code, plain = apply_json(sandbox, "--yes", "--detailed-exitcode")
    assert (code, plain["changes"], plain["failures"]) == (0, [], [])
    assert Path(plain["playbook"]).name == "pending.yml", plain["hosts"]
    assert plain["hosts"]["ctl01"] == {**plain["hosts"]["ctl01"], "ok": 2, "skipped": 0}, plain["hosts"]["ctl01"]
    for host in ("gpu01", "gpu02"):
        assert plain["hosts"][host] == {**plain["hosts"][host], "ok": 1, "skipped": 0}, plain["hosts"][host]
    code, full = apply_json(sandbox, "--yes", "--full", "--limit", "gpu02", "--detailed-exitcode")
    assert (code, full["changes"], full["failures"]) == (0, [], [])
    assert plain["hosts"]["gpu02"]["ok"] * 20 < full["hosts"]["gpu02"]["ok"], (plain["hosts"], full["hosts"])
    receipts = [f"/var/lib/gpuinfra/receipts/{role}.json" for role in ("nvidia_driver", "munge", "slurm_compute")]
    modes = on_host("gpu01", "stat", "--format=%a", "/var/lib/gpuinfra/receipts", *receipts)
    assert modes.returncode == 0, modes.stderr
    assert modes.stdout.split() == ["700", "600", "600", "600"], modes.stdout


def test_timeout_exits_4(sandbox: Path) -> None:
    code, doc = apply_json(sandbox, "--yes", "--timeout", "1")
    assert (code, doc["status"]) == (4, "timeout")


def test_limit_matching_nothing_exits_3(sandbox: Path) -> None:
    code, doc = apply_json(sandbox, "--yes", "--limit", "no-such-host")
    assert (code, doc["status"]) == (3, "invalid")


def test_unreachable_host_fails_with_its_name(sandbox: Path, tmp_path: Path) -> None:
    cluster = _with_ghost_host(sandbox, tmp_path, "ghost01")
    code, doc = apply_json(cluster, "--yes", "--limit", "ghost01")
    assert (code, doc["status"]) == (1, "failed")
    assert [(f["host"], f["unreachable"]) for f in doc["failures"]] == [("ghost01", True)]
    assert "ghost01" in doc["failures"][0]["message"]
    # Human output names it too.
    done = gpuinfra("apply", str(cluster), "--yes", "--limit", "ghost01")
    assert done.returncode == 1
    assert "UNREACHABLE ghost01:" in done.stdout


def test_a_new_node_whose_machine_is_not_up_is_reported_and_the_rest_converges(sandbox: Path, tmp_path: Path) -> None:
    """gpu03 added to the GPU node group at an address no machine answers: slurm.conf names it by that address
    (NodeAddr), so slurmctld restarts without resolving it, the apply completes on every other host, and gpu03 is
    the one host reported. The original file's apply takes it out again."""
    yaml = YAML()
    data = yaml.load(_with_ghost_host(sandbox, tmp_path, "ghost01").read_text())
    del data["node_groups"]["ghosts"]
    gpu = data["node_groups"]["gpu"]
    gpu["hosts"], gpu["addresses"]["gpu03"] = "gpu[01-03]", "10.213.42.13"
    grown = tmp_path / "grown.yml"
    with grown.open("w") as out:
        yaml.dump(data, out)
    try:
        code, doc = apply_json(grown, "--yes")
        assert (code, doc["status"]) == (1, "failed"), doc.get("errors")
        assert [(f["host"], f["unreachable"]) for f in doc["failures"]] == [("gpu03", True)], doc["failures"]
        reached = {name: stats for name, stats in doc["hosts"].items() if name != "gpu03"}
        assert all(s["failed"] == 0 and s["unreachable"] == 0 and s["ok"] > 0 for s in reached.values()), reached
        node = on_host("ctl01", "scontrol", "show", "node", "gpu03")
        assert node.returncode == 0 and "NodeAddr=10.213.42.13" in node.stdout, node.stdout + node.stderr
        listed = on_host("ctl01", "sinfo", "--noheader", "--Node", "--nodes=gpu[01-02]", shlex.quote("--format=%N %t"))
        words = listed.stdout.split()
        states = dict(zip(words[::2], words[1::2], strict=True))  # a node once per partition
        assert set(states) == {"gpu01", "gpu02"} and set(states.values()) <= {"idle", "mix", "alloc"}, states
    finally:
        code, doc = apply_json(sandbox, "--yes")
        assert code == 0, doc.get("failures") or doc.get("errors")
    assert "gpu03" not in on_host("ctl01", "sinfo", "--noheader", "--Node", "--format=%N").stdout


def _with_ghost_host(sandbox: Path, tmp_path: Path, name: str) -> Path:
    """The sandbox cluster plus one host whose name does not resolve, written elsewhere with absolute key paths."""
    yaml = YAML()
    data = yaml.load(sandbox.read_text())
    connection = data.setdefault("connection", {})
    for key in ("ssh_key", "known_hosts_file"):
        if connection.get(key) and not Path(connection[key]).expanduser().is_absolute():
            connection[key] = str((sandbox.parent / connection[key]).resolve())
    groups = data["node_groups"]
    ghost = copy.deepcopy(dict(groups["gpu"]))
    ghost["hosts"] = name
    ghost["addresses"] = {name: f"{name}.invalid"}
    groups["ghosts"] = ghost
    path = tmp_path / "cluster.yml"
    with path.open("w") as out:
        yaml.dump(data, out)
    return path
