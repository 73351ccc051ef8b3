"""The receipt action and module, through ansible-playbook on this machine: a recorded role is fresh until its inputs,
a secret on the controller, or any kind of state it watches changes; each kind of drift makes it stale, naming it."""

from __future__ import annotations

import hashlib
import hmac
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import AnsibleJson
from file_module import collection_module, load

pytestmark = pytest.mark.tools  # runs Ansible or a system tool (tests/unit/tool_guard.py)

ROOT = Path(__file__).resolve().parents[2]
ANSIBLE_PLAYBOOK = Path(sys.executable).parent / "ansible-playbook"
INPUTS = "0123456789abcdef01234567"


class Host:
    """This machine as a host whose systemctl and dpkg-query are fakes reading state files the tests edit."""

    def __init__(self, tmp: Path, ansible: AnsibleJson) -> None:
        self.tmp, self.ansible = tmp, ansible
        self.bin = tmp / "bin"
        self.bin.mkdir()
        self.receipts = tmp / "receipts"
        self.managed = tmp / "etc" / "demo.conf"
        self.managed.parent.mkdir()
        self.managed.write_text("setting = 1\n")
        self.library = tmp / "lib" / "demo"
        self.library.mkdir(parents=True)
        (self.library / "check.py").write_text("print('ok')\n")
        self.secret = tmp / "secrets" / "demo-password"
        self.secret.parent.mkdir()
        self.secret.write_text("s3cret-s3cret-s3cret")
        self.units = self._state("units", "Id=demo.service\nActiveState=active\nUnitFileState=enabled\n")
        self.packages = self._state("packages", "demo\tii \t1.2-1\thold\n")
        self.command_output = self._state("command", "cluster qos normal\n")
        self.verdict = self._state("verdict", "0 idle\n")  # the exit code and output of the `verdict` check
        self._tool("systemctl", f"cat '{self.units}'")
        self._tool("verdict", f'read code answer < \'{self.verdict}\'; echo "$answer"; exit "$code"')
        self._tool("dpkg-query", f"cat '{self.packages}'")

    def _state(self, name: str, text: str) -> Path:
        path = self.tmp / f"{name}.state"
        path.write_text(text)
        return path

    def _tool(self, name: str, body: str) -> None:
        script = self.bin / name
        script.write_text(f"#!/bin/sh\n{body}\n")
        script.chmod(0o755)

    def run(
        self,
        *tasks: dict[str, Any],
        inputs: str | None = INPUTS,
        check: bool = False,
        variables: dict[str, Any] | None = None,
        extra_vars: dict[str, Any] | None = None,
    ) -> list[dict[str, Any]]:
        """Run the tasks in one play on localhost; returns each task's result. `variables` go into the inventory,
        `extra_vars` on the command line (-e)."""
        play = {"hosts": "localhost", "gather_facts": False, "tasks": list(tasks)}
        playbook = self.tmp / "play.yml"
        playbook.write_text(json.dumps([play]))
        host_vars = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable, **(variables or {})}
        if inputs is not None:
            host_vars["gpuinfra_receipt_demo"] = inputs
        inventory = self.tmp / "inventory.json"
        inventory.write_text(json.dumps({"all": {"hosts": {"localhost": host_vars}}}))
        command = [str(ANSIBLE_PLAYBOOK), "-i", str(inventory), str(playbook), *(["--check"] if check else [])]
        if extra_vars:
            command += ["-e", json.dumps(extra_vars)]
        rc, output, _ = self.ansible(command, self.bin)
        results = [task["hosts"]["localhost"] for task in output["plays"][0]["tasks"]]
        assert rc == 0, results
        return results

    def record(self) -> dict[str, Any]:
        return {
            "gpuinfra.cluster.receipt": {
                "state": "record",
                "role": "demo",
                "directory": str(self.receipts),
                "paths": [str(self.managed), str(self.tmp / "etc" / "*.d"), str(self.library)],
                "folders": [str(self.managed.parent)],
                "services": ["demo.service"],
                "packages": ["demo"],
                "commands": [["cat", str(self.command_output)]],
                "checks": [{"argv": [str(self.bin / "verdict")], "stdout": "idle|mixed"}],
                "secrets": [str(self.secret)],
            }
        }

    def probe(self) -> dict[str, Any]:
        return {
            "gpuinfra.cluster.receipt": {
                "state": "probe",
                "directory": str(self.receipts),
                "secrets_dir": str(self.secret.parent),
            }
        }


