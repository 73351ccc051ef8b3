"""Monitoring: role variables from `monitoring:` in the cluster file.

Roles: node_exporter (every host), dcgm_exporter (GPU nodes), prometheus, alertmanager and grafana (hosts with the
monitoring role), prometheus_targets (the exporters Prometheus scrapes, on the same hosts), monitoring_tls (every
monitored host, with `tls: true`). The scrape targets are not listed here: the prometheus_targets role takes them
from the inventory groups, so a host added to the file is scraped on the next apply without a second list to keep
in step, and without running the prometheus role.

Every value is plain data. What only a run can know (the secrets folder on the controller, the password hashes,
each host's cluster address) the roles work out from their own defaults: basic auth gives every service its own
generated password, and Prometheus scrapes each with that service's one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ... import catalog
from ...model.grammar import duration_seconds
from ...model.monitoring import COMPONENTS
from ...resolve import Host, ResolvedCluster
from ..artifacts import Artifact
from . import LEFT_OUT, sources
from .concern import Concern
from .health import EMULATED_GPU_TOOLS

ARTIFACTS: tuple[Artifact, ...] = (
    Artifact("monitoring/prometheus/prometheus.yml", "prometheus", "prometheus.yml.j2", "monitoring"),
    Artifact("monitoring/prometheus/rules/gpuinfra.yml", "prometheus", "gpuinfra.rules.yml.j2", "monitoring"),
    Artifact("monitoring/prometheus/targets/node.yml", "prometheus_targets", "node.yml.j2", "monitoring"),
    Artifact(
        "monitoring/prometheus/targets/dcgm_exporter.yml", "prometheus_targets", "dcgm_exporter.yml.j2", "monitoring"
    ),
    Artifact("monitoring/alertmanager/alertmanager.yml", "alertmanager", "alertmanager.yml.j2", "monitoring"),
    Artifact("monitoring/dcgm-exporter/gpuinfra-counters.csv", "dcgm_exporter", "counters.csv.j2", "gpu_nodes"),
    Artifact("monitoring/grafana/provisioning/dashboards/gpuinfra.yml", "grafana", "dashboards.yml.j2", "monitoring"),
    # The Slurm state collector runs on the controller (node_exporter_slurm_state_hosts).
    Artifact(
        "monitoring/node-exporter/gpuinfra-slurm-node-state.service",
        "node_exporter",
        "gpuinfra-slurm-node-state.service.j2",
        "slurm_controller",
    ),
    Artifact(
        "monitoring/node-exporter/gpuinfra-slurm-node-state.timer",
        "node_exporter",
        "gpuinfra-slurm-node-state.timer.j2",
        "slurm_controller",
    ),
)

# Where the monitoring_tls role installs the generated CA certificate and each host's certificate and key.
GENERATED_TLS_DIR = "/etc/gpuinfra/monitoring-tls"
SERVERS: tuple[str, ...] = ("node_exporter", "dcgm_exporter", "prometheus", "alertmanager", "grafana")


@dataclass(frozen=True)
class TlsFiles:
    """Where every host's certificate and key are, and the CA the clients verify with ("": the trust store)."""

    cert_file: str
    key_file: str
    ca_file: str


def tls_files(rc: ResolvedCluster) -> TlsFiles | None:
    """The TLS files of `monitoring.tls`: none (plain HTTP), the generated ones, or the site's own."""
    tls = rc.model.monitoring.tls
    if tls is False:
        return None
    if tls is True:
        return TlsFiles(f"{GENERATED_TLS_DIR}/host.crt", f"{GENERATED_TLS_DIR}/host.key", f"{GENERATED_TLS_DIR}/ca.crt")
    return TlsFiles(tls.cert_file, tls.key_file, tls.ca_file or "")


def _tls_vars(rc: ResolvedCluster) -> dict[str, Any]:
    files = tls_files(rc)
    out: dict[str, Any] = {"gpuinfra_monitoring_tls_generated": rc.model.monitoring.tls is True}
    for role in SERVERS:
        out[f"{role}_tls_cert_file"] = files.cert_file if files else ""
        out[f"{role}_tls_key_file"] = files.key_file if files else ""
    out["prometheus_client_tls"] = files is not None
    out["prometheus_client_tls_ca_file"] = files.ca_file if files else ""
    out["grafana_prometheus_tls"] = files is not None
    out["grafana_prometheus_tls_ca_file"] = files.ca_file if files else ""
    return out


def _slurm_state_hosts(rc: ResolvedCluster) -> list[str]:
    """Where sinfo answers with authority, so the Slurm state collector runs there: the controller."""
    if rc.model.slurm is None:
        return []
    return [name for name, host in rc.hosts.items() if "slurm_controller" in host.roles]


def _allocated_labels(rc: ResolvedCluster) -> list[str]:
    """DCGM exporter labels that only allocated GPUs carry: the Slurm job mapping's, and the pod's on Kubernetes."""
    labels = []
    if rc.model.slurm is not None:
        labels.append("hpc_job")
    if rc.model.kubernetes is not None:
        labels.append("pod")
    return labels


def _dcgm_vars(rc: ResolvedCluster) -> dict[str, Any]:
    mon = rc.model.monitoring
    dcgm = mon.dcgm_exporter
    return {
        "dcgm_exporter_source": dcgm.source,
        "dcgm_exporter_image": dcgm.image,
        "dcgm_exporter_container_runtime": dcgm.runtime,
        **sources.source_vars("dcgm_exporter_package_source", dcgm.package_source),
        "dcgm_exporter_hpc_job_mapping_dir": dcgm.job_mapping_dir if rc.model.slurm is not None else "",
        "dcgm_exporter_listen_host": "0.0.0.0" if mon.listen == "any" else "",
        "dcgm_exporter_basic_auth": mon.basic_auth,
    }


