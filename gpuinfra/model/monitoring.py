"""Monitoring: exporters, Prometheus, Alertmanager, Grafana, and the alert thresholds."""

from __future__ import annotations

from typing import Annotated, Literal, get_args

from pydantic import Field

from .base import Model
from .driver import DistributionSource, LocalSource, MirrorSource, NvidiaRepoSource
from .grammar import (
    AbsolutePath,
    Duration,
    Email,
    EmailList,
    HostPort,
    HttpUrl,
    ImageRef,
    Name,
    Percent,
    SlackChannel,
)

Component = Literal["dcgm_exporter", "node_exporter", "prometheus", "alertmanager", "grafana"]
COMPONENTS: tuple[Component, ...] = get_args(Component)


class Alerts(Model):
    gpu_temp_c: Annotated[int, Field(ge=40, le=110)] = 85
    """GPU temperature (°C) above which `GpuTemperatureHigh` fires (critical); throttling starts near 83 °C."""
    gpu_temp_for: Duration = "2m"
    """How long the temperature must stay above `gpu_temp_c` before the alert fires."""
    fb_used_pct: Percent = 90
    """Framebuffer memory used, in percent of used + free, above which `GpuMemoryHigh` fires (warning)."""
    fb_used_for: Duration = "5m"
    """How long memory use must stay above `fb_used_pct` before the alert fires."""
    idle_util_pct: Percent = 10
    """GPU utilisation below which an allocated GPU counts as idle (`GpuIdleWhileAllocated`, info)."""
    idle_for: Duration = "30m"
    """How long an allocated GPU must stay idle before the alert fires."""
    power_throttle_pct: Percent = 20
    """Share of time, in percent over 5 minutes, a GPU was held back by its power limit (DCGM's power violation
    time) above which `GpuPowerThrottled` fires (warning): it draws at its limit, and its jobs run slower."""
    thermal_throttle_pct: Percent = 5
    """Share of time a GPU was held back by heat (DCGM's thermal violation time) above which `GpuThermalThrottled`
    fires (warning): a cooling problem."""
    throttle_for: Duration = "10m"
    """How long a throttling share must stay above its threshold before its alert fires."""
    node_down_for: Duration = "2m"
    """How long a node exporter, GPU exporter or Slurm node may be unreachable or down before its alert fires."""
    kernel_update_pending_for: Duration = "14d"
    """How long a newer kernel may wait on a GPU node (held back from unattended-upgrades, or installed and not
    booted) before `KernelUpdatePending` fires (warning), naming `gpuinfra upgrade --kernel`."""


class WebhookReceiver(Model):
    type: Literal["webhook"]
    url: HttpUrl
    """Endpoint Alertmanager POSTs its JSON payload to."""


class EmailReceiver(Model):
    type: Literal["email"]
    to: EmailList
    """Recipient address(es), comma-separated."""
    sender: Email
    """From: address."""
    smarthost: HostPort
    """host:port of the SMTP relay."""


class SlackReceiver(Model):
    type: Literal["slack"]
    channel: SlackChannel
    """Channel to post to, e.g. `#gpu-alerts`."""
    api_url_file: AbsolutePath
    """File on the monitoring host holding the webhook URL (a secret, so never inline)."""


Receiver = Annotated[WebhookReceiver | EmailReceiver | SlackReceiver, Field(discriminator="type")]


class Routes(Model):
    critical: list[Name] = []
    """Receivers of critical alerts (GPU overheating, XID, ECC, GPU or node missing)."""
    warning: list[Name] = []
    """Receivers of warnings (memory nearly full, Slurm node drained)."""
    info: list[Name] = []
    """Receivers of informational alerts (GPUs allocated but idle)."""
    teams: dict[Name, list[Name]] = {}
    """Receivers of the alerts about a team's own jobs, by Slurm account, besides the severity's: an alert whose
    `account` label names the account (a GPU's XID during one of its jobs, a job killed for memory, GPUs allocated
    but idle) goes to them too, e.g. `{vision: [vision-oncall]}`."""


class Tls(Model):
    cert_file: AbsolutePath
    """Server certificate on every monitored host (same path on each); exporters and servers serve HTTPS with it."""
    key_file: AbsolutePath
    """Private key of `cert_file`, readable by the exporters' and servers' users."""
    ca_file: AbsolutePath | None = None
    """CA bundle on the monitoring hosts that Prometheus and Grafana verify the certificates with; omitted means
    the system's trust store."""


PackageSource = Annotated[
    DistributionSource | NvidiaRepoSource | MirrorSource | LocalSource, Field(discriminator="type")
]


class DcgmExporter(Model):
    source: Literal["container", "package"] = "container"
    """`container`: NVIDIA's image run by the node's container runtime; `package`: the exporter's package."""
    image: ImageRef = "nvcr.io/nvidia/k8s/dcgm-exporter:4.2.3-4.1.3-ubuntu22.04"
    """Image for the container source; point it at a local registry for air-gapped sites."""
    runtime: Literal["docker", "podman"] = "docker"
    """Container runtime that runs the image (container source)."""
    package_source: PackageSource = NvidiaRepoSource(type="nvidia")
    """Where the package comes from (package source): NVIDIA's CUDA repository, a mirror, or local files."""
    job_mapping_dir: AbsolutePath = "/var/lib/dcgm-exporter/job-mapping"
    """On Slurm clusters: folder of GPU-to-job files the prolog writes and the exporter reads (`hpc_job` label)."""


class Monitoring(Model):
    components: list[Component] = list(COMPONENTS)
    """Parts to deploy; servers (prometheus, alertmanager, grafana) go on hosts with the monitoring role."""
    retention: Duration = "15d"
    """How long Prometheus keeps samples."""
    scrape_interval: Duration = "30s"
    """How often Prometheus scrapes every exporter and evaluates the alert rules."""
    listen: Literal["cluster", "any"] = "cluster"
    """`cluster`: listen on each host's cluster address only; `any`: 0.0.0.0."""
    alerts: Alerts = Alerts()
    """Alert thresholds."""
    receivers: dict[Name, Receiver] = {}
    """Where Alertmanager sends alerts, by name."""
    routes: Routes = Routes()
    """Receivers per severity."""
    tls: bool | Tls = False
    """Serve every exporter, Prometheus, Alertmanager and Grafana over HTTPS: `true` with a CA and certificates
    that gpuinfra generates into the secrets folder, or the site's own files."""
    basic_auth: bool = True
    """Protect every exporter, Prometheus and Alertmanager with generated basic-auth credentials, one per service
    (Grafana has its own login, with a generated admin password). false leaves the endpoints open."""
    dcgm_exporter: DcgmExporter = DcgmExporter()
    """How the GPU metrics exporter runs on the GPU nodes."""