@pytest.fixture
def host(tmp_path: Path, ansible_json: AnsibleJson) -> Host:
    return Host(tmp_path, ansible_json)


def test_a_recorded_role_is_fresh_and_its_receipt_is_root_only(host: Host) -> None:
    record, probe = host.run(host.record(), host.probe())
    assert record["changed"] is False  # bookkeeping, not a change to the cluster
    assert (probe["fresh"], probe["stale"]) == (["demo"], {})
    receipt = host.receipts / "demo.json"
    assert oct(receipt.stat().st_mode & 0o777) == "0o600"
    assert oct(host.receipts.stat().st_mode & 0o777) == "0o700"
    assert "s3cret" not in receipt.read_text()  # only the secret's digest is kept


def test_the_probe_puts_the_host_in_the_group_of_each_skipped_role(host: Host) -> None:
    """One task per host: the fresh role, the roles left out, and a guard whose roles are all skipped."""
    probe = host.probe()
    probe["gpuinfra.cluster.receipt"] |= {
        "group_prefix": "fresh_",
        "left_out": ["absent"],
        "guards": {"checks": ["demo", "absent"], "other_checks": ["demo", "stale"]},
    }
    groups = {"ansible.builtin.debug": {"var": "group_names"}}
    _, _, seen = host.run(host.record(), probe, groups)
    assert seen["group_names"] == ["fresh_absent", "fresh_checks", "fresh_demo"]


def test_the_probe_asks_systemctl_and_dpkg_once_for_every_role(host: Host) -> None:
    """A host's probe reads the services and packages of all its receipts in one query each: per role, they would
    cost a GPU node some thirty commands at each apply."""
    calls = host.tmp / "calls"

    def fake(name: str, line: str) -> None:  # logs the names it is asked about, and answers for each
        skip = 'while [ "$1" != -- ]; do shift; done; shift'
        host._tool(name, f"""{skip}; echo {name} "$@" >> '{calls}'; for x in "$@"; do printf '{line}' "$x"; done""")

    fake("systemctl", "Id=%s\\nActiveState=active\\nUnitFileState=enabled\\n\\n")
    fake("dpkg-query", "%s\\tii \\t1.0\\tinstall\\n")
    other = host.record()
    other["gpuinfra.cluster.receipt"] |= {"role": "other", "services": ["other.service"], "packages": ["other"]}
    host.run(host.record(), other, variables={"gpuinfra_receipt_other": INPUTS})
    calls.unlink()
    (probe,) = host.run(host.probe(), variables={"gpuinfra_receipt_other": INPUTS})
    assert (probe["fresh"], probe["stale"]) == (["demo", "other"], {})
    asked = calls.read_text().splitlines()
    assert asked == ["systemctl demo.service other.service", "dpkg-query demo other"]


def test_without_left_out_the_probe_reads_the_inventory_s_roles_left_out(host: Host) -> None:
    """playbooks/receipts.yml names no left_out: the cluster's and the host's own come from the inventory."""
    probe = host.probe()
    probe["gpuinfra.cluster.receipt"]["group_prefix"] = "fresh_"
    groups = {"ansible.builtin.debug": {"var": "group_names"}}
    left_out = {"gpuinfra_roles_left_out": ["kueue"], "gpuinfra_host_roles_left_out": ["mig"]}
    _, _, seen = host.run(host.record(), probe, groups, variables=left_out)
    assert seen["group_names"] == ["fresh_demo", "fresh_kueue", "fresh_mig"]


