"""`gpuinfra apply` end to end on this machine: a real cluster file, real ansible-runner runs of a stand-in site.yml.

Hosts node1 and node2 run with the local connection; ops1 is reached over SSH on a port nothing listens on, so it
is unreachable unless --limit leaves it out.
"""

from __future__ import annotations

import json
import os
import signal
import threading
from pathlib import Path
from typing import Any

import pytest

from gpuinfra.cli import apply as apply_cli
from gpuinfra.cli import exitcodes, main
from gpuinfra.run import RunError
from gpuinfra.run import playbook as run_module

PLAYBOOKS = Path(__file__).parent / "data" / "playbooks"

CLUSTER = """\
name: apply-test
connection:
  port: 1
node_groups:
  compute:
    hosts: node[1-2]
    addresses: {node1: 127.0.0.1, node2: 127.0.0.2}
    roles: [monitoring]
  ops:
    hosts: ops1
    addresses: {ops1: 127.0.0.3}
    roles: [monitoring]
"""


@pytest.fixture
def cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(run_module, "PLAYBOOKS", PLAYBOOKS)
    out = tmp_path / "out"
    out.mkdir()
    monkeypatch.setenv("GPUINFRA_TEST_DIR", str(out))
    path = tmp_path / "cluster.yml"
    path.write_text(CLUSTER)
    return path


@pytest.fixture
def no_run(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Records any attempt to run a playbook; the tests using it expect none."""
    calls: list[Any] = []
    monkeypatch.setattr(apply_cli, "apply", lambda *args, **kwargs: calls.append(args))
    return calls


def slow_site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A site.yml whose only task takes a minute, on the local connection."""
    slow = tmp_path / "playbooks"
    slow.mkdir()
    (slow / "site.yml").write_text(
        "- name: Take long\n  hosts: all\n  connection: local\n  gather_facts: false\n  tasks:\n"
        "    - name: Wait\n      ansible.builtin.command: sleep 60\n      changed_when: false\n"
    )
    monkeypatch.setattr(run_module, "PLAYBOOKS", slow)


def apply(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["apply", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def apply_json(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, Any]]:
    code, out, _ = apply(capsys, *args, "--json")
    doc = json.loads(out)
    assert doc["exit_code"] == code
    return code, doc


def test_invalid_file_exits_3_and_runs_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], no_run: list[Any]
) -> None:
    bad = tmp_path / "bad.yml"
    bad.write_text("name: x\nnode_groups: {}\nsurprise: 1\n")
    code, _out, err = apply(capsys, str(bad), "--yes")
    assert code == exitcodes.INVALID_INPUT
    assert f"{bad}:" in err and "nothing was run" in err
    code, doc = apply_json(capsys, str(bad), "--yes")
    assert code == exitcodes.INVALID_INPUT
    assert doc["status"] == "invalid" and doc["diagnostics"]
    assert {"file", "line", "col", "path", "message"} <= set(doc["diagnostics"][0])
    assert no_run == []


def test_without_a_terminal_apply_needs_yes(
    cluster: Path, capsys: pytest.CaptureFixture[str], no_run: list[Any]
) -> None:
    code, _, err = apply(capsys, str(cluster))
    assert code == exitcodes.INVALID_INPUT
    assert "--yes" in err
    assert no_run == []


def test_a_limit_that_matches_nothing_is_invalid(
    cluster: Path, capsys: pytest.CaptureFixture[str], no_run: list[Any]
) -> None:
    code, doc = apply_json(capsys, str(cluster), "--yes", "--limit", "gpu-nowhere")
    assert code == exitcodes.INVALID_INPUT
    assert doc["status"] == "invalid" and "gpu-nowhere" in doc["errors"][0]
    assert no_run == []


def test_the_plan_of_an_apply_is_known_before_anything_runs(cluster: Path, no_run: list[Any]) -> None:
    """The library's half of apply that asks nothing and runs nothing: the inventory, the targets by node group."""
    from gpuinfra.apply import plan_apply
    from gpuinfra.errors import Refused
    from gpuinfra.validate.load import load_cluster

    plan = plan_apply(load_cluster(cluster), "node*")
    assert (plan.cluster, plan.targets, plan.hosts) == ("apply-test", ["node1", "node2"], 3)
    assert plan.node_groups == {"compute": (("monitoring",), ["node1", "node2"])}
    assert set(plan.inventory["all"]["hosts"]) == {"node1", "node2", "ops1"}
    with pytest.raises(Refused, match="gpu-nowhere"):
        plan_apply(load_cluster(cluster), "gpu-nowhere")
    assert no_run == []


