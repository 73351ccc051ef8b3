"""Monitoring: role variables, the files `gpuinfra plan` renders (golden), the real validators (promtool, amtool),
the Slurm node state and job collectors, and the dashboards' queries against the metrics that exist.

Regenerate the golden files with `GPUINFRA_UPDATE_GOLDEN=1 pytest tests/unit/test_monitoring.py` and review the diff.
Tests that need promtool or amtool skip when the binary is missing (`.ci/apt-packages` installs them).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from functools import cache
from importlib.machinery import SourceFileLoader
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from ruamel.yaml import YAML

from gpuinfra.render.inventory import groups
from gpuinfra.render.plan import Rendered, render
from gpuinfra.render.vars import monitoring
from gpuinfra.validate.load import LoadedCluster, load_cluster

pytestmark = pytest.mark.tools  # runs Ansible or a system tool (tests/unit/tool_guard.py)

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "unit" / "golden" / "monitoring"
DATA = ROOT / "tests" / "unit" / "data" / "promtool"
DASHBOARDS = ROOT / "roles" / "grafana" / "files" / "dashboards"
COUNTERS = ROOT / "roles" / "dcgm_exporter" / "templates" / "counters.csv.j2"
COLLECTOR = ROOT / "roles" / "node_exporter" / "files" / "gpuinfra_slurm_metrics.py"
KERNEL_COLLECTOR = ROOT / "roles" / "kernel_updates" / "files" / "gpuinfra_kernel_updates.py"
HEALTH_PROGRAM = ROOT / "roles" / "gpu_health" / "files" / "gpuinfra_health.py"

PROMTOOL = shutil.which("promtool")
AMTOOL = shutil.which("amtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool is missing (Debian package prometheus)")
needs_amtool = pytest.mark.skipif(AMTOOL is None, reason="amtool is missing (Debian package prometheus-alertmanager)")

# A Slurm cluster with two GPU counts, every receiver type and TLS, basic auth and a non-default threshold.
FULL = """\
name: mon-full
driver: {version: "535.261.03"}
node_groups:
  ctl: {hosts: ctl01, roles: [slurm_controller, slurm_dbd, monitoring], addresses: {ctl01: 10.0.0.1}}
  h100: {hosts: "h100-[01-02]", roles: [slurm_compute], gpu: {model: H100-SXM5-80GB, count: 8}}
  l40s: {hosts: l40s-01, roles: [slurm_compute], gpu: {model: L40S, count: 4}}
slurm:
  partitions: {gpu: {node_groups: [h100, l40s], default: true}}
  accounts: {physics: {users: [alice]}}
monitoring:
  alerts: {gpu_temp_c: 80}
  receivers:
    oncall: {type: webhook, url: "https://alerts.example.org/hook"}
    mail: {type: email, to: hpc-admins@example.org, sender: alertmanager@example.org, smarthost: "smtp.example.org:587"}
    chat: {type: slack, channel: "#gpu", api_url_file: /etc/prometheus/slack-url}
  routes: {critical: [oncall, mail, chat], warning: [mail], info: [chat], teams: {physics: [oncall]}}
  tls: {cert_file: /etc/ssl/gpuinfra/host.crt, key_file: /etc/ssl/gpuinfra/host.key, ca_file: /etc/ssl/gpuinfra/ca.crt}
  basic_auth: true