def _remove_managed_folder(h: Host) -> None:
    for p in h.managed.parent.iterdir():
        p.unlink()
    h.managed.parent.rmdir()


# Each kind of drift: (what is changed, the start of the reason the probe gives).
DRIFT: dict[str, tuple[Callable[[Host], object], str]] = {
    "file edited": (lambda h: h.managed.write_text("setting = 2\n"), "paths "),
    "file mode changed": (lambda h: h.managed.chmod(0o600), "paths "),
    "file removed": (lambda h: h.managed.unlink(), "paths "),
    "file added where a pattern watches": (lambda h: (h.tmp / "etc" / "extra.d").mkdir(), "paths "),
    "file added to a watched folder": (lambda h: (h.library / "extra.py").write_text(""), "paths "),
    "service stopped": (
        lambda h: h.units.write_text("Id=demo.service\nActiveState=inactive\nUnitFileState=enabled\n"),
        "services demo.service",
    ),
    "service disabled": (
        lambda h: h.units.write_text("Id=demo.service\nActiveState=active\nUnitFileState=disabled\n"),
        "services demo.service",
    ),
    "service masked": (
        lambda h: h.units.write_text("Id=demo.service\nActiveState=active\nUnitFileState=masked\n"),
        "services demo.service",
    ),
    "folder opened to others": (lambda h: h.managed.parent.chmod(0o777), "folders "),
    "folder removed": (_remove_managed_folder, "folders "),
    "receipts folder opened to others": (lambda h: h.receipts.chmod(0o755), "the receipts folder"),
    "package moved off its version": (lambda h: h.packages.write_text("demo\tii \t1.3-1\thold\n"), "packages demo"),
    "hold removed": (lambda h: h.packages.write_text("demo\tii \t1.2-1\tinstall\n"), "packages demo"),
    "package removed": (lambda h: h.packages.write_text(""), "packages demo"),
    "command output changed": (lambda h: h.command_output.write_text("cluster qos high\n"), "commands cat"),
    "check fails": (lambda h: h.verdict.write_text("1 idle\n"), "check "),
    "check answers otherwise": (lambda h: h.verdict.write_text("0 down\n"), "check "),
    "secret changed on the controller": (lambda h: h.secret.write_text("another-secret-value"), "a secret"),
    "secret gone from the controller": (lambda h: h.secret.unlink(), "a secret"),
    "receipt lost": (lambda h: (h.receipts / "demo.json").unlink(), "no receipt"),
}


@pytest.mark.parametrize("kind", DRIFT)
def test_each_kind_of_drift_makes_the_role_stale(host: Host, kind: str) -> None:
    host.run(host.record())
    change, reason = DRIFT[kind]
    change(host)
    (probe,) = host.run(host.probe())
    assert probe["fresh"] == []
    assert probe["stale"]["demo"].startswith(reason), probe["stale"]


def test_a_check_must_pass_at_each_probe_whatever_it_answered_at_record(host: Host) -> None:
    """A check is a verdict, not a state to compare: one that failed when the receipt was written and passes now
    leaves the role fresh, and one that passed then fails now makes it stale, saying how."""
    host.verdict.write_text("1 down\n")
    host.run(host.record())
    host.verdict.write_text("0 mixed\n")
    (probe,) = host.run(host.probe())
    assert (probe["fresh"], probe["stale"]) == (["demo"], {})
    host.verdict.write_text("0 drained\n")
    (probe,) = host.run(host.probe())
    assert probe["stale"] == {"demo": f"check {host.bin / 'verdict'} answered 'drained'"}
    host.verdict.write_text("2 mixed\n")
    (probe,) = host.run(host.probe())
    assert probe["stale"] == {"demo": f"check {host.bin / 'verdict'} exited 2"}


