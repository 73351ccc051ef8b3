"""The reports' Prometheus side against a real Prometheus: exporter-format DCGM samples with `hpc_job` labels,
backfilled with `promtool tsdb create-blocks-from openmetrics`, served by the Debian `prometheus` binary on a free
localhost port. The queries are the ones the playbook sends (built by gpuinfra.report.prometheus, POSTed as
forms), and every figure is checked against one computed here from the samples themselves.

The last tests run playbooks/report.yml's Prometheus play on this machine against the same server, with basic
auth on and the password read from a secrets folder, as on a cluster.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gpuinfra.report import time_range
from gpuinfra.report.collect import REPORT_PLAYBOOK, from_artifacts, playbook_vars
from gpuinfra.report.idle import IdleRule, idle_gpus, idle_report
from gpuinfra.report.prometheus import (
    FB_USED,
    UTIL,
    Query,
    idle_query,
    matrix_series,
    matrix_totals,
    usage_queries,
)
from gpuinfra.report.sacct import JobRecord
from gpuinfra.report.squeue import RunningJob
from gpuinfra.report.time_range import TimeRange
from gpuinfra.report.usage import job_metrics, usage_report
from gpuinfra.run import RunOptions, run_playbook

PROMETHEUS = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")
pytestmark = [
    pytest.mark.tools,  # runs Prometheus, promtool and Ansible (tests/unit/tool_guard.py)
    pytest.mark.skipif(
        PROMETHEUS is None or PROMTOOL is None, reason="prometheus/promtool are missing (Debian package prometheus)"
    ),
]

T0 = 1714521600  # 2024-05-01T00:00:00Z: the samples' time, far enough back to be plain history
SCRAPE_S = 30
PASSWORD = "report-test-password-0123456789"  # a throwaway password for the test server
# bcrypt of PASSWORD, for Prometheus's web config; made with Debian's Python (crypt on libxcrypt), as the
# prometheus role hashes it on hosts.
HASH_SCRIPT = "import crypt, sys; print(crypt.crypt(sys.argv[1], crypt.mksalt(crypt.METHOD_BLOWFISH, rounds=1024)))"


@dataclass(frozen=True)
class Sample:
    metric: str
    labels: dict[str, str]
    ts: float
    value: float


def _gpu(instance: str, gpu: str, job: str | None) -> dict[str, str]:
    """Labels as the DCGM exporter sets them (plus the scrape's instance), hpc_job only on allocated GPUs."""
    labels = {"gpu": gpu, "UUID": f"GPU-{instance}-{gpu}", "Hostname": instance, "instance": instance}
    if job is not None:
        labels["hpc_job"] = job
    return labels


def _series(metric: str, labels: dict[str, str], first: float, values: list[float]) -> list[Sample]:
    return [Sample(metric, labels, first + i * SCRAPE_S, v) for i, v in enumerate(values)]


def usage_samples() -> list[Sample]:
    """Three jobs over the first two hours after T0, an unallocated GPU, and a job with memory only."""
    out: list[Sample] = []
    # Job 101: two GPUs for 90 minutes from T0+10m, steady: 80 % and 40 %, 1000 and 3000 MiB.
    for gpu, util, fb in (("0", 80.0, 1000.0), ("1", 40.0, 3000.0)):
        out += _series(UTIL, _gpu("gpu01", gpu, "101"), T0 + 600, [util] * 180)
        out += _series(FB_USED, _gpu("gpu01", gpu, "101"), T0 + 600, [fb] * 180)
    # Job 102: one GPU from T0, a ramp 0, 1, ..., 239 % (mod 100) every scrape for two hours.
    ramp = [float(i % 100) for i in range(240)]
    out += _series(UTIL, _gpu("gpu02", "0", "102"), T0, ramp)
    out += _series(FB_USED, _gpu("gpu02", "0", "102"), T0, [500.0 + i for i in range(240)])
    # No job on this GPU: no hpc_job label, never counted.
    out += _series(UTIL, _gpu("gpu02", "1", None), T0, [0.0] * 240)
    out += _series(FB_USED, _gpu("gpu02", "1", None), T0, [0.0] * 240)
    return out


END = T0 + 4 * 3600  # the idle report's "now"
IDLE = 2.0
BUSY = 70.0


def idle_samples() -> list[Sample]:
    """Jobs running up to END, one sample every 30 s ending 3 s before END, each pattern oldest first."""

    def recent(minutes: int, values: list[float]) -> tuple[float, list[float]]:
        assert len(values) == minutes * 2 + 1
        return END - 3 - minutes * 60, values

    out: list[Sample] = []
    patterns: dict[tuple[str, str, str | None], tuple[float, list[float]]] = {
        # idle for 40 minutes: listed, 40 minutes
        ("gpu03", "0", "201"): recent(40, [IDLE] * 81),
        # busy, then idle for the last 20 minutes: shorter than idle_for (30m), not listed
        ("gpu03", "1", "202"): recent(40, [BUSY] * 41 + [IDLE] * 40),
        # idle, but one busy sample 10 minutes ago: not listed
        ("gpu03", "2", "203"): recent(60, [IDLE] * 100 + [BUSY] + [IDLE] * 20),
        # at the threshold exactly (10 %): not below it, not listed
        ("gpu03", "3", "206"): recent(40, [10.0] * 81),
        # two GPUs, one idle for an hour and one busy: listed with one idle GPU, 60 minutes
        ("gpu04", "0", "204"): recent(60, [IDLE] * 121),
        ("gpu04", "1", "204"): recent(60, [BUSY] * 121),
        # idle for 45 minutes under a job Slurm no longer runs: reported apart
        ("gpu04", "2", "205"): recent(45, [IDLE] * 91),
        # no job: never counted, whatever its utilisation
        ("gpu04", "3", None): recent(60, [0.0] * 121),
    }
    for (instance, gpu, job), (first, values) in patterns.items():
        out += _series(UTIL, _gpu(instance, gpu, job), first, values)
    return out


def openmetrics(samples: list[Sample]) -> str:
    """The exporter's text format, as OpenMetrics with timestamps: each family's samples together, each series in
    time order."""
    lines: list[str] = []
    for metric in sorted({s.metric for s in samples}):
        lines.append(f"# TYPE {metric} gauge")
        mine = sorted((s for s in samples if s.metric == metric), key=lambda s: (sorted(s.labels.items()), s.ts))
        for s in mine:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
            lines.append(f"{metric}{{{labels}}} {s.value:g} {s.ts:.3f}")
    return "\n".join(lines) + "\n# EOF\n"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass(frozen=True)
class Server:
    url: str
    port: int
    password: str | None

    def post(self, query: Query, password: str | None = None) -> dict[str, Any]:
        """The playbook's request: a POST of the query's form fields to /api/v1/<path>."""
        request = urllib.request.Request(
            f"{self.url}/api/v1/{query.path}", data=urllib.parse.urlencode(query.params).encode(), method="POST"
        )
        secret = password if password is not None else self.password
        if secret is not None:
            import base64

            token = base64.b64encode(f"prometheus:{secret}".encode()).decode()
            request.add_header("Authorization", f"Basic {token}")
        with urllib.request.urlopen(request, timeout=60) as answer:
            body: dict[str, Any] = json.load(answer)
            return body


def _bcrypt(password: str) -> str | None:
    python = Path("/usr/bin/python3")
    if not python.is_file():
        return None
    done = subprocess.run(
        [str(python), "-W", "ignore", "-c", HASH_SCRIPT, password], capture_output=True, text=True, check=False
    )
    return done.stdout.strip() if done.returncode == 0 and done.stdout.startswith("$2") else None


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A real Prometheus on the backfilled samples, with basic auth where a bcrypt hash can be made here."""
    assert PROMETHEUS is not None and PROMTOOL is not None
    tmp = tmp_path_factory.mktemp("prometheus")
    source = tmp / "samples.om"
    source.write_text(openmetrics(usage_samples() + idle_samples()))
    data = tmp / "data"
    subprocess.run(
        [PROMTOOL, "tsdb", "create-blocks-from", "openmetrics", str(source), str(data)],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    (tmp / "prometheus.yml").write_text("global:\n  scrape_interval: 30s\nscrape_configs: []\n")
    args = [
        PROMETHEUS,
        f"--config.file={tmp / 'prometheus.yml'}",
        f"--storage.tsdb.path={data}",
        "--storage.tsdb.retention.time=100y",
    ]
    hashed = _bcrypt(PASSWORD)
    if hashed:
        (tmp / "web.yml").write_text(f"basic_auth_users:\n  prometheus: {json.dumps(hashed)}\n")
        args.append(f"--web.config.file={tmp / 'web.yml'}")
    port = _free_port()
    args.append(f"--web.listen-address=127.0.0.1:{port}")
    log = (tmp / "prometheus.log").open("w")
    process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
    found = Server(f"http://127.0.0.1:{port}", port, PASSWORD if hashed else None)
    try:
        _wait_ready(found, process, tmp / "prometheus.log")
        yield found
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


def _wait_ready(server: Server, process: subprocess.Popen[bytes], log: Path) -> None:
    import time

    probe = Query("ready", "query", {"query": "vector(1)", "time": str(T0)})
    for _ in range(300):
        if process.poll() is not None:
            raise RuntimeError(f"prometheus exited: {log.read_text()[-2000:]}")
        try:
            if server.post(probe)["status"] == "success":
                return
        except (urllib.error.URLError, ConnectionError):
            pass
        time.sleep(0.1)
    raise RuntimeError(f"prometheus did not answer: {log.read_text()[-2000:]}")


def expected_totals(samples: list[Sample], since: int, until: int) -> dict[str, dict[str, float]]:
    """What the usage queries must sum to: every sample of an allocated GPU with since < ts <= until."""
    out: dict[str, dict[str, float]] = {}
    for s in samples:
        job = s.labels.get("hpc_job")
        if not job or not since < s.ts <= until:
            continue
        for fn, amount in (("sum_over_time", s.value), ("count_over_time", 1.0)):
            totals = out.setdefault(f"{s.metric}:{fn}", {})
            totals[job] = totals.get(job, 0.0) + amount
    return out


def _totals(server: Server, window: TimeRange) -> dict[str, dict[str, float]]:
    return {q.name: matrix_totals(server.post(q)) for q in usage_queries(window)}


def test_usage_queries_sum_exactly_the_samples_in_the_window(server: Server) -> None:
    # From T0+30m to T0+1h30m: job 101 is cut at both ends (it ran T0+10m..T0+1h40m), job 102 at the start.
    window = TimeRange(T0 + 1800, T0 + 5400).chunked()
    assert window == TimeRange(T0 + 1800, T0 + 5400)
    got = _totals(server, window)
    want = expected_totals(usage_samples(), window.since, window.until)
    assert set(got) == set(want)
    for name in want:
        assert got[name] == pytest.approx(want[name]), name
    # By hand: job 101's two GPUs have one sample each every 30 s at T0+600+30k; those after T0+1800 up to
    # T0+5400 are k = 41..160, 120 samples per GPU.
    assert got[f"{UTIL}:count_over_time"]["101"] == 240
    assert got[f"{UTIL}:sum_over_time"]["101"] == pytest.approx(120 * 80 + 120 * 40)


def test_a_window_in_several_pieces_counts_each_sample_once(server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    """Pieces of 20 minutes whose ends fall exactly on sample times (T0 + multiples of 30 s)."""
    monkeypatch.setattr(time_range, "CHUNK_S", 1200)
    window = TimeRange(T0, T0 + 7200).chunked()
    assert (window, window.step_s) == (TimeRange(T0, T0 + 7200), 1200)
    assert usage_queries(window)[0].params == {
        "query": usage_queries(window)[0].params["query"],
        "start": str(T0 + 1200),
        "end": str(T0 + 7200),
        "step": "1200",
    }
    got = _totals(server, window)
    want = expected_totals(usage_samples(), window.since, window.until)
    for name in want:
        assert got[name] == pytest.approx(want[name]), name
    # Job 102's ramp from T0: the sample at T0 itself is outside (since, until], the other 239 are in.
    assert got[f"{UTIL}:count_over_time"]["102"] == 239
    assert got[f"{UTIL}:sum_over_time"]["102"] == pytest.approx(sum(float(i % 100) for i in range(1, 240)))


def test_the_join_gives_each_job_and_account_its_gpu_weighted_means(server: Server) -> None:
    window = TimeRange(T0 + 1800, T0 + 5400)
    metrics = job_metrics(_totals(server, window))
    records = [
        JobRecord("101", "101", "alice", "vision", "vision", "COMPLETED", T0 + 600, T0 + 6000, 5400, 2),
        JobRecord("102", "102", "bob", "nlp", "nlp", "COMPLETED", T0, T0 + 7200, 7200, 1),
        JobRecord("103", "103", "bob", "nlp", "nlp", "COMPLETED", T0 + 60, T0 + 660, 600, 1),  # no samples
    ]
    report = usage_report(records, window, metrics)
    jobs = {job.record.job_id: job for job in report.jobs}
    assert jobs["101"].util_pct == pytest.approx(60.0)  # (80 + 40) / 2, both GPUs sampled alike
    assert jobs["101"].fb_used_mib == pytest.approx(2000.0)
    ramp = [float(i % 100) for i in range(240)]
    in_window = [v for i, v in enumerate(ramp) if T0 + 1800 < T0 + 30 * i <= T0 + 5400]
    assert jobs["102"].util_pct == pytest.approx(sum(in_window) / len(in_window))
    # Job 103 ended before the window: no GPU time in it, not listed.
    assert "103" not in jobs
    # Account nlp is job 102 alone; vision is job 101; together weighted by GPU-seconds in the window.
    seconds = {"101": 2 * 3600, "102": 3600}
    assert {j: jobs[j].gpu_seconds for j in seconds} == seconds
    total = report.total()
    nlp_util = jobs["102"].util_pct
    assert nlp_util is not None  # job 102 was sampled (above)
    want = (60.0 * seconds["101"] + nlp_util * seconds["102"]) / (seconds["101"] + seconds["102"])
    assert total.mean_util_pct == pytest.approx(want)
    assert {g.name: g.mean_util_pct for g in report.groups("by_account")} == {
        "vision": pytest.approx(60.0),
        "nlp": pytest.approx(jobs["102"].util_pct),
    }


def test_a_job_without_samples_says_so(server: Server) -> None:
    window = TimeRange(T0 + 1800, T0 + 5400)
    metrics = job_metrics(_totals(server, window))
    record = JobRecord("999", "999", "carol", "vision", "vision", "COMPLETED", T0 + 1800, T0 + 3600, 1800, 1)
    report = usage_report([record], window, metrics)
    [row] = report.as_dict()["jobs"]
    assert (row["mean_util_pct"], row["util_note"]) == (None, "n/a (no GPU metrics for this job)")
    assert report.as_dict()["by_account"][0]["util_note"] == "n/a (no GPU metrics for these jobs)"


IDLE_RULE = IdleRule(threshold_pct=10.0, for_s=1800, step_s=SCRAPE_S)
RUNNING = {
    job: RunningJob(job, user, account, "vision", gpus)
    for job, user, account, gpus in (
        ("201", "alice", "vision", 1),
        ("202", "alice", "vision", 1),
        ("203", "bob", "nlp", 1),
        ("204", "bob", "nlp", 2),
        ("206", "bob", "nlp", 1),
    )
}


def test_idle_report_lists_the_gpus_the_alert_would_fire_for(server: Server) -> None:
    lookback = IDLE_RULE.lookback_s()
    query = idle_query(END, lookback, IDLE_RULE.query_step_s())
    series = matrix_series(server.post(query))
    # The day before END holds the usage jobs' series too (ended two hours earlier): returned, never idle now.
    assert {s.labels.get("hpc_job") for s in series} == {"101", "102", "201", "202", "203", "204", "205", "206"}
    report = idle_report(IDLE_RULE, idle_gpus(series, IDLE_RULE, END - lookback, END), RUNNING)
    listed = {j.job.job_id: (len(j.gpus), j.idle_minutes, j.at_least) for j in report.jobs}
    # By hand: a step at t reads the sample at t - 3 s; job 201's first idle sample is END - 3 - 40 min, so the
    # steps from END - 40 min to END are idle: 40 minutes. Job 204's idle GPU: 60 minutes.
    assert listed == {"201": (1, 40, False), "204": (1, 60, False)}
    assert [(g.job_id, g.gpu, g.idle_s // 60) for g in report.unknown] == [("205", "gpu04:2", 45)]
    assert report.jobs[0].job.job_id == "204"  # longest idle first among jobs with as many idle GPUs


def test_the_playbook_queries_prometheus_with_its_password(server: Server, tmp_path: Path) -> None:
    """playbooks/report.yml's Prometheus play, run on this machine: the same answers as the direct POSTs."""
    secrets = tmp_path / "secrets"
    secrets.mkdir(mode=0o700)
    (secrets / "monitoring-prometheus-password").write_text(PASSWORD)
    window = TimeRange(T0 + 1800, T0 + 5400)
    queries = usage_queries(window)
    collected = _run_report_play(server, secrets, queries)
    assert [answer.error for answer in collected.answers] == [None] * len(queries)
    got = {a.query.name: matrix_totals(a.body) for a in collected.answers}
    assert got == _totals(server, window)


def test_a_wrong_password_is_reported_as_prometheus_answered(server: Server, tmp_path: Path) -> None:
    if server.password is None:
        pytest.skip("no bcrypt hash could be made here (Debian's /usr/bin/python3 with crypt), so no basic auth")
    secrets = tmp_path / "secrets"
    secrets.mkdir(mode=0o700)
    (secrets / "monitoring-prometheus-password").write_text("not-the-password-at-all")
    collected = _run_report_play(server, secrets, usage_queries(TimeRange(T0, T0 + 3600))[:1])
    [answer] = collected.answers
    assert answer.status == 401
    assert answer.error is not None and "HTTP 401" in answer.error


def _run_report_play(server: Server, secrets: Path, queries: list[Query]) -> Any:
    local = {
        "ansible_connection": "local",
        "ansible_python_interpreter": sys.executable,
        "ansible_host": "127.0.0.1",
    }
    inventory = {
        "all": {
            "vars": {
                "prometheus_port": server.port,
                "prometheus_basic_auth": server.password is not None,
                "gpuinfra_secrets_dir": str(secrets),
            },
            "children": {"monitoring": {"hosts": {"mon01": local}}},
        }
    }
    options = RunOptions(playbook=REPORT_PLAYBOOK, limit="mon01", extra_vars=playbook_vars("none", queries))
    result = run_playbook(inventory, options, hosts=["mon01"])
    assert result.rc == 0, (result.failures, result.errors)
    assert PASSWORD not in json.dumps(result.artifacts)
    return from_artifacts(result.artifacts, "none", queries)
