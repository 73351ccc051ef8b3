"""The health program's Kubernetes identities (roles/k8s_node_health), offline.

No API server runs here. What can be proven without one:
- the manifests `gpuinfra plan` shows validate against the Kubernetes schemas kubernetes-validate ships (strict), and
  match their golden files;
- least privilege, as a property of any list of node names: each node gets one ServiceAccount, one token Secret, one
  ClusterRole that allows only get and patch on that node (resourceNames), and list on nodes (read-only, the
  breaker's count), and one binding of the two; no rule names another node, and no name can inject YAML (names are
  data, rendered with to_nice_yaml);
- the expressions of the role's tasks: the API server and CA taken from a kubeadm admin kubeconfig, the identities
  left over from removed nodes, and the one kubeconfig path both roles agree on.

The kubeconfig the role writes is run against the health program in test_health_program.py; the rights themselves
are checked against a real cluster in tests/k8s/test_real_cluster.py.
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template
from hypothesis import given, settings
from hypothesis import strategies as st
from ruamel.yaml import YAML
from test_kubernetes_support import GOLDEN, check_golden, loaded, rendered, yaml_load_all

from gpuinfra.k8s_resources import WORKER_ROLE
from gpuinfra.render.plan import _trusted  # the same marking the plan uses for role files
from gpuinfra.render.vars import kubernetes as k8s_vars

ROOT = Path(__file__).resolve().parents[2]
ROLE = ROOT / "roles" / "k8s_node_health"
K8S_EXAMPLES = ["k8s-mig", "mig-mixed", "time-slicing"]
PATH = "k8s-node-health/identities.yaml"
# The oldest Kubernetes release test_kubernetes_schemas.py validates against.
KUBERNETES_VERSION = "1.29.0"


def _yaml(path: Path) -> Any:
    return YAML(typ="safe").load(path.read_text())


def _template(text: str, variables: dict[str, Any]) -> Any:
    """Template `text` as Ansible would, with the role's defaults and vars under `variables`."""
    role = {**_yaml(ROLE / "defaults" / "main.yml"), **_yaml(ROLE / "vars" / "main.yml")}
    return Templar(loader=DataLoader(), variables={**_trusted(role), **variables}).template(trust_as_template(text))


def identities_text(nodes: list[str], namespace: str = "gpuinfra-system") -> str:
    source = (ROLE / "templates" / "identities.yaml.j2").read_text()
    variables = {"k8s_node_health_nodes": nodes, "k8s_node_health_namespace": namespace, "ansible_managed": "x"}
    return str(_template(source, variables))


def render_identities(nodes: list[str], namespace: str = "gpuinfra-system") -> list[dict[str, Any]]:
    return yaml_load_all(identities_text(nodes, namespace))


# --- the manifests the plan shows ---------------------------------------------------------------------------------


@pytest.mark.parametrize("example", K8S_EXAMPLES)
def test_identities_validate_against_kubernetes_schemas(example: str) -> None:
    documents = yaml_load_all(rendered(example)[PATH].content)
    assert documents
    for document in documents:
        kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)


@pytest.mark.parametrize("example", K8S_EXAMPLES)
def test_identities_match_golden(example: str) -> None:
    check_golden(GOLDEN / "kubernetes" / example / PATH, rendered(example)[PATH].content)


@pytest.mark.parametrize("example", K8S_EXAMPLES)
def test_every_gpu_worker_and_nothing_else_gets_an_identity(example: str) -> None:
    workers = {h.name for h in loaded(example).resolved.with_role(WORKER_ROLE)}
    documents = yaml_load_all(rendered(example)[PATH].content)
    assert _least_privilege(documents, "gpuinfra-system") == workers


def test_a_cluster_without_kubernetes_gpu_nodes_has_no_identities() -> None:
    assert PATH not in rendered("slurm-small")
    assert render_identities([]) == []
    assert PATH in {a.path for a in k8s_vars.ARTIFACTS}


# --- least privilege, for any node names --------------------------------------------------------------------------