def test_a_bytecode_cache_beside_a_watched_library_is_no_drift(host: Host) -> None:
    """Python writes __pycache__ the first time the library runs, after the role recorded its receipt."""
    host.run(host.record())
    (host.library / "__pycache__").mkdir()
    (host.library / "__pycache__" / "check.cpython-311.pyc").write_bytes(b"\x00")
    (probe,) = host.run(host.probe())
    assert (probe["fresh"], probe["stale"]) == (["demo"], {})


def test_new_inputs_make_the_role_stale(host: Host) -> None:
    host.run(host.record())
    (probe,) = host.run(host.probe(), inputs="f" * 24)
    assert probe["stale"] == {"demo": "its inputs changed"}


def test_without_inputs_digests_nothing_is_recorded_or_skipped(host: Host) -> None:
    record, probe = host.run(host.record(), host.probe(), inputs=None)
    assert record.get("skipped") is True
    assert not host.receipts.exists()
    assert probe["fresh"] == []


def test_check_mode_records_nothing(host: Host) -> None:
    host.run(host.record(), check=True)
    assert not host.receipts.exists()


def test_full_runs_every_role(host: Host) -> None:
    host.run(host.record())
    probe = {**host.probe(), "vars": {"gpuinfra_full": True}}
    (result,) = host.run(probe)
    assert (result["fresh"], result["stale"]) == ([], {})


def test_packages_that_cannot_be_read_never_count_as_unchanged() -> None:
    """On a host without dpkg, the package watch cannot vouch for anything: the role always runs."""
    module = load("plugins/modules/receipt.py")
    unknown = {"packages": {"demo": module.UNKNOWN}}
    assert module.differences(unknown, unknown) == ["packages demo: 'unknown' -> 'unknown'"]
    known = {"packages": {"demo": "1.2-1 hold"}}
    assert module.differences(known, known) == []


# What `systemctl show --property=Id,ActiveState,UnitFileState` answers for an enabled unit the role keeps running,
# in each ActiveState but `active`: a start still going or a restart loop between crashes (`activating`, sub-state
# `start` or `auto-restart`), a reload under way, a stop under way, stopped, and failed.
NOT_RUNNING = {
    state: f"Id=demo.service\nActiveState={state}\nUnitFileState=enabled\n"
    for state in ("activating", "reloading", "deactivating", "inactive", "failed")
}


@pytest.mark.parametrize("state", NOT_RUNNING)
def test_no_receipt_is_written_while_a_unit_is_not_active(host: Host, state: str) -> None:
    """A role whose service is not running is not converged (a restart loop looks `activating` most of the time):
    no receipt, and the one an earlier run wrote goes, so the next apply runs the role again."""
    host.run(host.record())
    host.units.write_text(NOT_RUNNING[state])
    record, probe = host.run(host.record(), host.probe())
    assert record["msg"] == f"no receipt while a unit is not active: demo.service is {state}"
    assert not (host.receipts / "demo.json").exists()
    assert probe["stale"] == {"demo": "no receipt"}


@pytest.mark.parametrize("state", NOT_RUNNING)
def test_a_receipt_that_recorded_a_unit_not_active_never_holds(host: Host, state: str) -> None:
    """A receipt written while the unit was already in that state (by an older module) shows no drift when the unit
    is still in it: the probe judges the unit's state itself."""
    host.run(host.record())
    receipt = host.receipts / "demo.json"
    written = json.loads(receipt.read_text())
    written["state"]["services"]["demo.service"] = f"{state}/enabled"
    receipt.write_text(json.dumps(written))
    host.units.write_text(NOT_RUNNING[state])
    (probe,) = host.run(host.probe())
    assert probe["stale"] == {"demo": f"services demo.service is {state}, not active"}


