"""No secret in what a run reports: nothing of a no_log task, no password hash, nothing from the secrets folders.

The events are built the way ansible-runner sends them (ansible-core 2.19 replaces a no_log result by a
`censored` note); the last test runs a real `ansible-playbook --check --diff` on this machine.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from gpuinfra.progress import HIDDEN, HIDDEN_DIFF, RunProgress
from gpuinfra.redact import REDACTED, Redactor, secrets_folders
from gpuinfra.run import Outcome, RunOptions, run_playbook

PLAYBOOKS = Path(__file__).parent / "data" / "playbooks"

# Hashes in the shapes crypt(3) writes: bcrypt, SHA-512-crypt with rounds, yescrypt.
BCRYPT = "$2b$12$SDZBgvA6cWRE7h8YVdP38OeMqJUz0lXo3ivCYkv4UiE8R6nnEFvZi"
SHA512 = (
    "$6$rounds=656000$ZgGZ5B3ZBHxsRl1o$"
    "8fF7tL0tUQ1D7F3y3Uv9JdAlI9JdV5wJ2tq0wS4aWkqXvJ6bC8Jc1mK2gQ8oX3fA9rQ1lR8pE7yB3nZ6wT0uH."
)
YESCRYPT = "$y$j9T$F5Jx5fExrKuPp53xLKQ..1$X3DX6M94c7o7ZZ6s5B1Sf8hT3bq0UqF/8d7n3X6pZuD"
CENSORED = "the output has been hidden due to the fact that 'no_log: true' was specified for this result"


def ok_event(host: str, task: str, res: dict[str, Any]) -> dict[str, Any]:
    return {"event": "runner_on_ok", "event_data": {"host": host, "task": task, "res": res}}


@pytest.mark.parametrize("hashed", [BCRYPT, BCRYPT.replace("$2b$", "$2a$"), BCRYPT.replace("$2b$", "$2y$"), SHA512])
def test_password_hashes_are_redacted_wherever_they_are(hashed: str) -> None:
    redact = Redactor()
    assert redact(f"+  admin: {hashed}\n") == f"+  admin: {REDACTED}\n"
    assert redact(json.dumps({"after": f"prometheus:{hashed}"})) == json.dumps({"after": f"prometheus:{REDACTED}"})


def test_yescrypt_is_redacted_and_ordinary_dollar_text_is_not() -> None:
    redact = Redactor()
    assert redact(f"alice:{YESCRYPT}:19000") == f"alice:{REDACTED}:19000"
    for text in ("costs $2 per hour", "echo $2$3", "PS1='$ '", "price: $2b$12$ too short"):
        assert redact(text) == text


def test_file_contents_under_the_secrets_folders_are_redacted_line_by_line(tmp_path: Path) -> None:
    folder = tmp_path / "secrets"
    (folder / "nested").mkdir(parents=True)
    (folder / "db-password").write_text("Zq8pXn2vLmR4tYw6\n")
    (folder / "nested" / "key").write_text("-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n")
    (folder / "short").write_text("yes\n")  # too short to be told from ordinary words
    redact = Redactor.from_folders([folder, tmp_path / "missing"])
    assert redact("+password=Zq8pXn2vLmR4tYw6") == f"+password={REDACTED}"
    assert redact("+b3BlbnNzaC1rZXktdjEAAAAA") == f"+{REDACTED}"
    assert redact("BEGIN OPENSSH PRIVATE KEY") == "BEGIN OPENSSH PRIVATE KEY"
    assert redact("yes, done") == "yes, done"


def test_secrets_folders_are_the_clusters_default_and_every_plain_secrets_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    inventory = {
        "all": {
            "vars": {
                "gpuinfra_cluster_name": "demo",
                "prometheus_secrets_dir": "{{ gpuinfra_secrets_dir | default('x') }}",  # a template: not a path yet
                "munge_secrets_dir": "/srv/munge-secrets",
            }
        }
    }
    assert secrets_folders(inventory, {"gpuinfra_secrets_dir": "~/vault"}) == [
        tmp_path / ".local" / "share" / "gpuinfra" / "demo",
        Path("/srv/munge-secrets"),
        tmp_path / "vault",
    ]
    assert secrets_folders({}) == []
    # The inventory gpuinfra renders marks every string unsafe.
    marked = {"all": {"vars": {"gpuinfra_cluster_name": {"__ansible_unsafe": "demo"}}}}
    assert secrets_folders(marked) == [tmp_path / ".local" / "share" / "gpuinfra" / "demo"]


def test_a_no_log_change_is_listed_without_its_diff() -> None:
    progress = RunProgress(["h1"])
    # What ansible-runner sends for a no_log task, in case a censored result still carried the diff.
    res = {"censored": CENSORED, "changed": True, "diff": [{"before": "", "after": "key=sekrit-value\n"}]}
    progress.handle(ok_event("h1", "munge : Install the cluster's Munge key", res))
    item = {"changed": True, "_ansible_no_log": True, "diff": {"before": "", "after": "sekrit-value\n"}}
    progress.handle(ok_event("h1", "Loop with no_log items", {"changed": True, "results": [item]}))
    assert [(c.task, c.diff) for c in progress.changes] == [
        ("munge : Install the cluster's Munge key", HIDDEN_DIFF),
        ("Loop with no_log items", HIDDEN_DIFF),
    ]
    failed = {"event": "runner_on_failed", "event_data": {"host": "h1", "task": "t", "res": {"censored": CENSORED}}}
    progress.handle(failed)
    assert progress.failures[0].message == HIDDEN


def test_a_no_log_change_is_listed_as_ansible_displayed_it() -> None:
    """ansible-runner replaces a no_log result by a bare `censored` note: `changed` is only in the display line."""
    progress = RunProgress(["h1"])
    censored = {"censored": CENSORED}
    # A warning may come first in the same event's output.
    changed = "\x1b[1;35m[WARNING]: something\x1b[0m\r\n\x1b[0;33mchanged: [h1 -> localhost]\x1b[0m"
    progress.handle({**ok_event("h1", "Write the key", censored), "stdout": changed})
    progress.handle({**ok_event("h1", "Check the key", censored), "stdout": "\x1b[0;32mok: [h1]\x1b[0m"})
    # A no_log loop: its items say changed; the loop's own result says nothing.
    item: dict[str, Any] = {"event": "runner_item_on_ok", "stdout": "changed: [h1] => (item=(censored due to no_log))"}
    item["event_data"] = {"host": "h1", "task": "Write the keys", "task_uuid": "u1", "res": censored}
    progress.handle(item)
    loop = ok_event("h1", "Write the keys", {"censored": CENSORED, "results": [censored]})
    loop["event_data"]["task_uuid"] = "u1"
    progress.handle({**loop, "stdout": ""})
    assert [(c.task, c.diff) for c in progress.changes] == [
        ("Write the key", HIDDEN_DIFF),
        ("Write the keys", HIDDEN_DIFF),
    ]
    assert progress.hosts["h1"].stats.changed == 2


def test_diffs_messages_names_and_ansible_errors_go_through_the_redactor(tmp_path: Path) -> None:
    (tmp_path / "db-password").write_text("Zq8pXn2vLmR4tYw6")
    progress = RunProgress(["h1"], redact=Redactor.from_folders([tmp_path]))
    diff = {"before": "", "after": f"admin: {BCRYPT}\npassword=Zq8pXn2vLmR4tYw6\n", "after_header": "web.yml"}
    progress.handle(ok_event("h1", "Write web.yml for Zq8pXn2vLmR4tYw6", {"changed": True, "diff": [diff]}))
    res = {"msg": "login failed", "stderr": "ERROR 1045: password Zq8pXn2vLmR4tYw6 refused", "rc": 1}
    progress.handle({"event": "runner_on_failed", "event_data": {"host": "h1", "task": "Log in", "res": res}})
    # Ansible 2.19 quotes the source lines around an error, which may hold a hash.
    progress.handle({"event": "verbose", "stdout": "[ERROR]: Task failed: bad value"})
    progress.handle({"event": "verbose", "stdout": f'5     hash: "{BCRYPT}"'})
    (change,) = progress.changes
    assert change.task == f"Write web.yml for {REDACTED}"
    assert f"+admin: {REDACTED}" in change.diff and f"+password={REDACTED}" in change.diff
    assert "Zq8pXn2vLmR4tYw6" not in progress.failures[0].message
    assert progress.errors == [f'Task failed: bad value\n5     hash: "{REDACTED}"']


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A home folder of the test's own, holding cluster demo's secrets where the roles keep them."""
    home = tmp_path / "home"
    secrets = home / ".local" / "share" / "gpuinfra" / "demo" / "secrets"
    secrets.mkdir(parents=True)
    (secrets / "db-password").write_text("Zq8pXn2vLmR4tYw6\n")
    (secrets / "munge.key").write_text("k" * 40 + "MungeKeyMaterial\n")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return home