def _least_privilege(documents: list[dict[str, Any]], namespace: str) -> set[str]:
    """Assert what every identity may do; return the nodes that have one."""
    by_kind: dict[str, dict[str, dict[str, Any]]] = {}
    for document in documents:
        by_kind.setdefault(document["kind"], {})[document["metadata"]["name"]] = document
    assert set(by_kind) == {"Namespace", "ServiceAccount", "Secret", "ClusterRole", "ClusterRoleBinding"}
    assert list(by_kind["Namespace"]) == [namespace]
    nodes: set[str] = set()
    for name, role in by_kind["ClusterRole"].items():
        node = role["metadata"]["annotations"]["gpuinfra.io/node"]
        assert name == f"gpuinfra-health-{node}"
        # Exactly one node to get and patch, and nodes to list (read-only, for the breaker's count), nothing else:
        # no other resource, verb, node or aggregation.
        assert role["rules"] == [
            {"apiGroups": [""], "resources": ["nodes"], "resourceNames": [node], "verbs": ["get", "patch"]},
            {"apiGroups": [""], "resources": ["nodes"], "verbs": ["list"]},
        ]
        assert set(role) == {"apiVersion", "kind", "metadata", "rules"}
        binding = by_kind["ClusterRoleBinding"][name]
        assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name}
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": name, "namespace": namespace}]
        account = by_kind["ServiceAccount"][name]
        assert account["metadata"]["namespace"] == namespace and account["automountServiceAccountToken"] is False
        secret = by_kind["Secret"][name]
        assert secret["type"] == "kubernetes.io/service-account-token"
        assert secret["metadata"]["namespace"] == namespace
        assert secret["metadata"]["annotations"]["kubernetes.io/service-account.name"] == name
        assert "data" not in secret and "stringData" not in secret  # the token controller fills it in
        nodes.add(node)
    for kind in ("ServiceAccount", "Secret", "ClusterRoleBinding"):
        assert set(by_kind[kind]) == set(by_kind["ClusterRole"]), kind
    return nodes


DNS_LABEL = st.from_regex(r"\A[a-z0-9]([-a-z0-9]{0,20}[a-z0-9])?\Z")
NODE_NAMES = st.lists(
    st.builds(lambda labels: ".".join(labels), st.lists(DNS_LABEL, min_size=1, max_size=3)), min_size=1, max_size=6
)


@settings(max_examples=40, deadline=None)
@given(nodes=NODE_NAMES)
def test_each_node_may_only_change_itself(nodes: list[str]) -> None:
    documents = render_identities(nodes)
    assert _least_privilege(documents, "gpuinfra-system") == set(nodes)
    for document in documents:
        kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)


# Any text a YAML stream can carry: JSON escapes the C0 controls (newline, tab, ...); YAML has no way to write
# lone surrogates, C1 controls or the noncharacters U+FFFE and U+FFFF.
YAML_TEXT = st.text(
    st.characters(exclude_categories=("Cs", "Cn"), exclude_characters=[chr(c) for c in range(0x7F, 0xA0)]),
    min_size=1,
    max_size=30,
)


@settings(max_examples=60, deadline=None)
@given(nodes=st.lists(YAML_TEXT, min_size=1, max_size=4) | st.lists(DNS_LABEL, min_size=1, max_size=4))
def test_a_node_name_is_data_never_yaml_nor_a_template(nodes: list[str]) -> None:
    """The role refuses names that are not DNS subdomains before it applies anything; the template still renders
    whatever it is given as data: `a: b`, `{{ x }}`, `- y`, a newline, `0e0` or `y` stay the node's name, as a
    string, to a YAML 1.2 reader (this test) and a YAML 1.1 reader (Ansible's from_yaml_all) alike."""
    text = identities_text(nodes)
    documents = yaml_load_all(text)
    roles = [d for d in documents if d["kind"] == "ClusterRole"]
    assert sorted(r["rules"][0]["resourceNames"][0] for r in roles) == sorted(set(nodes))
    assert sorted(r["metadata"]["annotations"]["gpuinfra.io/node"] for r in roles) == sorted(set(nodes))
    assert [d for d in yaml.safe_load_all(text) if d] == documents


def test_the_role_refuses_names_kubernetes_refuses() -> None:
    pattern = _yaml(ROLE / "vars" / "main.yml")["__k8s_node_health_name_pattern"]
    for good in ("gpu01", "gpu-01.dc1.example.com", "0"):
        assert _template("{{ name is match(__k8s_node_health_name_pattern) }}", {"name": good}) is True, good
    for bad in ("GPU01", "gpu_01", "-gpu", "gpu.", "gpu 01", "a: b", ""):
        assert _template("{{ name is match(__k8s_node_health_name_pattern) }}", {"name": bad}) is False, bad
    assert pattern.startswith("^") and pattern.endswith("$")


def test_the_tasks_name_objects_as_the_template_does() -> None:
    documents = render_identities(["gpu07"])
    names = {d["metadata"]["name"] for d in documents if d["kind"] != "Namespace"}
    assert names == {str(_template("{{ __k8s_node_health_name }}", {"k8s_node_health_node_name": "gpu07"}))}
    assert _template("{{ __k8s_node_health_names }}", {"k8s_node_health_nodes": ["a", "b"]}) == [
        "gpuinfra-health-a",
        "gpuinfra-health-b",
    ]


# --- the tasks' expressions ---------------------------------------------------------------------------------------