def test_the_receipt_holds_until_its_stale_after_time(host: Host) -> None:
    """A certificate's receipt is recorded with its renewal time: past it, the role runs again."""
    later = {**host.record()["gpuinfra.cluster.receipt"], "stale_after": int(time.time()) + 3600}
    (probe,) = host.run({"gpuinfra.cluster.receipt": later}, host.probe())[1:]
    assert probe["fresh"] == ["demo"]
    due = {**later, "stale_after": int(time.time()) - 1}
    (probe,) = host.run({"gpuinfra.cluster.receipt": due}, host.probe())[1:]
    assert probe["stale"] == {"demo": "what it made expires (a certificate due for renewal)"}


def test_values_given_outside_the_inventory_digest_are_inputs_too(host: Host) -> None:
    """The role's public variables, named by gpuinfra_receipt_variables, count with the values the run gives
    them from any source: here -e, and a template in the inventory that reaches a value given with -e (as
    `munge_key: "{{ vault_munge_key }}"` reaches a vaulted one). The digest kept on the host is keyed by the
    controller's secrets folder, so the value itself cannot be tested against it."""
    variables = {
        "gpuinfra_receipt_variables": {"demo": ["demo_key", "demo_port"]},
        "gpuinfra_secrets_dir": str(host.secret.parent),
        "demo_key": "{{ vault_demo_key }}",
    }
    first = {"vault_demo_key": "first-key-first-key", "demo_port": 9100}
    host.run(host.record(), variables=variables, extra_vars=first)
    (probe,) = host.run(host.probe(), variables=variables, extra_vars=first)
    assert probe["fresh"] == ["demo"]
    for changed in ({**first, "vault_demo_key": "second-key-second"}, {**first, "demo_port": 9101}):
        (probe,) = host.run(host.probe(), variables=variables, extra_vars=changed)
        assert probe["stale"] == {"demo": "its inputs changed"}, changed
    receipt = (host.receipts / "demo.json").read_text()
    assert "first-key" not in receipt
    key = host.secret.parent / "receipts.key"
    assert oct(key.stat().st_mode & 0o777) == "0o600" and len(key.read_bytes()) == 32


def test_secret_digests_are_keyed_and_leave_other_hosts_files_out(tmp_path: Path) -> None:
    """What a host is handed (and keeps in its receipts) of the controller's secrets: an HMAC under the controller's
    key, which no guess can be tested against, and nothing of the files another host owns."""
    collection_module("plugins/module_utils/receipt_protocol.py")  # what the action plugin imports
    action = load("plugins/action/receipt.py")
    folder = tmp_path / "secrets"
    (folder / "monitoring-tls").mkdir(parents=True)
    files = {"munge.key": b"shared", "receipts.key": b"k" * 32, "monitoring-tls/gpu01.key": b"mine",
             "monitoring-tls/gpu02.key": b"theirs", "monitoring-tls/ctl01.crt": b"theirs too"}  # fmt: skip
    for name, content in files.items():
        (folder / name).write_bytes(content)
    key = b"controller-only-key"
    got = action.secret_digests([str(folder)], key, str(folder), "gpu01", ["ctl01", "gpu01", "gpu02"])
    named = sorted(Path(path).relative_to(folder).as_posix() for path in got)
    assert named == ["monitoring-tls/gpu01.key", "munge.key"]
    for path, digest in got.items():
        content = Path(path).read_bytes()
        assert digest == hmac.new(key, content, hashlib.sha256).hexdigest() != hashlib.sha256(content).hexdigest()


def test_the_module_never_logs_its_digests(monkeypatch: pytest.MonkeyPatch) -> None:
    """A module's arguments go to the host's journal unless marked no_log."""
    module = load("plugins/modules/receipt.py")
    seen: dict[str, Any] = {}

    def capture(argument_spec: dict[str, Any], **kwargs: Any) -> None:
        seen.update(argument_spec)
        raise SystemExit(0)

    monkeypatch.setattr(module, "AnsibleModule", capture)
    with pytest.raises(SystemExit):
        module.main()
    assert (seen["inputs"].get("no_log"), seen["secrets"].get("no_log")) == (True, True)