@pytest.mark.tools
def test_a_real_check_diff_run_reports_no_secret(home: Path, tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.mkdir()
    inventory = {
        "all": {
            # As gpuinfra's inventory gives it: marked unsafe.
            "vars": {"gpuinfra_cluster_name": {"__ansible_unsafe": "demo"}},
            "hosts": {"n1": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}},
        }
    }
    options = RunOptions(
        playbook=PLAYBOOKS / "secrets.yml",
        check=True,
        diff=True,
        extra_vars={"target_dir": str(target), "admin_hash": BCRYPT},
    )
    result = run_playbook(inventory, options)
    assert result.outcome is Outcome.FAILED
    report = json.dumps(result.as_dict())
    for secret in ("Zq8pXn2vLmR4tYw6", "MungeKeyMaterial", BCRYPT, BCRYPT[7:]):
        assert secret not in report
    # The diffs were there, and shown with the secrets taken out.
    diffs = {change.task: change.diff for change in result.changes}
    assert f"+password={REDACTED}" in diffs["Write the database password into a configuration file"]
    assert f"+  admin: {REDACTED}" in diffs["Write a web password hash"]
    assert diffs["Write the key with no_log"] == HIDDEN_DIFF
    (failure,) = result.failures
    assert failure.message == f"cannot log in as slurm with {REDACTED}"
    assert os.listdir(target) == []  # check mode