"""


@cache
def _load(name: str) -> LoadedCluster:
    if name == "mon-full":
        path = Path(os.environ.get("TMPDIR", "/tmp")) / f"gpuinfra-test-{os.getpid()}-mon-full.yml"
        path.write_text(FULL)
        return load_cluster(path)
    return load_cluster(ROOT / "inventories" / name / "cluster.yml")


@cache
def rendered(name: str) -> dict[str, Rendered]:
    return {r.artifact.path: r for r in render(_load(name).resolved, only=list(monitoring.ARTIFACTS))}


def check_golden(path: Path, text: str) -> None:
    if os.environ.get("GPUINFRA_UPDATE_GOLDEN"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"missing golden file {path}; regenerate with GPUINFRA_UPDATE_GOLDEN=1"
    assert text == path.read_text()


def yaml_load(text: str) -> Any:
    return YAML(typ="safe").load(text)


def run(argv: list[str], cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, cwd=cwd, check=False)


# --- role variables and plan artifacts ------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["slurm-small", "k8s-mig", "mon-full"])
@pytest.mark.parametrize("artifact", monitoring.ARTIFACTS, ids=lambda a: Path(a.path).name)
def test_artifact_matches_golden(name: str, artifact: Any) -> None:
    if artifact.path not in rendered(name):  # only where its host role has a host: Slurm's on Slurm clusters
        assert not groups(_load(name).resolved)[artifact.host_role], artifact.path
        return
    check_golden(GOLDEN / name / artifact.path, rendered(name)[artifact.path].content)


def test_variables_say_what_the_model_says() -> None:
    """Spot checks, so that a regenerated golden file cannot silently bless a wrong mapping."""
    full = monitoring.group_vars(_load("mon-full").resolved)
    assert full["prometheus_alert_gpu_temp_c"] == 80
    assert full["prometheus_alert_slurm"] is True
    assert full["prometheus_alert_idle_allocated_labels"] == ["hpc_job"]
    assert full["dcgm_exporter_hpc_job_mapping_dir"] == "/var/lib/dcgm-exporter/job-mapping"
    assert full["node_exporter_slurm_state_hosts"] == ["ctl01"]
    assert full["node_exporter_listen_host"] == ""  # the cluster address, never 0.0.0.0 unless asked
    assert full["prometheus_client_tls_ca_file"] == "/etc/ssl/gpuinfra/ca.crt"
    assert full["alertmanager_routes"] == {
        "critical": ["oncall", "mail", "chat"],
        "warning": ["mail"],
        "info": ["chat"],
        "teams": {"physics": ["oncall"]},
    }

    k8s = monitoring.group_vars(_load("k8s-mig").resolved)
    assert k8s["prometheus_alert_idle_allocated_labels"] == ["pod"]
    assert k8s["dcgm_exporter_hpc_job_mapping_dir"] == ""
    assert k8s["node_exporter_slurm_state_hosts"] == []


AUTH_SWITCHES = (
    "node_exporter_basic_auth",
    "dcgm_exporter_basic_auth",
    "prometheus_basic_auth",
    "alertmanager_basic_auth",
    "grafana_prometheus_basic_auth",
)
LISTEN_HOSTS = tuple(f"{role}_listen_host" for role in monitoring.SERVERS)


def _vars(**changes: Any) -> dict[str, Any]:
    """The monitoring variables of the slurm-small example with `monitoring:` changed."""
    rc = _load("slurm-small").resolved
    model = rc.model.model_copy(update={"monitoring": rc.model.monitoring.model_copy(update=changes)})
    return monitoring.group_vars(dataclasses.replace(rc, model=model))


def test_the_kernel_update_limit_comes_from_the_cluster_file() -> None:
    assert _vars()["prometheus_alert_kernel_update_pending_s"] == 14 * 86400
    alerts = _load("slurm-small").resolved.model.monitoring.alerts
    alerts = alerts.model_copy(update={"kernel_update_pending_for": "36h"})
    assert _vars(alerts=alerts)["prometheus_alert_kernel_update_pending_s"] == 36 * 3600


def test_a_cluster_is_secure_by_default() -> None:
    """No `monitoring:` settings: basic auth everywhere, every service on the cluster address, plain HTTP."""
    default = monitoring.group_vars(_load("slurm-small").resolved)
    assert all(default[name] is True for name in AUTH_SWITCHES)
    assert all(default[name] == "" for name in LISTEN_HOSTS)
    assert default["gpuinfra_monitoring_tls_generated"] is False
    assert default["prometheus_client_tls"] is False and default["node_exporter_tls_cert_file"] == ""


def test_each_default_can_be_loosened() -> None:
    open_ = _vars(basic_auth=False, listen="any")
    assert all(open_[name] is False for name in AUTH_SWITCHES)
    assert all(open_[name] == "0.0.0.0" for name in LISTEN_HOSTS)


def test_tls_true_uses_the_generated_certificates() -> None:
    generated = _vars(tls=True)
    assert generated["gpuinfra_monitoring_tls_generated"] is True
    for role in monitoring.SERVERS:
        assert generated[f"{role}_tls_cert_file"] == "/etc/gpuinfra/monitoring-tls/host.crt"
        assert generated[f"{role}_tls_key_file"] == "/etc/gpuinfra/monitoring-tls/host.key"
    assert generated["prometheus_client_tls"] is True and generated["grafana_prometheus_tls"] is True
    assert generated["prometheus_client_tls_ca_file"] == "/etc/gpuinfra/monitoring-tls/ca.crt"
    assert generated["grafana_prometheus_tls_ca_file"] == "/etc/gpuinfra/monitoring-tls/ca.crt"


def test_tls_files_of_the_site_are_used_as_given() -> None:
    full = monitoring.group_vars(_load("mon-full").resolved)
    assert full["gpuinfra_monitoring_tls_generated"] is False
    assert {full[f"{role}_tls_cert_file"] for role in monitoring.SERVERS} == {"/etc/ssl/gpuinfra/host.crt"}
    assert {full[f"{role}_tls_key_file"] for role in monitoring.SERVERS} == {"/etc/ssl/gpuinfra/host.key"}


def test_the_roles_a_cluster_leaves_out_are_named_for_the_receipts_play() -> None:
    """Their plays then leave every host out (playbooks/receipts.yml), instead of skipping each task per host."""
    assert _vars()["gpuinfra_roles_left_out"] == ["monitoring_tls"]
    assert _vars(tls=True)["gpuinfra_roles_left_out"] == []
    some = _vars(components=["node_exporter", "prometheus"])
    assert some["gpuinfra_roles_left_out"] == ["dcgm_exporter", "alertmanager", "grafana", "monitoring_tls"]


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in _strings(k) + _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


@pytest.mark.parametrize("name", ["slurm-small", "k8s-mig", "mon-full"])
def test_variables_are_plain_data(name: str) -> None:
    """The inventory hands every string to Ansible as data, never a template: no Jinja in what Python renders."""
    rendered_vars = monitoring.group_vars(_load(name).resolved)
    templated = [s for s in _strings(rendered_vars) if "{{" in s or "{%" in s]
    assert templated == []
    assert not any(key.endswith("_secrets_dir") for key in rendered_vars)


def test_scrape_targets_come_from_the_inventory() -> None:
    config = yaml_load(rendered("mon-full")["monitoring/prometheus/prometheus.yml"].content)
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert set(jobs) == {"prometheus", "alertmanager", "node", "dcgm_exporter"}
    files = rendered("mon-full")
    # The exporters come from the target files Prometheus reads by itself (file_sd), so a new node leaves
    # prometheus.yml alone.
    assert jobs["node"]["file_sd_configs"] == [{"files": ["/etc/prometheus/targets/node.yml"]}]
    assert jobs["dcgm_exporter"]["file_sd_configs"] == [{"files": ["/etc/prometheus/targets/dcgm_exporter.yml"]}]
    node_file = yaml_load(files["monitoring/prometheus/targets/node.yml"].content)
    dcgm_file = yaml_load(files["monitoring/prometheus/targets/dcgm_exporter.yml"].content)
    node_targets = {c["labels"]["instance"]: c["targets"] for c in node_file}
    assert node_targets == {
        "ctl01": ["10.0.0.1:9100"],
        "h100-01": ["h100-01:9100"],
        "h100-02": ["h100-02:9100"],
        "l40s-01": ["l40s-01:9100"],
    }
    dcgm = {c["labels"]["instance"]: c["labels"]["gpus_expected"] for c in dcgm_file}
    assert dcgm == {"h100-01": "8", "h100-02": "8", "l40s-01": "4"}
    # Each service is scraped with its own password, read from a file: never one inline.
    password_files = {
        "prometheus": "/etc/prometheus/gpuinfra-prometheus-password",
        "alertmanager": "/etc/prometheus/gpuinfra-alertmanager-password",
        "node": "/etc/prometheus/gpuinfra-node-exporter-password",
        "dcgm_exporter": "/etc/prometheus/gpuinfra-dcgm-exporter-password",
    }
    for name, job in jobs.items():
        assert job["scheme"] == "https"
        assert job["tls_config"] == {"ca_file": "/etc/ssl/gpuinfra/ca.crt"}
        assert job["basic_auth"] == {"username": "prometheus", "password_file": password_files[name]}
    alerting = config["alerting"]["alertmanagers"][0]
    assert alerting["basic_auth"]["password_file"] == password_files["alertmanager"]
    assert "password:" not in rendered("mon-full")["monitoring/prometheus/prometheus.yml"].content


@pytest.mark.parametrize("name", ["mon-full", "k8s-mig", "slurm-small"])
def test_given_gpu_counts_are_what_the_role_finds_in_hostvars(name: str) -> None:
    """gpuinfra hands the prometheus role the DCGM exporters' GPU counts; the role alone reads them from hostvars."""
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar, trust_as_template

    from gpuinfra.render.inventory import group_vars, groups, host_vars

    rc = _load(name).resolved
    shared = group_vars(rc)
    defaults = yaml_load((ROOT / "roles" / "prometheus" / "defaults" / "main.yml").read_text())
    variables = {
        "groups": {"all": list(rc.hosts), **groups(rc)},
        "hostvars": {host: {**shared, **host_vars(h)} for host, h in rc.hosts.items()},
    }
    found = Templar(loader=DataLoader(), variables=variables).template(
        trust_as_template(defaults["prometheus_dcgm_exporter_gpu_counts"])
    )
    assert shared["prometheus_dcgm_exporter_gpu_counts"] == found
    assert found == {"mon-full": [4, 8], "k8s-mig": [], "slurm-small": [4, 8]}[name]


