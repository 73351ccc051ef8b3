"""Monitoring: role variables from `monitoring:` in the cluster file.

Roles: node_exporter (every host), dcgm_exporter (GPU nodes), prometheus, alertmanager and grafana (hosts with the
monitoring role). The scrape targets are not listed here: the prometheus role takes them from the inventory groups,
so a host added to the file is scraped on the next apply without a second list to keep in step.

Basic auth uses one generated password. The prometheus role writes it, with its bcrypt hash, into the secrets
folder on the controller on first apply; the exporters and Alertmanager read the hash from there.
"""

from __future__ import annotations

from typing import Any

from ...model.driver import LocalSource, MirrorSource
from ...resolve import ResolvedCluster
from ..artifacts import Artifact

ARTIFACTS: tuple[Artifact, ...] = (
    Artifact("monitoring/prometheus/prometheus.yml", "prometheus", "prometheus.yml.j2", "monitoring"),
    Artifact("monitoring/prometheus/rules/gpuinfra.yml", "prometheus", "gpuinfra.rules.yml.j2", "monitoring"),
    Artifact("monitoring/alertmanager/alertmanager.yml", "alertmanager", "alertmanager.yml.j2", "monitoring"),
    Artifact("monitoring/dcgm-exporter/gpuinfra-counters.csv", "dcgm_exporter", "counters.csv.j2", "gpu_nodes"),
)

# Where the controller keeps generated secrets: outside the repository, one folder per cluster, shared with the
# munge key and the database password (gpuinfra_secrets_dir overrides it, as for those roles).
_HOME_SECRETS = "lookup('ansible.builtin.env', 'HOME') ~ '/.local/share/gpuinfra/{name}'"
SECRETS_DIR = "{{{{ gpuinfra_secrets_dir | default(" + _HOME_SECRETS + ") }}}}"
BASIC_AUTH_USER = "prometheus"
BASIC_AUTH_HASH = "{{ lookup('ansible.builtin.file', prometheus_secrets_dir ~ '/monitoring-web-password.bcrypt') }}"

# The Slurm state collector runs where sinfo answers with authority: the controller.
ON_SLURM_CONTROLLER = "{{ 'slurm_controller' in group_names }}"


def _tls(rc: ResolvedCluster, role: str) -> dict[str, str]:
    tls = rc.model.monitoring.tls
    return {
        f"{role}_tls_cert_file": tls.cert_file if tls else "",
        f"{role}_tls_key_file": tls.key_file if tls else "",
    }


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
    source = dcgm.package_source
    return {
        "dcgm_exporter_source": dcgm.source,
        "dcgm_exporter_image": dcgm.image,
        "dcgm_exporter_container_runtime": dcgm.runtime,
        "dcgm_exporter_package_source_type": source.type,
        "dcgm_exporter_package_source_url": source.url if isinstance(source, MirrorSource) else "",
        "dcgm_exporter_package_source_keyring": (source.keyring or "") if isinstance(source, MirrorSource) else "",
        "dcgm_exporter_package_source_fingerprint": (
            (source.fingerprint or "") if isinstance(source, MirrorSource) else ""
        ),
        "dcgm_exporter_package_source_insecure": source.insecure if isinstance(source, MirrorSource) else False,
        "dcgm_exporter_package_source_path": source.path if isinstance(source, LocalSource) else "",
        "dcgm_exporter_hpc_job_mapping_dir": dcgm.job_mapping_dir if rc.model.slurm is not None else "",
        "dcgm_exporter_listen_host": "0.0.0.0" if mon.listen == "any" else "",
        **_tls(rc, "dcgm_exporter"),
        "dcgm_exporter_basic_auth_users": {BASIC_AUTH_USER: BASIC_AUTH_HASH} if mon.basic_auth else {},
    }


def group_vars(rc: ResolvedCluster) -> dict[str, Any]:
    mon = rc.model.monitoring
    alerts = mon.alerts
    listen_host = "0.0.0.0" if mon.listen == "any" else ""
    auth_users = {BASIC_AUTH_USER: BASIC_AUTH_HASH} if mon.basic_auth else {}
    secrets_dir = SECRETS_DIR.format(name=rc.model.name)
    ca_file = (mon.tls.ca_file or "") if mon.tls else ""
    components = set(mon.components)
    return {
        "gpuinfra_monitoring_components": list(mon.components),
        "node_exporter_listen_host": listen_host,
        **_tls(rc, "node_exporter"),
        "node_exporter_basic_auth_users": auth_users,
        "node_exporter_slurm_state": ON_SLURM_CONTROLLER if rc.model.slurm is not None else False,
        **_dcgm_vars(rc),
        "prometheus_listen_host": listen_host,
        "prometheus_retention": mon.retention,
        "prometheus_scrape_interval": mon.scrape_interval,
        "prometheus_evaluation_interval": mon.scrape_interval,
        # Targets default to inventory groups (see the role); a component the cluster leaves out has none.
        **({} if "node_exporter" in components else {"prometheus_node_exporter_hosts": []}),
        **({} if "dcgm_exporter" in components else {"prometheus_dcgm_exporter_hosts": []}),
        **({} if "alertmanager" in components else {"prometheus_alertmanager_hosts": []}),
        "prometheus_alert_gpu_temp_c": alerts.gpu_temp_c,
        "prometheus_alert_gpu_temp_for": alerts.gpu_temp_for,
        "prometheus_alert_fb_used_pct": alerts.fb_used_pct,
        "prometheus_alert_fb_used_for": alerts.fb_used_for,
        "prometheus_alert_idle_util_pct": alerts.idle_util_pct,
        "prometheus_alert_idle_for": alerts.idle_for,
        "prometheus_alert_idle_allocated_labels": _allocated_labels(rc),
        "prometheus_alert_node_down_for": alerts.node_down_for,
        "prometheus_alert_slurm": rc.model.slurm is not None,
        **_tls(rc, "prometheus"),
        "prometheus_client_tls": mon.tls is not None,
        "prometheus_client_tls_ca_file": ca_file,
        "prometheus_basic_auth": mon.basic_auth,
        "prometheus_secrets_dir": secrets_dir,
        "alertmanager_listen_host": listen_host,
        "alertmanager_receivers": {name: r.model_dump() for name, r in mon.receivers.items()},
        "alertmanager_routes": mon.routes.model_dump(),
        **_tls(rc, "alertmanager"),
        "alertmanager_basic_auth_users": auth_users,
        "grafana_listen_host": listen_host,
        **_tls(rc, "grafana"),
        "grafana_prometheus_tls": mon.tls is not None,
        "grafana_prometheus_tls_ca_file": ca_file,
        "grafana_prometheus_basic_auth": mon.basic_auth,
        "grafana_secrets_dir": secrets_dir,
        "grafana_scrape_interval": mon.scrape_interval,
    }
