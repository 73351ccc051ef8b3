"""Grafana's Prometheus datasource, rendered from the role's own template by Ansible's templating: with monitoring
TLS on, Grafana verifies Prometheus against the cluster's CA (jsonData.tlsAuthWithCACert with the CA in
secureJsonData). Grafana's repository cannot be reached from the test machines, so its own parser is not run here;
the provisioning keys are the ones Grafana documents for a Prometheus datasource."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = ROOT / "roles" / "grafana" / "templates" / "datasource.yml.j2"
CA = "-----BEGIN CERTIFICATE-----\nMIIBszCCAVmgAwIBAgIUJ2Q=\n-----END CERTIFICATE-----\n"


def datasource(url: str, ca: dict[str, Any]) -> dict[str, Any]:
    variables = {
        "ansible_managed": "test",
        "__grafana_prometheus_url": url,
        "__grafana_ca": ca,
        "grafana_prometheus_basic_auth": False,
        "grafana_scrape_interval": "15s",
    }
    text = Templar(loader=DataLoader(), variables=variables).template(trust_as_template(TEMPLATE.read_text()))
    [source] = yaml.safe_load(str(text))["datasources"]
    assert isinstance(source, dict)
    return source


def test_with_tls_grafana_verifies_prometheus_against_the_clusters_ca() -> None:
    source = datasource("https://10.0.0.1:9090", {"content": base64.b64encode(CA.encode()).decode(), "changed": False})
    assert source["url"] == "https://10.0.0.1:9090"
    assert source["jsonData"]["tlsAuthWithCACert"] is True
    assert source["secureJsonData"]["tlsCACert"] == CA
    assert "tlsSkipVerify" not in source["jsonData"]


def test_without_tls_there_is_no_ca_to_verify_with() -> None:
    source = datasource("http://10.0.0.1:9090", {"skipped": True, "changed": False})
    assert "tlsAuthWithCACert" not in source["jsonData"] and "secureJsonData" not in source