def _xid_ranges(rc: ResolvedCluster, wanted: str) -> list[list[int]]:
    """The XIDs of one class in NVIDIA's catalog, with the site's classes (health.xid_classes, allowed_xids), as
    [first, last] ranges: the alert rules compare the exporter's last XID with each."""
    health = rc.model.health
    overrides = {**{xid: "ignore" for xid in health.allowed_xids}, **health.xid_classes}
    xids = sorted({e.xid for e in catalog.xid_entries()} | set(overrides))
    ranges: list[list[int]] = []
    for xid in (x for x in xids if catalog.xid_class(x, overrides=overrides) == wanted):
        if ranges and ranges[-1][1] == xid - 1:
            ranges[-1][1] = xid
        else:
            ranges.append([xid, xid])
    return ranges


def _dcgm_gpu_counts(rc: ResolvedCluster) -> list[int]:
    """The GPU counts of the nodes whose DCGM exporter Prometheus scrapes (the role's default targets)."""
    return sorted({h.gpu_count for h in rc.hosts.values() if h.gpu_count and "k8s_gpu_worker" not in h.roles})


def group_vars(rc: ResolvedCluster) -> dict[str, Any]:
    mon = rc.model.monitoring
    alerts = mon.alerts
    listen_host = "0.0.0.0" if mon.listen == "any" else ""
    components = set(mon.components)
    return {
        "gpuinfra_monitoring_components": list(mon.components),
        # The monitoring roles this cluster leaves out: the receipts play keeps every host out of their plays.
        LEFT_OUT: [c for c in COMPONENTS if c not in components]
        + ([] if "prometheus" in components else ["prometheus_targets"])
        + ([] if mon.tls is True else ["monitoring_tls"]),
        **_tls_vars(rc),
        "node_exporter_listen_host": listen_host,
        "node_exporter_basic_auth": mon.basic_auth,
        "node_exporter_slurm_state_hosts": _slurm_state_hosts(rc),
        # Without accounting no sacct answers: the jobs killed for memory are not asked for.
        **({} if rc.model.slurm is None or rc.model.slurm.accounting else {"node_exporter_slurm_sacct": ""}),
        **_dcgm_vars(rc),
        "prometheus_listen_host": listen_host,
        "prometheus_retention": mon.retention,
        "prometheus_scrape_interval": mon.scrape_interval,
        "prometheus_evaluation_interval": mon.scrape_interval,
        # Targets default to inventory groups (see the role); a component the cluster leaves out has none.
        **({} if "node_exporter" in components else {"prometheus_targets_node_exporter_hosts": []}),
        **({} if "dcgm_exporter" in components else {"prometheus_targets_dcgm_exporter_hosts": []}),
        **({} if "alertmanager" in components else {"prometheus_alertmanager_hosts": []}),
        # The role would find these in every GPU node's hostvars: seconds at 10,000 nodes.
        "prometheus_dcgm_exporter_gpu_counts": _dcgm_gpu_counts(rc) if "dcgm_exporter" in components else [],
        "prometheus_alert_gpu_temp_c": alerts.gpu_temp_c,
        "prometheus_alert_gpu_temp_for": alerts.gpu_temp_for,
        "prometheus_alert_fb_used_pct": alerts.fb_used_pct,
        "prometheus_alert_fb_used_for": alerts.fb_used_for,
        "prometheus_alert_idle_util_pct": alerts.idle_util_pct,
        "prometheus_alert_idle_for": alerts.idle_for,
        "prometheus_alert_idle_allocated_labels": _allocated_labels(rc),
        "prometheus_alert_power_throttle_pct": alerts.power_throttle_pct,
        "prometheus_alert_thermal_throttle_pct": alerts.thermal_throttle_pct,
        "prometheus_alert_throttle_for": alerts.throttle_for,
        "prometheus_alert_node_down_for": alerts.node_down_for,
        "prometheus_alert_kernel_update_pending_s": duration_seconds(alerts.kernel_update_pending_for),
        "prometheus_alert_slurm": rc.model.slurm is not None,
        "prometheus_application_xids": _xid_ranges(rc, "application"),
        "prometheus_ignored_xids": _xid_ranges(rc, "ignore"),
        "prometheus_basic_auth": mon.basic_auth,
        "alertmanager_listen_host": listen_host,
        "alertmanager_receivers": {name: r.model_dump() for name, r in mon.receivers.items()},
        "alertmanager_routes": mon.routes.model_dump(),
        "alertmanager_basic_auth": mon.basic_auth,
        "grafana_listen_host": listen_host,
        "grafana_prometheus_basic_auth": mon.basic_auth,
        "grafana_scrape_interval": mon.scrape_interval,
    }


def host_vars(host: Host) -> dict[str, Any]:
    """A node whose GPUs are emulated runs the sandbox's stand-in exporter (gpus/dcgm_exporter.py), which answers
    from the same emulated GPUs as its nvidia-smi: NVIDIA's exporter needs DCGM and real GPUs."""
    if host.gpu_emulated:
        return {"dcgm_exporter_source": "binary", "dcgm_exporter_binary": f"{EMULATED_GPU_TOOLS}/dcgm-exporter"}
    return {}


CONCERN = Concern("monitoring", ARTIFACTS, group_vars, host_vars=host_vars)