def test_kubernetes_gpu_nodes_are_left_to_the_operator() -> None:
    assert yaml_load(rendered("k8s-mig")["monitoring/prometheus/targets/dcgm_exporter.yml"].content) == []


def test_alertmanager_routes_each_team_and_severity_to_its_receivers() -> None:
    config = yaml_load(rendered("mon-full")["monitoring/alertmanager/alertmanager.yml"].content)
    routes = [(r["matchers"], r["receiver"], r["continue"]) for r in config["route"]["routes"]]
    assert routes == [
        (['account="physics"'], "oncall", True),
        (['severity="critical"'], "oncall", True),
        (['severity="critical"'], "mail", True),
        (['severity="critical"'], "chat", True),
        (['severity="warning"'], "mail", True),
        (['severity="info"'], "chat", True),
    ]
    receivers = {r["name"]: r for r in config["receivers"]}
    assert receivers["oncall"]["webhook_configs"][0]["url"] == "https://alerts.example.org/hook"
    assert receivers["mail"]["email_configs"][0]["smarthost"] == "smtp.example.org:587"
    assert receivers["chat"]["slack_configs"][0]["api_url_file"] == "/etc/prometheus/slack-url"


# --- the real validators ------------------------------------------------------------------------------------------


@needs_promtool
@pytest.mark.parametrize("name", ["slurm-small", "k8s-mig", "mon-full"])
def test_promtool_accepts_the_rules_and_the_config(name: str, tmp_path: Path) -> None:
    rules = tmp_path / "rules" / "gpuinfra.yml"
    rules.parent.mkdir()
    rules.write_text(rendered(name)["monitoring/prometheus/rules/gpuinfra.yml"].content)
    checked = run([str(PROMTOOL), "check", "rules", str(rules)])
    assert checked.returncode == 0, checked.stdout + checked.stderr

    # The full check reads the rule files and the credential files the configuration names: point it at copies.
    config = rendered(name)["monitoring/prometheus/prometheus.yml"].content
    config = config.replace("/etc/prometheus/rules/", f"{rules.parent}/")
    (tmp_path / "password").write_text("x\n")
    (tmp_path / "ca.crt").write_text("")
    config = re.sub(r"/etc/prometheus/gpuinfra-[a-z-]+-password", str(tmp_path / "password"), config)
    config = config.replace("/etc/ssl/gpuinfra/ca.crt", str(tmp_path / "ca.crt"))
    # And the target files, which it parses as Prometheus would.
    (tmp_path / "targets").mkdir()
    for job in ("node", "dcgm_exporter"):
        target_file = rendered(name)[f"monitoring/prometheus/targets/{job}.yml"].content
        (tmp_path / "targets" / f"{job}.yml").write_text(target_file)
    config = config.replace("/etc/prometheus/targets/", f"{tmp_path / 'targets'}/")
    (tmp_path / "prometheus.yml").write_text(config)
    checked = run([str(PROMTOOL), "check", "config", str(tmp_path / "prometheus.yml")])
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS" in checked.stdout + checked.stderr
    assert "WARNING" not in checked.stdout + checked.stderr


