"""Monitoring's secure defaults: quoting of unit lines and ARGS, Alertmanager gossip, secrets kept out of logs and
diffs, the cluster address, and the certificates `monitoring.tls: true` generates (made by the real role with the
real openssl, checked with `openssl verify` and promtool).

The role templates use this collection's filters, so they are rendered in a Python that has this checkout on its
collections path (a subprocess, so the collection loader stays out of the other tests).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from file_module import load
from ruamel.yaml import YAML

pytestmark = pytest.mark.tools  # runs Ansible or a system tool (tests/unit/tool_guard.py)

ROOT = Path(__file__).resolve().parents[2]


filters = load("plugins/filter/systemd.py")
certificate = load("plugins/filter/certificate.py")
cluster_address = load("plugins/modules/cluster_address.py")
systemd_quote = filters.systemd_quote
systemd_args_word = filters.systemd_args_word
MONITORING_ROLES = ("node_exporter", "dcgm_exporter", "prometheus", "alertmanager", "grafana", "monitoring_tls")
SYSTEMD_ANALYZE = shutil.which("systemd-analyze")
PROMTOOL = shutil.which("promtool")
OPENSSL = shutil.which("openssl")


def yaml_load(text: str) -> Any:
    return YAML(typ="safe").load(text)


RENDER = """
import json, sys
from ansible.utils.collection_loader._collection_finder import _AnsibleCollectionFinder
_AnsibleCollectionFinder(paths=[sys.argv[1]])._install()
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template
out = []
for source, variables in json.load(sys.stdin):
    variables = {k: trust_as_template(v) if isinstance(v, str) and "{{" in v else v for k, v in variables.items()}
    try:
        out.append({"text": str(Templar(loader=DataLoader(), variables=variables).template(trust_as_template(source)))})
    except Exception as exc:
        out.append({"error": str(exc)})