@pytest.mark.tools
def test_apply_then_reapply_json(cluster: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = cluster.parent / "out"
    code, doc = apply_json(capsys, str(cluster), "--yes", "--limit", "node*", "--detailed-exitcode")
    assert code == exitcodes.CHANGES_PENDING
    assert doc["status"] == "changed" and doc["check"] is False
    assert doc["targets"] == ["node1", "node2"] and doc["limit"] == "node*"
    assert set(doc["hosts"]) == {"node1", "node2"}
    assert doc["hosts"]["node1"] == {
        "ok": 1,
        "changed": 1,
        "failed": 0,
        "unreachable": 0,
        "skipped": 0,
        "rescued": 0,
        "ignored": 0,
    }
    assert doc["failures"] == []
    assert [(c["host"], c["task"]) for c in doc["changes"]] == [
        ("node1", "Write the marker file"),
        ("node2", "Write the marker file"),
    ]
    assert doc["runner"] == {"status": "successful", "rc": 0}
    assert (out / "node1.txt").read_text() == "converged\n"

    code, doc = apply_json(capsys, str(cluster), "--yes", "--limit", "node*", "--detailed-exitcode")
    assert code == exitcodes.OK
    assert doc["status"] == "ok" and doc["changes"] == []
    assert all(stats["changed"] == 0 for stats in doc["hosts"].values())


@pytest.mark.tools
def test_changes_exit_0_without_detailed_exitcode(cluster: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, doc = apply_json(capsys, str(cluster), "--yes", "--limit", "node1")
    assert code == exitcodes.OK and doc["status"] == "changed"


@pytest.mark.tools
def test_check_reports_pending_changes_and_changes_nothing(cluster: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _err = apply(capsys, str(cluster), "--check", "--diff", "--limit", "node*", "--detailed-exitcode")
    assert code == exitcodes.CHANGES_PENDING
    assert "Changes pending (check mode: nothing was changed)" in out
    assert "node1:\n  ~ Write the marker file" in out
    assert "+converged" in out
    assert "2 change(s) pending on 2 of 2 host(s)" in out
    assert not list((cluster.parent / "out").iterdir())


@pytest.mark.tools
def test_unreachable_host_fails_with_its_name(cluster: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, doc = apply_json(capsys, str(cluster), "--yes")
    assert code == exitcodes.FAILED
    assert doc["status"] == "failed"
    (failure,) = doc["failures"]
    assert failure["host"] == "ops1" and failure["unreachable"] is True
    assert failure["task"] == "Ping the ops host"
    assert "port 1" in failure["message"]
    assert doc["hosts"]["ops1"]["unreachable"] == 1 and doc["hosts"]["node1"]["changed"] == 1


@pytest.mark.tools
def test_plain_output_without_a_terminal(cluster: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = apply(capsys, str(cluster), "--yes")
    assert code == exitcodes.FAILED
    lines = out.splitlines()
    assert "PLAY Converge compute nodes" in lines
    assert "TASK Write the marker file" in lines
    assert "  node1: changed" in lines and "  ops1: unreachable" in lines
    assert any(line.startswith("node1  ") and "changed=1" in line for line in lines)
    assert "UNREACHABLE ops1: Ping the ops host" in lines
    assert "Run failed" in lines[-1] and "0 host(s) failed, 1 unreachable, of 3" in lines[-1]
    # Ansible's own output never reaches the user: no recap, no task banners.
    assert "PLAY RECAP" not in out and "TASK [" not in out


@pytest.mark.tools
def test_timeout_exits_4(
    cluster: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    slow_site(tmp_path, monkeypatch)
    code, out, _ = apply(capsys, str(cluster), "--yes", "--timeout", "2", "--limit", "node1")
    assert code == exitcodes.TIMEOUT
    assert "Timed out after" in out.splitlines()[-1]


@pytest.mark.tools
def test_ctrl_c_cancels_with_exit_130(
    cluster: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    slow_site(tmp_path, monkeypatch)
    timer = threading.Timer(3.0, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    try:
        code, doc = apply_json(capsys, str(cluster), "--yes", "--limit", "node1", "--timeout", "50")
    finally:
        timer.cancel()
    assert code == exitcodes.CANCELLED
    assert doc["status"] == "cancelled" and doc["runner"]["status"] == "canceled"


def test_full_hands_the_run_gpuinfra_full(cluster: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`--full` tells the receipt probe to skip nothing; a plain apply leaves the choice to the receipts."""
    seen: list[Any] = []

    def capture(inventory: Any, options: Any, **kwargs: Any) -> Any:
        seen.append(dict(options.extra_vars))
        raise RunError("stop here")

    monkeypatch.setattr(apply_cli, "apply", capture)
    main(["apply", str(cluster), "--yes", "--full"])
    main(["apply", str(cluster), "--yes"])
    assert seen == [{"gpuinfra_full": True}, {}]


def test_apply_computes_the_role_variables_once(
    cluster: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The inventory the run gets holds every role variable; the plan's count of files renders no template."""
    from gpuinfra.render import inventory, plan
    from gpuinfra.run import RunError

    computed: list[str] = []
    real = inventory.group_vars

    def counted(rc: Any) -> Any:
        computed.append(rc.model.name)
        return real(rc)

    def handed(inventory: dict[str, Any], *args: Any, **kwargs: Any) -> None:
        computed.append(f"run with {len(inventory['all']['vars'])} vars")
        raise RunError("stopped here")

    monkeypatch.setattr(inventory, "group_vars", counted)
    monkeypatch.setattr(plan, "group_vars", counted)
    monkeypatch.setattr(plan, "Templar", None)  # any template rendered here would fail
    monkeypatch.setattr(apply_cli, "apply", handed)
    code, out, err = apply(capsys, str(cluster), "--yes")
    assert code == exitcodes.FAILED and "gpuinfra apply: stopped here" in err
    assert computed[0] == "apply-test" and computed[1].startswith("run with ") and len(computed) == 2
    assert "6 configuration files rendered from the model" in out