@needs_amtool
@pytest.mark.parametrize("name", ["slurm-small", "k8s-mig", "mon-full"])
def test_amtool_accepts_the_alertmanager_config(name: str, tmp_path: Path) -> None:
    path = tmp_path / "alertmanager.yml"
    path.write_text(rendered(name)["monitoring/alertmanager/alertmanager.yml"].content)
    checked = run([str(AMTOOL), "check-config", str(path)])
    assert checked.returncode == 0, checked.stdout + checked.stderr


@needs_promtool
@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl is missing to make a test certificate")
def test_promtool_accepts_the_web_config_shape(tmp_path: Path) -> None:
    """The roles' web-config templates, filled as TLS plus basic auth renders them, pass Prometheus's own check
    (which loads the certificate and key)."""
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar, trust_as_template

    made = run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-subj",
            "/CN=gpu01",
            "-days",
            "1",
            "-keyout",
            str(tmp_path / "host.key"),
            "-out",
            str(tmp_path / "host.crt"),
        ]
    )
    assert made.returncode == 0, made.stderr
    source = (ROOT / "roles" / "monitoring_web" / "templates" / "web-config.yml.j2").read_text()
    variables = {
        "ansible_managed": "test",
        "monitoring_web_tls_cert_file": str(tmp_path / "host.crt"),
        "__monitoring_web_tls": True,
        "monitoring_web_tls_key": str(tmp_path / "host.key"),
        "monitoring_web_basic_auth": True,
        "monitoring_web_basic_auth_user": "prometheus",
        "__monitoring_web_basic_auth_hash": "$2b$10$" + "a" * 53,
    }
    text = Templar(loader=DataLoader(), variables=variables).template(trust_as_template(source))
    (tmp_path / "web.yml").write_text(str(text))
    checked = run([str(PROMTOOL), "check", "web-config", str(tmp_path / "web.yml")])
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert yaml_load(str(text))["basic_auth_users"] == {"prometheus": "$2b$10$" + "a" * 53}
    assert yaml_load(str(text))["tls_server_config"]["key_file"] == str(tmp_path / "host.key")


# --- the Slurm state collector --------------------------------------------------------------------------------------


def _script(path: Path) -> ModuleType:
    """A collector script, which has no .py suffix, loaded as a module."""
    loader = SourceFileLoader(path.name.replace("-", "_"), str(path))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[loader.name] = module  # dataclasses look their module up while the script runs
    loader.exec_module(module)
    return module


@cache
def collector() -> ModuleType:
    """The Slurm collector: node states (`nodes`) and jobs (`jobs`)."""
    return _script(COLLECTOR)


SINFO = """\
gpu01|idle|none
gpu02|drained|GPU 3 XID 79
gpu02|drained|GPU 3 XID 79
gpu03|down*|Not responding
gpu04|mixed+drain|maintenance "rack 4"
gpu05|allocated|none
gpu06|idle*|none
gpu07|draining|admin
"""


def test_collector_reads_sinfo_states() -> None:
    nodes = collector().parse_sinfo(SINFO)
    assert sorted(nodes) == [f"gpu0{i}" for i in range(1, 8)]  # gpu02 listed in two partitions counts once
    assert {n for n, v in nodes.items() if v["drained"]} == {"gpu02", "gpu04", "gpu07"}
    assert {n for n, v in nodes.items() if v["down"]} == {"gpu03", "gpu06"}
    assert nodes["gpu04"]["state"] == "mixed" and nodes["gpu04"]["reason"] == 'maintenance "rack 4"'
    assert nodes["gpu01"]["reason"] == ""