print(json.dumps(out))
"""


def render(collections: Path, cases: list[tuple[str, dict[str, Any]]]) -> list[dict[str, str]]:
    """Render (role/templates/NAME, variables) pairs with Ansible's templar; each gives {text} or {error}."""
    given = [[(ROOT / "roles" / template).read_text(), {"ansible_managed": "test", **v}] for template, v in cases]
    done = subprocess.run(
        [sys.executable, "-c", RENDER, str(collections)],
        input=json.dumps(given),
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    result: list[dict[str, str]] = json.loads(done.stdout)
    return result


def systemd_words(line: str) -> list[str]:
    """The words systemd reads from a command line of double-quoted words (systemd.syntax(7))."""
    escapes = {"n": "\n", "t": "\t", "r": "\r", "a": "\a", "b": "\b", "f": "\f", "v": "\v", '"': '"', "\\": "\\"}
    words = []
    for match in re.finditer(r'"((?:[^"\\]|\\.)*)"', line):
        word = re.sub(r"\\x([0-9a-f]{2})|\\(.)", lambda m: chr(int(m[1], 16)) if m[1] else escapes[m[2]], match[1])
        words.append(word.replace("%%", "%").replace("$$", "$"))
    assert re.fullmatch(r'(?:"(?:[^"\\]|\\.)*"\s*)*', line), f"not a line of quoted words: {line!r}"
    return words


HOSTILE = 'img:1 --privileged\nExecStartPost=/bin/sh -c "evil" 100% $HOME\t\x01'


# --- the filters -----------------------------------------------------------------------------------------------------


def test_systemd_quote_keeps_any_value_one_word_on_one_line() -> None:
    quoted = systemd_quote(HOSTILE)
    assert "\n" not in quoted and "\t" not in quoted and "\x01" not in quoted
    assert systemd_words(quoted) == [HOSTILE]
    assert systemd_quote("100%", command=False) == '"100%%"'
    assert systemd_quote("$HOME", command=False) == '"$HOME"'  # Environment= expands no variables
    assert systemd_quote("$HOME") == '"$$HOME"'


@pytest.mark.skipif(SYSTEMD_ANALYZE is None, reason="systemd-analyze is missing (Debian package systemd)")
def test_systemd_parses_the_quoted_words(tmp_path: Path) -> None:
    unit = tmp_path / "quoted.service"
    words = ["/bin/echo", HOSTILE, "a b", 'c"d', 'a "b', "e\\f"]
    unit.write_text(f"[Service]\nExecStart={' '.join(systemd_quote(w) for w in words)}\n")
    checked = subprocess.run([str(SYSTEMD_ANALYZE), "verify", str(unit)], capture_output=True, text=True, check=False)
    assert checked.returncode == 0, checked.stderr
    # One of those words unquoted is a setting systemd refuses (an unbalanced quote), so the check above can fail.
    unit.write_text('[Service]\nExecStart=/bin/echo a "b\n')
    checked = subprocess.run([str(SYSTEMD_ANALYZE), "verify", str(unit)], capture_output=True, text=True, check=False)
    assert checked.returncode != 0 and "quoting" in checked.stderr


@pytest.mark.parametrize("value", ["a b", "a\nb", 'a"b', "a'b", "a\\b", "$x", "`x`", "a\tb", ""])
def test_args_word_refuses_what_systemd_would_split_or_keep_literally(value: str) -> None:
    from ansible.errors import AnsibleFilterError

    with pytest.raises(AnsibleFilterError, match="node_exporter_textfile_dir"):
        systemd_args_word(value, "node_exporter_textfile_dir")


def test_args_word_passes_paths_and_addresses() -> None:
    for value in ("--web.listen-address=[fd00::1]:9100", "--collector.textfile.directory=/var/lib/x_y-z.1"):
        assert systemd_args_word(value) == value


# --- the templates that write unit lines and ARGS ------------------------------------------------------------------

DCGM = {
    "dcgm_exporter_source": "container",
    "dcgm_exporter_container_runtime": "docker",
    "dcgm_exporter_image": HOSTILE,
    "__dcgm_exporter_runtime_binaries": {"docker": "/usr/bin/docker"},
    "__dcgm_exporter_container": "gpuinfra-dcgm-exporter",
    "__dcgm_exporter_gpu_args": {"docker": ["--gpus", "all"]},
    "__dcgm_exporter_mounts": ["/etc/dcgm-exporter", "/srv/job map"],
    "__dcgm_exporter_args": ["-a", "10.0.0.11:9400", "--hpc-job-mapping-dir", "/srv/job map"],
}


def test_dcgm_unit_keeps_a_hostile_image_name_inside_its_word(collections: Path, tmp_path: Path) -> None:
    [out] = render(collections, [("dcgm_exporter/templates/gpuinfra-dcgm-exporter.service.j2", DCGM)])
    text = out["text"]
    assert [line.split("=", 1)[0] for line in text.splitlines() if line.startswith("Exec")] == [
        "ExecStartPre",
        "ExecStart",
        "ExecStop",
    ]
    start = next(line for line in text.splitlines() if line.startswith("ExecStart="))
    words = systemd_words(start.removeprefix("ExecStart="))
    assert words[:4] == ["/usr/bin/docker", "run", "--rm", "--name"]
    assert HOSTILE in words and "--volume=/srv/job map:/srv/job map:ro" in words
    assert words[-4:] == ["-a", "10.0.0.11:9400", "--hpc-job-mapping-dir", "/srv/job map"]
    if SYSTEMD_ANALYZE:
        unit = tmp_path / "gpuinfra-dcgm-exporter.service"
        unit.write_text(text)
        checked = subprocess.run([SYSTEMD_ANALYZE, "verify", str(unit)], capture_output=True, text=True, check=False)
        assert "quoting" not in checked.stderr and "escape" not in checked.stderr, checked.stderr


def test_grafana_environment_lines_hold_one_assignment_each(collections: Path) -> None:
    variables = {
        "__grafana_listen_host": "10.0.0.1",
        "grafana_port": 3000,
        "__grafana_tls": True,
        "grafana_tls_cert_file": "/etc/ssl/my cert.pem\nEnvironment=GF_AUTH_ANONYMOUS_ENABLED=true",
        "__grafana_tls_key": "/etc/grafana/gpuinfra-tls.key",
        "grafana_admin_user": "admin",
        "__grafana_config_dir": "/etc/grafana",
    }
    [out] = render(collections, [("grafana/templates/grafana-server.conf.j2", variables)])
    lines = [line for line in out["text"].splitlines() if line.startswith("Environment=")]
    assignments = [systemd_words(line.removeprefix("Environment="))[0] for line in lines]
    assert "GF_AUTH_ANONYMOUS_ENABLED=false" in assignments
    assert "GF_AUTH_ANONYMOUS_ENABLED=true" not in assignments
    assert f"GF_SERVER_CERT_FILE={variables['grafana_tls_cert_file']}" in assignments


@pytest.mark.parametrize(
    ("template", "variables"),
    [
        (
            "node_exporter/templates/node-exporter.default.j2",
            {
                "__node_exporter_listen_address": "10.0.0.1:9100",
                "node_exporter_textfile_dir": "/var/lib/node exporter",
                "__node_exporter_web_config_needed": False,
                "node_exporter_extra_args": [],
            },
        ),
        (
            "prometheus/templates/prometheus.default.j2",
            {
                "prometheus_config_dir": "/etc/prometheus",
                "__prometheus_listen_address": "10.0.0.1:9090",
                "prometheus_retention": "15d\nARGS=--web.enable-admin-api",
                "__prometheus_web_config_needed": False,
            },
        ),
    ],
    ids=["node_exporter", "prometheus"],
)
def test_args_refuse_a_value_that_would_split(collections: Path, template: str, variables: dict[str, Any]) -> None:
    [out] = render(collections, [(template, variables)])
    assert "cannot be one word of the service's ARGS" in out.get("error", ""), out


def _alertmanager(collections: Path, hosts: dict[str, str]) -> list[str]:
    """Alertmanager's ARGS words on the first of `hosts` (name -> ansible_host)."""
    first = next(iter(hosts))
    variables = {
        "alertmanager_config_dir": "/etc/prometheus",
        "__alertmanager_bracketed_host": hosts[first],
        "alertmanager_port": 9093,
        "alertmanager_cluster_port": 9094,
        "__alertmanager_peers": [h for h in hosts if h != first],
        "__alertmanager_web_config_needed": True,
        "__alertmanager_web_config": "/etc/prometheus/alertmanager-web.yml",
        "hostvars": {name: {"ansible_host": address} for name, address in hosts.items()},
    }
    [out] = render(collections, [("alertmanager/templates/alertmanager.default.j2", variables)])
    [args] = re.findall(r'^ARGS="(.*)"$', out["text"], re.M)
    words: list[str] = args.split(" ")
    return words


def test_one_alertmanager_opens_no_gossip_port(collections: Path) -> None:
    words = _alertmanager(collections, {"mon01": "10.0.0.1"})
    assert "--cluster.listen-address=" in words
    assert not [w for w in words if w.startswith("--cluster.peer")]
    assert "--web.listen-address=10.0.0.1:9093" in words


def test_several_alertmanagers_gossip_on_their_cluster_addresses(collections: Path) -> None:
    words = _alertmanager(collections, {"mon01": "10.0.0.1", "mon02": "10.0.0.2", "mon03": "mon03.example.org"})
    assert "--cluster.listen-address=10.0.0.1:9094" in words
    assert [w for w in words if w.startswith("--cluster.peer")] == [
        "--cluster.peer=10.0.0.2:9094",
        "--cluster.peer=mon03.example.org:9094",
    ]


# --- secrets stay out of logs, diffs and defaults ------------------------------------------------------------------


def _tasks(role: str) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for path in sorted((ROOT / "roles" / role / "tasks").glob("*.yml")):
        stack = list(yaml_load(path.read_text()) or [])
        while stack:
            task = stack.pop(0)
            stack.extend(task.get("block", []))
            out.append((f"{path.name}: {task.get('name')}", task))
    return out


SECRET = re.compile(r"password|\.key|\.bcrypt|web-config|datasource|_hash|tls_key", re.I)


# The exporters and Alertmanager leave their password, key copy and web configuration to monitoring_web.
SECRET_WRITERS = ("monitoring_web", "prometheus", "grafana", "monitoring_tls")


@pytest.mark.parametrize("role", SECRET_WRITERS)
def test_tasks_that_touch_secrets_log_and_diff_nothing(role: str) -> None:
    """A task that writes a password, a hash, a key or a file holding one carries no_log, and a template or copy of
    such content shows no diff (`--diff` would print it)."""
    touching = []
    for name, task in _tasks(role):
        module = next((k for k in task if k.startswith("ansible.builtin.")), None)
        if module not in ("ansible.builtin.copy", "ansible.builtin.template", "ansible.builtin.command"):
            continue
        args = task[module]
        dest = json.dumps({k: v for k, v in args.items() if k in ("dest", "src", "content", "stdin")})
        if not SECRET.search(dest) or (module == "ansible.builtin.copy" and str(dest).endswith('.crt"}')):
            continue
        touching.append(name)
        if "CA key and certificate" in name or "host's key unless" in name:
            continue  # openssl writes the key itself (0600); neither the command line nor its output holds it
        assert task.get("no_log") is True, name
        if module != "ansible.builtin.command":
            assert task.get("diff") is False, name
    assert touching, f"{role}: no task touches a secret, so this test checks nothing"


@pytest.mark.parametrize("role", MONITORING_ROLES)
def test_no_password_ships_and_secrets_share_one_folder(role: str) -> None:
    defaults = yaml_load((ROOT / "roles" / role / "defaults" / "main.yml").read_text())
    assert not [k for k, v in defaults.items() if "password" in k and v], "a default password"
    munge = yaml_load((ROOT / "roles" / "munge" / "defaults" / "main.yml").read_text())["munge_secrets_dir"]
    assert defaults[f"{role}_secrets_dir"] == munge, "one secrets folder for the whole cluster"


@pytest.mark.parametrize("role", ["node_exporter", "dcgm_exporter", "prometheus", "alertmanager"])
def test_basic_auth_is_on_by_default(role: str) -> None:
    defaults = yaml_load((ROOT / "roles" / role / "defaults" / "main.yml").read_text())
    assert defaults[f"{role}_basic_auth"] is True
    assert defaults[f"{role}_listen_host"] == ""


# --- the cluster address -------------------------------------------------------------------------------------------


def test_an_ip_address_is_the_cluster_address() -> None:
    assert cluster_address.cluster_address("10.0.0.11") == ("10.0.0.11", ["10.0.0.11"])
    assert cluster_address.cluster_address("[fd00::1]") == ("fd00::1", ["fd00::1"])


def test_a_name_resolves_to_a_non_loopback_address_of_the_host(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cluster_address, "resolve", lambda name: ["127.0.1.1", "192.0.2.7", "10.1.2.3"])
    monkeypatch.setattr(cluster_address, "is_local", lambda address: address in ("127.0.1.1", "10.1.2.3"))
    assert cluster_address.cluster_address("gpu01") == ("10.1.2.3", ["127.0.1.1", "192.0.2.7", "10.1.2.3"])


def test_a_name_of_no_address_of_the_host_has_no_cluster_address() -> None:
    # localhost resolves to loopback addresses only; a loopback address is never a cluster address.
    address, resolved = cluster_address.cluster_address("localhost")
    assert address is None and resolved
    assert cluster_address.cluster_address("no-such-host.invalid") == (None, [])


def test_only_an_address_of_the_host_is_local() -> None:
    assert cluster_address.is_local("127.0.0.1")
    assert not cluster_address.is_local("192.0.2.1")  # TEST-NET-1: never assigned to a host


def test_the_module_fails_with_a_message_that_says_what_to_do(tmp_path: Path) -> None:
    args = tmp_path / "args.json"
    args.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": {"name": "localhost"}}))
    done = subprocess.run(
        [sys.executable, str(ROOT / "plugins" / "modules" / "cluster_address.py"), str(args)],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    result = json.loads(done.stdout)
    assert result["failed"] is True
    assert "'localhost' resolves to" in result["msg"] and "Set ansible_host" in result["msg"]
    assert "monitoring.listen: any" in result["msg"]


# --- generated TLS: the real role, the real openssl ----------------------------------------------------------------

TLS_PLAY = """
- name: Make the monitoring certificates
  hosts: all
  gather_facts: false
  roles:
    - role: gpuinfra.cluster.monitoring_tls
"""


@pytest.fixture(scope="module")
def generated_tls(collections: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Run the monitoring_tls role twice for two hosts on this machine (connection local, files in a temporary
    folder): the CA, the certificates, and both runs' stats."""
    if OPENSSL is None:
        pytest.skip("openssl is missing (Debian package openssl)")
    tmp = tmp_path_factory.mktemp("tls")
    inventory = {
        "all": {
            "hosts": {
                "mon01": {"ansible_host": "127.0.0.1", "monitoring_tls_dir": str(tmp / "hosts" / "mon01")},
                "gpu01": {"ansible_host": "127.0.0.1", "monitoring_tls_dir": str(tmp / "hosts" / "gpu01")},
            },
            "vars": {
                "ansible_connection": "local",
                "ansible_python_interpreter": sys.executable,
                "gpuinfra_cluster_name": "tls-test",
                "gpuinfra_secrets_dir": str(tmp / "secrets"),
            },
        }
    }
    (tmp / "inventory.json").write_text(json.dumps(inventory))
    (tmp / "play.yml").write_text(TLS_PLAY)
    env = {
        **os.environ,
        "ANSIBLE_COLLECTIONS_PATH": str(collections),
        "ANSIBLE_STDOUT_CALLBACK": "ansible.builtin.json",
        "ANSIBLE_LOCALHOST_WARNING": "false",
    }
    playbook = str(Path(sys.executable).parent / "ansible-playbook")
    stats = []
    for _ in range(2):
        done = subprocess.run(
            [playbook, "-i", str(tmp / "inventory.json"), str(tmp / "play.yml")],
            capture_output=True,
            text=True,
            env=env,
            check=False,
        )
        assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
        stats.append(json.loads(done.stdout)["stats"])
    return {"tmp": tmp, "stats": stats}


def test_generated_certificates_verify_against_the_ca(generated_tls: dict[str, Any]) -> None:
    tmp: Path = generated_tls["tmp"]
    for host in ("mon01", "gpu01"):
        folder = tmp / "hosts" / host
        assert sorted(p.name for p in folder.iterdir()) == ["ca.crt", "host.crt", "host.key"]
        checked = subprocess.run(
            [str(OPENSSL), "verify", "-CAfile", str(folder / "ca.crt"), str(folder / "host.crt")],
            capture_output=True,
            text=True,
            check=False,
        )
        assert checked.returncode == 0 and checked.stdout.strip().endswith(": OK"), checked.stdout + checked.stderr
        text = subprocess.run(
            [str(OPENSSL), "x509", "-noout", "-text", "-in", str(folder / "host.crt")],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        [sans] = re.findall(r"X509v3 Subject Alternative Name: *\n *(.*)", text)
        assert sans == f"DNS:{host}, IP Address:127.0.0.1", text
        assert "TLS Web Server Authentication" in text and "CA:FALSE" in text
        assert oct((folder / "host.key").stat().st_mode & 0o777) == "0o600"


def test_the_certificate_names_come_from_the_inventory_alone() -> None:
    """The controller decides: inventory names and addresses, and its own resolution of the names."""
    assert certificate.subject_alt_names(["gpu01", "10.0.0.11"]) == "DNS:gpu01,IP:10.0.0.11"
    assert certificate.subject_alt_names(["gpu01", "gpu01"]) == "DNS:gpu01"  # resolves nowhere here
    assert certificate.subject_alt_names(["gpu01", "fd00::11"]) == "DNS:gpu01,IP:fd00::11"
    assert certificate.subject_alt_names(["localhost"]) == "DNS:localhost"  # loopback resolutions are left out


@pytest.mark.parametrize(
    "forged",
    ["10.0.0.11\nbasicConstraints=critical,CA:TRUE", "gpu01,DNS:ctl01", "gpu01\nsubjectAltName=DNS:ctl01",
     "IP:10.0.0.1", "gpu01 ", ""],
)  # fmt: skip
def test_an_address_that_would_add_to_the_extensions_is_refused(forged: str) -> None:
    with pytest.raises(certificate.AnsibleFilterError, match="neither a host name nor an IP address"):
        certificate.subject_alt_names(["gpu01", forged])


# What root on a managed host can make any module run there answer: the controller's address, and a line that
# would end subjectAltName= and ask for a CA.
HOSTILE_ADDRESS_MODULE = """
from ansible.module_utils.basic import AnsibleModule
module = AnsibleModule(argument_spec={"name": {"type": "str", "required": True}})
module.exit_json(changed=False, address="10.0.0.1\\nbasicConstraints=critical,CA:TRUE", resolved=["10.0.0.1"])
"""


def _collection_with_hostile_host(root: Path) -> Path:
    """A collections path whose gpuinfra.cluster is this checkout, but for a cluster_address module that lies."""
    collection = root / "ansible_collections" / "gpuinfra" / "cluster"
    modules = collection / "plugins" / "modules"
    modules.mkdir(parents=True)
    for entry in ROOT.iterdir():
        if entry.name != "plugins":
            (collection / entry.name).symlink_to(entry)
    for entry in (ROOT / "plugins").iterdir():
        if entry.name != "modules":
            (collection / "plugins" / entry.name).symlink_to(entry)
    for entry in (ROOT / "plugins" / "modules").iterdir():
        if entry.name != "cluster_address.py":
            (modules / entry.name).symlink_to(entry)
    (modules / "cluster_address.py").write_text(HOSTILE_ADDRESS_MODULE)
    return root


def test_what_a_host_reports_never_reaches_its_certificate(tmp_path: Path) -> None:
    """The role with the real openssl, where every module run on the host answers as a hostile root would: the
    certificate names the inventory's name and address only, and is no CA."""
    assert OPENSSL is not None, "openssl is missing (Debian package openssl)"
    collections = _collection_with_hostile_host(tmp_path / "collections")
    folder = tmp_path / "hosts" / "gpu01"
    inventory = {"all": {"hosts": {"gpu01": {"ansible_host": "127.0.0.1", "monitoring_tls_dir": str(folder)}},
                         "vars": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable,
                                  "gpuinfra_cluster_name": "tls-test",
                                  "gpuinfra_secrets_dir": str(tmp_path / "secrets")}}}  # fmt: skip
    (tmp_path / "inventory.json").write_text(json.dumps(inventory))
    (tmp_path / "play.yml").write_text(TLS_PLAY)
    env = {**os.environ, "ANSIBLE_COLLECTIONS_PATH": str(collections), "ANSIBLE_LOCALHOST_WARNING": "false"}
    done = subprocess.run(
        [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(tmp_path / "inventory.json"),
         str(tmp_path / "play.yml")], capture_output=True, text=True, env=env, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    text = subprocess.run([str(OPENSSL), "x509", "-noout", "-text", "-in", str(folder / "host.crt")],
                          capture_output=True, text=True, check=True).stdout  # fmt: skip
    [sans] = re.findall(r"X509v3 Subject Alternative Name: *\n *(.*)", text)
    assert sans == "DNS:gpu01, IP Address:127.0.0.1", text
    assert "CA:FALSE" in text and "CA:TRUE" not in text and "10.0.0.1" not in text


def test_the_ca_key_stays_on_the_controller(generated_tls: dict[str, Any]) -> None:
    tmp: Path = generated_tls["tmp"]
    secrets = tmp / "secrets"
    assert oct(secrets.stat().st_mode & 0o777) == "0o700"
    for key in [secrets / "monitoring-ca.key", *sorted((secrets / "monitoring-tls").glob("*.key"))]:
        assert oct(key.stat().st_mode & 0o777) == "0o600", key
    ca_key = (secrets / "monitoring-ca.key").read_bytes()
    assert all(p.read_bytes() != ca_key for p in (tmp / "hosts").rglob("*") if p.is_file())


def test_a_second_run_changes_nothing(generated_tls: dict[str, Any]) -> None:
    first, second = generated_tls["stats"]
    assert first["mon01"]["changed"] > 0
    assert {host: second[host]["changed"] for host in ("mon01", "gpu01")} == {"mon01": 0, "gpu01": 0}


@pytest.mark.skipif(PROMTOOL is None, reason="promtool is missing (Debian package prometheus)")
def test_prometheus_accepts_the_generated_certificate(generated_tls: dict[str, Any], tmp_path: Path) -> None:
    folder = generated_tls["tmp"] / "hosts" / "mon01"
    assert PROMTOOL is not None  # the skipif above
    config = tmp_path / "web.yml"
    config.write_text(
        json.dumps({"tls_server_config": {"cert_file": str(folder / "host.crt"), "key_file": str(folder / "host.key")}})
    )
    checked = subprocess.run(
        [PROMTOOL, "check", "web-config", str(config)], capture_output=True, text=True, check=False
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_loopback_is_never_bound_by_mistake() -> None:
    """The address check binds, so it must release what it bound: a port stays free after it."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    assert cluster_address.is_local("127.0.0.1")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


def test_scrape_targets_quote_every_value_and_bracket_ipv6_addresses() -> None:
    """prometheus.yml's targets are written by one filter call; whatever a host's variables hold, each value stays
    one JSON string on its line, and YAML reads back exactly the inventory's values."""
    static_configs = load("plugins/filter/prometheus.py").prometheus_static_configs
    hostvars = {
        "gpu01": {"ansible_host": "fd00::11", "gpuinfra_node_group": "h100", "gpuinfra_gpu_count": 8},
        "gpu02": {"gpuinfra_node_group": 'odd"\n  - targets: [evil]'},
    }
    text = static_configs(["gpu01", "gpu02"], hostvars, 9400, gpus=True)
    parsed = YAML(typ="safe").load("static_configs:\n" + text)["static_configs"]
    assert parsed == [
        {"targets": ["[fd00::11]:9400"], "labels": {"instance": "gpu01", "node_group": "h100", "gpus_expected": "8"}},
        {
            "targets": ["gpu02:9400"],
            "labels": {"instance": "gpu02", "node_group": 'odd"\n  - targets: [evil]', "gpus_expected": "0"},
        },
    ]


# --- basic-auth hashes: made on the controller -----------------------------------------------------------------------

secrets_filter = load("plugins/filter/secrets.py")


def test_a_kept_hash_stays_while_it_matches_and_a_new_one_is_made_otherwise() -> None:
    first = secrets_filter.bcrypt_hash("s3cret\n")
    assert re.fullmatch(r"\$2b\$10\$[./A-Za-z0-9]{53}", first), first
    assert secrets_filter.bcrypt_hash("s3cret", f"{first}\n") == first
    assert secrets_filter.bcrypt_hash("other", first) != first
    assert secrets_filter.bcrypt_hash("s3cret", "not a hash").startswith("$2b$10$")
    with pytest.raises(secrets_filter.AnsibleFilterError, match="the password is empty"):
        secrets_filter.bcrypt_hash("\n")


SECRETS_PLAY = """
- name: The password steps of {service}, for the one host in play
  hosts: all
  gather_facts: false
  tasks:
    - name: Run them
      ansible.builtin.include_role:
        name: gpuinfra.cluster.monitoring_web
        tasks_from: password
      vars:
        monitoring_web_service: {service}
        monitoring_web_passwords: {passwords}
"""


@pytest.mark.parametrize("service", ["node-exporter", "dcgm-exporter", "alertmanager", "prometheus"])
def test_the_secrets_steps_run_on_the_controller_whichever_host_is_in_play(
    service: str, collections: Path, tmp_path: Path
) -> None:
    """The host in play (the only one that drifted, say) has no Python, so any step run on it fails: the password
    and its hash are made on the controller all the same, and a second run keeps both."""
    inventory = {"all": {"hosts": {"evil01": {"ansible_connection": "local",
                                              "ansible_python_interpreter": "/nonexistent/python3"}},
                         "vars": {"gpuinfra_cluster_name": "secrets-test",
                                  "gpuinfra_secrets_dir": str(tmp_path / "secrets")}}}  # fmt: skip
    (tmp_path / "inventory.json").write_text(json.dumps(inventory))
    others = ["node-exporter", "dcgm-exporter", "alertmanager"] if service == "prometheus" else []  # as it passes
    (tmp_path / "play.yml").write_text(SECRETS_PLAY.format(service=service, passwords=json.dumps(others)))
    env = {**os.environ, "ANSIBLE_COLLECTIONS_PATH": str(collections), "ANSIBLE_LOCALHOST_WARNING": "false"}
    runs = [
        subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(tmp_path / "inventory.json"),
                        str(tmp_path / "play.yml")], capture_output=True, text=True, env=env, check=False)
        for _ in range(2)
    ]  # fmt: skip
    for done in runs:
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    for other in others:
        assert (tmp_path / "secrets" / f"monitoring-{other}-password").stat().st_mode & 0o777 == 0o600
    password = (tmp_path / "secrets" / f"monitoring-{service}-password").read_text()
    hashed = (tmp_path / "secrets" / f"monitoring-{service}-password.bcrypt").read_text().strip()
    assert secrets_filter.bcrypt.checkpw(password.strip().encode(), hashed.encode())
    assert "changed=0" in runs[1].stdout, runs[1].stdout[-1500:]