# A kubeadm admin.conf, as `kubeadm init` writes it (keys shortened).
ADMIN_CONF = """\
apiVersion: v1
clusters:
- cluster:
    certificate-authority-data: TFMwdExTMUNSVWRKVGlCRFJWSlVTVVpKUTBGVVJTMHRMUzB0
    server: https://k8s-api.lab.example:6443
  name: kubernetes
- cluster:
    server: https://other.example:6443
  name: other
contexts:
- context:
    cluster: kubernetes
    user: kubernetes-admin
  name: kubernetes-admin@kubernetes
current-context: kubernetes-admin@kubernetes
kind: Config
preferences: {}
users:
- name: kubernetes-admin
  user:
    client-certificate-data: Q0VSVA==
    client-key-data: UFJJVkFURSBLRVk=
"""


def _task(name: str) -> dict[str, Any]:
    tasks = [*_yaml(ROLE / "tasks" / "main.yml"), *_yaml(ROLE / "tasks" / "api.yml")]
    for task in tasks:
        for inner in [task, *task.get("block", [])]:
            if inner.get("name") == name:
                return dict(inner)
    raise AssertionError(f"no task {name!r}")


@pytest.mark.parametrize(
    ("override", "server"),
    [("", "https://k8s-api.lab.example:6443"), ("https://10.0.0.10:6443", "https://10.0.0.10:6443")],
)
def test_the_api_server_and_its_ca_come_from_the_admin_kubeconfig(override: str, server: str) -> None:
    task = _task("Take the API server's address and CA from the admin kubeconfig")
    slurped = {"content": base64.b64encode(ADMIN_CONF.encode()).decode()}
    variables = {
        "__k8s_node_health_admin": slurped,
        "k8s_node_health_api_server": override,
        **_trusted(task["vars"]),
    }
    facts = _template("{{ fact }}", {**variables, "fact": _trusted(task["ansible.builtin.set_fact"])})
    assert facts == {
        "__k8s_node_health_api": {"server": server, "ca": "TFMwdExTMUNSVWRKVGlCRFJWSlVTVVpKUTBGVVJTMHRMUzB0"}
    }
    # Nothing of the admin's credentials is kept.
    assert "UFJJVkFURSBLRVk=" not in str(facts) and "Q0VSVA==" not in str(facts)


def test_only_identities_of_removed_nodes_are_deleted() -> None:
    def found(*names: str) -> dict[str, Any]:
        return {"resources": [{"metadata": {"name": n}} for n in names]}

    results = {
        "results": [
            found("gpuinfra-health-gpu01", "gpuinfra-health-gpu09"),
            found("gpuinfra-health-gpu01", "gpuinfra-health-gpu09", "unrelated"),
            found("gpuinfra-health-gpu01", "gpuinfra-health-old"),
        ]
    }
    stale = _template(
        "{{ __k8s_node_health_stale }}",
        {"__k8s_node_health_found": results, "k8s_node_health_nodes": ["gpu01", "gpu02"]},
    )
    assert stale == ["gpuinfra-health-gpu09", "gpuinfra-health-old"]
    # Pruning off: the lookups were skipped, and nothing is deleted.
    skipped = {"results": [{"skipped": True}] * 3}
    assert _template("{{ __k8s_node_health_stale }}", {"__k8s_node_health_found": skipped}) == []


def test_the_token_is_read_from_its_secret_and_missing_until_it_is_filled_in() -> None:
    secret = {"resources": [{"data": {"token": base64.b64encode(b"t0ken").decode(), "ca.crt": "Q0E="}}]}
    assert _template("{{ __k8s_node_health_token }}", {"__k8s_node_health_secret": secret}) == "t0ken"
    empty: dict[str, Any]
    for empty in ({"resources": []}, {"resources": [{"data": None}]}, {"resources": [{}]}):
        assert _template("{{ __k8s_node_health_token }}", {"__k8s_node_health_secret": empty}) == "", empty


def test_every_task_that_holds_a_token_or_the_admin_key_is_no_log() -> None:
    for name in ("Read the admin kubeconfig", "Read this node's token", "Write the health program's kubeconfig"):
        assert _task(name).get("no_log") is True, name
    write = _task("Write the health program's kubeconfig")
    assert write["diff"] is False
    assert write["ansible.builtin.template"]["mode"] == "0600"
    assert write["ansible.builtin.template"]["owner"] == "root"


def test_the_program_reads_the_kubeconfig_the_role_writes() -> None:
    """One path, spelled in both roles' defaults."""
    health = _yaml(ROOT / "roles" / "gpu_health" / "defaults" / "main.yml")
    identity = _yaml(ROLE / "defaults" / "main.yml")
    assert (
        health["gpu_health_kubeconfig"] == identity["k8s_node_health_kubeconfig"] == "/etc/gpuinfra/health-kubeconfig"
    )