@needs_promtool
@pytest.mark.parametrize("nodes", ["ok", "failed"])
def test_collector_output_passes_promtool(nodes: str) -> None:
    module = collector()
    text = module.render_nodes(module.parse_sinfo(SINFO) if nodes == "ok" else None)
    checked = subprocess.run([str(PROMTOOL), "check", "metrics"], input=text, capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert ("gpuinfra_slurm_sinfo_success 1" if nodes == "ok" else "gpuinfra_slurm_sinfo_success 0") in text


def test_collector_writes_the_failure_when_sinfo_fails(tmp_path: Path) -> None:
    out = tmp_path / "gpuinfra_slurm.prom"
    assert collector().main(["nodes", "--sinfo", str(tmp_path / "no-such-sinfo"), "--output", str(out)]) == 1
    assert "gpuinfra_slurm_sinfo_success 0" in out.read_text()
    assert oct(out.stat().st_mode & 0o777) == "0o644"


# --- the Slurm job collector ----------------------------------------------------------------------------------------

# squeue --noheader --all --states=RUNNING --Format=JobID:|,UserName:|,Account:|,Partition:|,NumNodes:|,tres-alloc:|,
# tres-per-job:|,tres-per-node:|. 1048 and 1049 are lines a real Slurm 22.05.8 printed on a cluster without
# accounting (account "(null)", no gres/gpu in tres-alloc: slurmctld refuses AccountingStorageTRES=gres/gpu without
# slurmdbd). The others follow them with the TRES of a cluster that accounts gres/gpu (1041; 1042 with the typed
# count too; 1043 typed only), a CPU job (1044), requests per node (1045, on 2 nodes) and per job (1046), and a
# gres/gpumem beside gres/gpu (1047). An array task is listed by its own job id, as the prolog writes it.
SQUEUE = """\
1041|alice|physics|gpu|1|cpu=8,mem=64G,node=1,billing=8,gres/gpu=2|N/A|gres:gpu:2|
1042|bob|physics|gpu|2|cpu=32,mem=256G,node=2,billing=32,gres/gpu=8,gres/gpu:h100=8|N/A|gres:gpu:h100:4|
1043|carol|chemistry|l40s|1|cpu=4,mem=16G,node=1,billing=4,gres/gpu:l40s=1|N/A|gres/gpu:l40s:1|
1044|dave|chemistry|cpu|1|cpu=2,mem=4G,node=1,billing=2|N/A|N/A|
1045|erin|biology|gpu|2|cpu=2,mem=4G,node=2,billing=2|N/A|gres:gpu:2|
1046|frank|biology|gpu|1|cpu=2,mem=4G,node=1,billing=2|gres:gpu:3|N/A|
1047|grace|physics|gpu|1|cpu=1,mem=2G,node=1,billing=1,gres/gpumem=40G,gres/gpu=1|N/A|gres:gpu:1|
1048|root|(null)|gpu|1|cpu=1,node=1,billing=1|N/A|gres:gpu:l4:2|
1049|root|physics|gpu|1|cpu=1,node=1,billing=1|gres:gpu:1|N/A|
"""


def test_job_collector_reads_squeue() -> None:
    jobs = collector().parse_squeue(SQUEUE)
    got = [(j.job_id, j.user, j.account, j.partition, j.gpus) for j in jobs]
    assert got == [
        ("1041", "alice", "physics", "gpu", 2),
        ("1042", "bob", "physics", "gpu", 8),  # the total, not total + typed
        ("1043", "carol", "chemistry", "l40s", 1),  # only the typed count is tracked
        ("1044", "dave", "chemistry", "cpu", 0),
        ("1045", "erin", "biology", "gpu", 4),  # 2 per node on 2 nodes
        ("1046", "frank", "biology", "gpu", 3),
        ("1047", "grace", "physics", "gpu", 1),  # gres/gpumem is not a GPU
        ("1048", "root", "", "gpu", 2),  # "(null)": no account
        ("1049", "root", "physics", "gpu", 1),
    ]


def test_job_collector_skips_what_it_cannot_read_and_keeps_the_rest() -> None:
    text = "1051_3|x|y|z|1|cpu=1|N/A|N/A|\ngarbage\n\n1052|ann|a|b|gpu|1|cpu=1,gres/gpu=1|N/A|N/A|\n"
    jobs = collector().parse_squeue(text)
    # An array task shown as 1051_3 is no job id the DCGM exporter uses; "a|b" is an account holding the separator.
    assert [(j.job_id, j.account, j.partition, j.gpus) for j in jobs] == [("1052", "a|b", "gpu", 1)]


def test_job_collector_renders_one_series_per_job() -> None:
    text = collector().render_jobs(collector().parse_squeue(SQUEUE))
    lines = text.splitlines()
    assert "gpuinfra_slurm_squeue_success 1" in lines
    assert 'gpuinfra_slurm_job_info{hpc_job="1041",user="alice",account="physics",partition="gpu"} 1' in lines
    assert 'gpuinfra_slurm_job_gpus{hpc_job="1042"} 8' in lines
    assert len([line for line in lines if line.startswith("gpuinfra_slurm_job_info{")]) == 9
    assert len([line for line in lines if line.startswith("gpuinfra_slurm_job_gpus{")]) == 9


@needs_promtool
@pytest.mark.parametrize("jobs", ["running", "none", "failed"])
def test_job_collector_output_passes_promtool(jobs: str) -> None:
    module = collector()
    text = module.render_jobs({"running": module.parse_squeue(SQUEUE), "none": [], "failed": None}[jobs])
    checked = subprocess.run([str(PROMTOOL), "check", "metrics"], input=text, capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"gpuinfra_slurm_squeue_success {0 if jobs == 'failed' else 1}" in text
    assert ("gpuinfra_slurm_job_info{" in text) == (jobs == "running")


@needs_promtool
def test_job_collector_labels_read_back_as_written(tmp_path: Path) -> None:
    """User and account names are data: Prometheus's own parser reads back exactly what squeue said."""
    hostile = 'o"brien\\x'
    module = collector()
    text = module.render_jobs(module.parse_squeue(f"7|{hostile}|{hostile}|gpu|1|gres/gpu=1|N/A|N/A|\n"))
    # Stamp each sample and end the file as OpenMetrics, so that promtool can load it into a database.
    stamped = [line if line.startswith("#") else f"{line} 1700000000" for line in text.splitlines()]
    (tmp_path / "in.om").write_text("\n".join([*stamped, "# EOF"]) + "\n")
    made = run([str(PROMTOOL), "tsdb", "create-blocks-from", "openmetrics", "in.om", "db"], cwd=tmp_path)
    assert made.returncode == 0, made.stdout + made.stderr
    (tmp_path / "db" / "wal").mkdir()
    dumped = run([str(PROMTOOL), "tsdb", "dump", "--match", "gpuinfra_slurm_job_info", "db"], cwd=tmp_path)
    assert dumped.returncode == 0, dumped.stderr
    [line] = dumped.stdout.splitlines()
    labels = {m[1]: json.loads(m[2]) for m in re.finditer(r'(\w+)=("(?:[^"\\]|\\.)*")', line)}
    assert labels == {
        "__name__": "gpuinfra_slurm_job_info",
        "hpc_job": "7",
        "user": hostile,
        "account": hostile,
        "partition": "gpu",
    }


def _fake_squeue(tmp_path: Path, output: str, status: int = 0) -> Path:
    """An squeue that records its arguments and prints `output`."""
    script = tmp_path / "squeue"
    (tmp_path / "out.txt").write_text(output)
    script.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {tmp_path}/args\ncat {tmp_path}/out.txt\nexit {status}\n')
    script.chmod(0o755)
    return script


def test_job_collector_asks_squeue_for_running_jobs_in_every_partition(tmp_path: Path) -> None:
    out = tmp_path / "gpuinfra_slurm_jobs.prom"
    squeue = _fake_squeue(tmp_path, SQUEUE)
    assert collector().main(["jobs", "--squeue", str(squeue), "--output", str(out)]) == 0
    args = (tmp_path / "args").read_text().splitlines()
    assert args == ["--noheader", "--all", "--states=RUNNING", f"--Format={collector().SQUEUE_FORMAT}"]
    assert collector().SQUEUE_FORMAT.startswith("JobID:|,UserName:|,Account:|,Partition:|,NumNodes:|")
    assert 'gpuinfra_slurm_job_gpus{hpc_job="1045"} 4' in out.read_text()
    assert oct(out.stat().st_mode & 0o777) == "0o644"


@pytest.mark.parametrize("broken", ["missing", "failing"])
def test_job_collector_writes_the_failure_and_no_job_when_squeue_fails(broken: str, tmp_path: Path) -> None:
    out = tmp_path / "gpuinfra_slurm_jobs.prom"
    out.write_text('gpuinfra_slurm_job_info{hpc_job="1"} 1\n')  # what the last run left: must not survive
    squeue = tmp_path / "no-such-squeue" if broken == "missing" else _fake_squeue(tmp_path, SQUEUE, status=1)
    assert collector().main(["jobs", "--squeue", str(squeue), "--output", str(out)]) == 1
    assert out.read_text().splitlines()[-1] == "gpuinfra_slurm_squeue_success 0"
    assert "gpuinfra_slurm_job_" not in out.read_text()


# sacct --parsable2 with SLURM_TIME_FORMAT=%s: JobID|User|Account|Partition|End.
SACCT = """\
2101|alice|physics|gpu|1764990000
2102_3|bob|chemistry|l40s|1764990100
not|a|job|line
2103|carol|physics|gpu|Unknown
"""


def test_job_collector_lists_the_jobs_killed_for_memory() -> None:
    module = collector()
    text = module.render_jobs(module.parse_squeue(SQUEUE), module.parse_oom(SACCT))
    lines = text.splitlines()
    assert "gpuinfra_slurm_sacct_success 1" in lines
    oom = [line for line in lines if line.startswith("gpuinfra_slurm_job_out_of_memory_end_timestamp_seconds{")]
    assert oom == [
        'gpuinfra_slurm_job_out_of_memory_end_timestamp_seconds{hpc_job="2101",user="alice",account="physics",'
        'partition="gpu"} 1764990000',
        'gpuinfra_slurm_job_out_of_memory_end_timestamp_seconds{hpc_job="2102_3",user="bob",account="chemistry",'
        'partition="l40s"} 1764990100',
    ]
    # Not asked (no accounting): nothing of sacct.
    assert "gpuinfra_slurm_sacct_success" not in module.render_jobs(module.parse_squeue(SQUEUE))


@needs_promtool
@pytest.mark.parametrize("oom", ["listed", "none", "failed"])
def test_job_collector_out_of_memory_output_passes_promtool(oom: str) -> None:
    module = collector()
    listed = {"listed": module.parse_oom(SACCT), "none": [], "failed": None}[oom]
    text = module.render_jobs(module.parse_squeue(SQUEUE), listed)
    checked = subprocess.run([str(PROMTOOL), "check", "metrics"], input=text, capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"gpuinfra_slurm_sacct_success {0 if oom == 'failed' else 1}" in text
    assert ("gpuinfra_slurm_job_out_of_memory" in text) == (oom == "listed")


def test_job_collector_asks_sacct_for_every_users_jobs_killed_for_memory_in_the_last_hour(tmp_path: Path) -> None:
    out = tmp_path / "gpuinfra_slurm_jobs.prom"
    squeue = _fake_squeue(tmp_path, SQUEUE)
    sacct = tmp_path / "sacct"
    sacct.write_text(
        f'#!/bin/sh\nprintf "%s\\n" "$@" "$SLURM_TIME_FORMAT" > {tmp_path}/sacct-args\ncat <<EOF\n{SACCT}EOF\n'
    )
    sacct.chmod(0o755)
    assert collector().main(["jobs", "--squeue", str(squeue), "--sacct", str(sacct), "--output", str(out)]) == 0
    assert (tmp_path / "sacct-args").read_text().splitlines() == [
        "--allocations", "--allusers", "--noheader", "--parsable2", "--state=OUT_OF_MEMORY",
        "--starttime=now-1hours", "--endtime=now", "--format=JobID,User,Account,Partition,End", "%s",
    ]  # fmt: skip
    assert 'hpc_job="2101"' in out.read_text()

    sacct.write_text("#!/bin/sh\necho 'sacct: error: Problem talking to the database' >&2\nexit 1\n")
    assert collector().main(["jobs", "--squeue", str(squeue), "--sacct", str(sacct), "--output", str(out)]) == 1
    assert "gpuinfra_slurm_sacct_success 0" in out.read_text().splitlines()
    assert "out_of_memory" not in out.read_text() and "gpuinfra_slurm_job_info{" in out.read_text()


def test_one_timer_runs_both_collectors_and_a_failing_squeue_does_not_stop_sinfo(
    collections: Path, tmp_path: Path
) -> None:
    from test_monitoring_security import SYSTEMD_ANALYZE, systemd_words
    from test_monitoring_security import render as render_template

    role = ROOT / "roles" / "node_exporter"
    variables = {
        **yaml_load((role / "defaults" / "main.yml").read_text()),
        **yaml_load((role / "vars" / "main.yml").read_text()),
    }
    used: tuple[str, ...] = ("node_exporter_slurm_squeue", "node_exporter_slurm_sinfo", "node_exporter_textfile_dir")
    used += ("node_exporter_slurm_sacct",)
    used += ("__node_exporter_slurm_textfile", "__node_exporter_slurm_jobs_textfile")
    [out] = render_template(
        collections, [("node_exporter/templates/gpuinfra-slurm-node-state.service.j2", {k: variables[k] for k in used})]
    )
    starts = [line.removeprefix("ExecStart=") for line in out["text"].splitlines() if line.startswith("ExecStart=")]
    assert [line[:2] for line in starts] == ['-"', '"/']  # the jobs collector's failure is ignored, sinfo's is not
    folder = "/var/lib/prometheus/node-exporter"
    assert systemd_words(starts[0][1:]) == [
        "/usr/local/sbin/gpuinfra-slurm-metrics",
        "jobs",
        "--squeue",
        "/usr/bin/squeue",
        "--sacct",
        "/usr/bin/sacct",
        "--output",
        f"{folder}/gpuinfra_slurm_jobs.prom",
    ]
    assert systemd_words(starts[1]) == [
        "/usr/local/sbin/gpuinfra-slurm-metrics",
        "nodes",
        "--sinfo",
        "/usr/bin/sinfo",
        "--output",
        f"{folder}/gpuinfra_slurm.prom",
    ]
    # What the unit runs is what the role installs, and removes again.
    installed, removed = ((role / "tasks" / f"{name}.yml").read_text() for name in ("slurm", "slurm-absent"))
    assert COLLECTOR.stat().st_mode & 0o111
    assert "src: gpuinfra_slurm_metrics.py\n    dest: /usr/local/sbin/gpuinfra-slurm-metrics\n" in installed
    assert "- /usr/local/sbin/gpuinfra-slurm-metrics\n" in removed
    assert "__node_exporter_slurm_jobs_textfile }}" in removed
    if SYSTEMD_ANALYZE:
        unit = tmp_path / "gpuinfra-slurm-node-state.service"
        unit.write_text(out["text"])
        checked = run([SYSTEMD_ANALYZE, "verify", str(unit)])
        assert "quoting" not in checked.stderr and "Invalid" not in checked.stderr, checked.stderr


# --- dashboards and the metrics they name ---------------------------------------------------------------------------

KEYWORDS = {"and", "or", "unless", "bool", "offset", "inf", "nan"}


def metric_names(expr: str) -> set[str]:
    """Metric names a PromQL expression reads (functions, keywords, labels and template variables left out)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    text = re.sub(r"\{[^}]*\}", "", text)
    text = re.sub(r"\[[^\]]*\]", "", text)
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", text)
    text = re.sub(r"(?<![A-Za-z_:])[0-9]+(\.[0-9]+)?([eE][+-]?[0-9]+)?", "0", text)
    names = set()
    for match in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", text):
        if text[match.end() :].lstrip().startswith("(") or match.group(0) in KEYWORDS:
            continue
        names.add(match.group(0))
    return names


def test_metric_names_of_an_expression() -> None:
    expr = 'sum by (hpc_job) (increase(DCGM_FI_DEV_X{a="b(c)", d=~"$job"}[$__range])) / 3.6e9 or on (i) up == bool 1'
    assert metric_names(expr) == {"DCGM_FI_DEV_X", "up"}


@cache
def known_metrics() -> frozenset[str]:
    """Every metric that exists where the dashboards and rules run."""
    node = {line for line in (DATA / "node_exporter_metrics.txt").read_text().splitlines() if not line.startswith("#")}
    dcgm = {line.split(",")[0].strip() for line in COUNTERS.read_text().splitlines() if line.startswith("DCGM_FI_")}
    module = collector()
    slurm_text = module.render_nodes(module.parse_sinfo(SINFO))
    slurm_text += module.render_jobs(module.parse_squeue(SQUEUE), module.parse_oom(SACCT))
    slurm = set(re.findall(r"^(gpuinfra_slurm_[a-z_]+)", slurm_text, re.M))
    kernel_module = _script(KERNEL_COLLECTOR)
    kernel_text = kernel_module.render({"linux-image-amd64": kernel_module.Entry("6.1.192-3", "available", 1.0)}, True)
    kernel = set(re.findall(r"^(gpuinfra_kernel_[a-z_]+)", kernel_text, re.M))
    # The node health program's textfile: the metrics it declares (tests/unit/test_health_program.py reads them).
    health = set(re.findall(r"# TYPE (gpuinfra_health_[a-z_]+) ", HEALTH_PROGRAM.read_text()))
    rules = yaml_load(rendered("mon-full")["monitoring/prometheus/rules/gpuinfra.yml"].content)
    recorded = {rule["record"] for group in rules["groups"] for rule in group["rules"] if "record" in rule}
    # Series Prometheus itself makes: the scrape health and the alerts' state.
    builtin = {"up", "ALERTS", "ALERTS_FOR_STATE"}
    return frozenset(node | dcgm | slurm | kernel | health | recorded | builtin)


def dashboard_queries(dashboard: dict[str, Any]) -> list[str]:
    queries = [t["expr"] for panel in dashboard["panels"] for t in panel.get("targets", [])]
    for var in dashboard["templating"]["list"]:
        match = re.fullmatch(r"label_values\((.+), *[A-Za-z_]+\)", var["definition"])
        assert match, f"{var['name']}: not a label_values() query"
        queries.append(match.group(1))
    return queries


@pytest.mark.parametrize("path", sorted(DASHBOARDS.glob("*.json")), ids=lambda p: p.stem)
def test_dashboard_is_well_formed_and_names_known_metrics(path: Path) -> None:
    dashboard = json.loads(path.read_text())
    assert dashboard["uid"].startswith("gpuinfra-") and dashboard["title"]
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids)) and ids
    for panel in dashboard["panels"]:
        assert panel["datasource"] == {"type": "prometheus", "uid": "gpuinfra-prometheus"}, panel["title"]
        assert panel["targets"], panel["title"]
        refs = [t["refId"] for t in panel["targets"]]
        assert len(refs) == len(set(refs)), panel["title"]
    for expr in dashboard_queries(dashboard):
        unknown = metric_names(expr) - known_metrics()
        assert not unknown, f"{path.name}: {expr!r} names metrics nothing exports: {sorted(unknown)}"


def test_dashboards_cover_the_four_boards() -> None:
    titles = {json.loads(p.read_text())["uid"] for p in DASHBOARDS.glob("*.json")}
    assert titles == {"gpuinfra-gpu-overview", "gpuinfra-gpu-usage", "gpuinfra-gpu-teams", "gpuinfra-node-health"}
    grafana_tasks = (ROOT / "roles" / "grafana" / "vars" / "main.yml").read_text()
    assert all(p.name in grafana_tasks for p in DASHBOARDS.glob("*.json")), "a dashboard the role does not install"


def test_datasource_uid_matches_the_dashboards() -> None:
    assert "uid: gpuinfra-prometheus" in (ROOT / "roles/grafana/templates/datasource.yml.j2").read_text()


def test_rules_name_only_known_metrics() -> None:
    rules = yaml_load(rendered("mon-full")["monitoring/prometheus/rules/gpuinfra.yml"].content)
    for group in rules["groups"]:
        for rule in group["rules"]:
            unknown = metric_names(rule["expr"]) - known_metrics()
            assert not unknown, f"{rule.get('alert') or rule.get('record')}: {sorted(unknown)}"


def test_counters_cover_what_the_issue_asks_for() -> None:
    dcgm = {name for name in known_metrics() if name.startswith("DCGM_FI_")}
    for field in (
        "DCGM_FI_DEV_XID_ERRORS",  # XID
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",  # ECC
        "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",  # throttling
        "DCGM_FI_DEV_POWER_VIOLATION",
        "DCGM_FI_DEV_POWER_USAGE",  # power
        "DCGM_FI_DEV_GPU_TEMP",  # temperature
        "DCGM_FI_DEV_FB_USED",  # memory
        "DCGM_FI_DEV_GPU_UTIL",  # utilisation
        "DCGM_FI_DEV_ROW_REMAP_PENDING",
    ):
        assert field in dcgm
