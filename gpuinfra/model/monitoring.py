"""Monitoring: exporters, Prometheus, Alertmanager, Grafana, and the alert thresholds."""

from __future__ import annotations

from typing import Annotated, Literal, get_args

from pydantic import Field

from .base import Duration, Model, Name, Percent

Component = Literal["dcgm_exporter", "node_exporter", "prometheus", "alertmanager", "grafana"]
COMPONENTS: tuple[str, ...] = get_args(Component)


class Alerts(Model):
    gpu_temp_c: Annotated[int, Field(ge=40, le=110)] = 85
    gpu_temp_for: Duration = "2m"
    fb_used_pct: Percent = 90
    idle_util_pct: Percent = 10
    idle_for: Duration = "30m"
    node_down_for: Duration = "2m"


class WebhookReceiver(Model):
    type: Literal["webhook"]
    url: Annotated[str, Field(pattern=r"^https?://")]


class EmailReceiver(Model):
    type: Literal["email"]
    to: str
    sender: str
    smarthost: str
    """host:port of the SMTP relay."""


class SlackReceiver(Model):
    type: Literal["slack"]
    channel: str
    api_url_file: str
    """File on the monitoring host holding the webhook URL (a secret, so never inline)."""


Receiver = Annotated[WebhookReceiver | EmailReceiver | SlackReceiver, Field(discriminator="type")]


class Routes(Model):
    critical: list[Name] = []
    warning: list[Name] = []
    info: list[Name] = []


class Tls(Model):
    cert_file: str
    key_file: str


class DcgmExporter(Model):
    source: Literal["container", "package"] = "container"
    image: str = "nvcr.io/nvidia/k8s/dcgm-exporter:4.2.3-4.1.3-ubuntu22.04"
    """Image for the container source; point it at a local registry for air-gapped sites."""


class Monitoring(Model):
    components: list[Component] = list(COMPONENTS)
    retention: Duration = "15d"
    listen: Literal["cluster", "any"] = "cluster"
    """`cluster`: listen on each host's cluster address only; `any`: 0.0.0.0."""
    alerts: Alerts = Alerts()
    receivers: dict[Name, Receiver] = {}
    routes: Routes = Routes()
    tls: Tls | None = None
    basic_auth: bool = False
    """Protect Prometheus and Alertmanager with a generated basic-auth password."""
    dcgm_exporter: DcgmExporter = DcgmExporter()
