"""The sandbox's secrets stay where they belong: its SSH key outside the repository, the cluster's generated
secrets out of what `gpuinfra apply --check --diff --json` prints.

Runs after test_apply_e2e.py (file order), which leaves a converged sandbox and its generated secrets behind.
"""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
from pathlib import Path

import pytest
from harness import MARKS, ROOT, SANDBOX_CLUSTER, gpuinfra

from gpuinfra.progress import HIDDEN_DIFF

SECRETS = Path.home() / ".local" / "share" / "gpuinfra" / "sandbox"
BCRYPT = re.compile(r"\$2[abxy]?\$\d{2}\$[./A-Za-z0-9]{22,}")


pytestmark = MARKS


def private_key_files(root: Path) -> list[Path]:
    """Files under `root` that hold a private key (PEM or OpenSSH), leaving out .git and the venv's packages."""
    found = []
    for folder, dirs, files in os.walk(root):
        here = Path(folder)
        dirs[:] = [d for d in dirs if d != ".git" and here / d != root / ".venv" / "lib"]
        for name in files:
            path = here / name
            if path.is_symlink() or not path.is_file():
                continue
            try:
                with path.open("rb") as source:
                    head = source.read(200).lstrip()
            except OSError:
                continue
            if head.startswith(b"-----BEGIN ") and b"PRIVATE KEY-----" in head:
                found.append(path)
    return found


def test_no_private_key_is_written_inside_the_repository() -> None:
    up = gpuinfra("sandbox", "up", "--json")
    assert up.returncode == 0, up.stderr
    state = Path(json.loads(up.stdout)["state_dir"])
    assert not state.resolve().is_relative_to(ROOT.resolve())
    assert stat.S_IMODE(state.stat().st_mode) == 0o700
    key = state / "id_ed25519"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert key.read_text().startswith("-----BEGIN OPENSSH PRIVATE KEY-----")
    assert private_key_files(ROOT) == []


# Files with a secret in them, edited on the hosts so that the check has a change, and so a diff, to show there.
EDITED = {"gpu01": "/etc/prometheus/node-exporter-web.yml", "ctl01": "/etc/slurm/slurmdbd.conf"}


def on_host(host: str, script: str) -> subprocess.CompletedProcess[str]:
    from gpuinfra.sandbox import ssh

    return ssh(SANDBOX_CLUSTER, host, [script])


def test_apply_check_diff_json_prints_no_secret() -> None:
    generated = [p for p in SECRETS.rglob("*") if p.is_file() and p.parent.name != "ssh"]
    if not any(p.name == "munge.key" for p in generated):
        pytest.skip(f"no apply has generated the sandbox's secrets in {SECRETS} yet")
    for host, path in EDITED.items():
        edit = on_host(host, f"cp -p {path} {path}.before-test && echo '# a local edit' >> {path}")
        assert edit.returncode == 0, edit.stderr
    try:
        done = gpuinfra("apply", str(SANDBOX_CLUSTER), "--check", "--diff", "--json")
    finally:
        for host, path in EDITED.items():
            on_host(host, f"mv -f {path}.before-test {path}")
    assert done.stdout, done.stderr
    doc = json.loads(done.stdout)
    assert doc["exit_code"] == done.returncode
    # The edits are seen: the check reports a change on both hosts; slurmdbd.conf's task is no_log, so its diff is
    # hidden.
    assert {"gpu01", "ctl01"} <= {change["host"] for change in doc["changes"]}, doc["changes"]
    assert any(c["host"] == "ctl01" and c["diff"] == HIDDEN_DIFF for c in doc["changes"]), doc["changes"]
    printed = done.stdout + done.stderr
    assert not BCRYPT.search(printed)
    for secret in generated:
        for line in secret.read_text(errors="replace").splitlines():
            if len(line.strip()) >= 8:
                assert line.strip() not in printed, f"{secret.name} is in apply's output"
