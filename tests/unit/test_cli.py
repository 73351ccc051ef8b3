"""The read-only verbs end to end through `gpuinfra.cli.main`: exit codes, --json, and the real ansible-inventory."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
from ruamel.yaml import YAML

from gpuinfra.cli import exitcodes, main
from gpuinfra.render.inventory import inventory_yaml
from gpuinfra.validate.load import load_cluster

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "inventories").glob("*/cluster.yml"))
SMALL = ROOT / "inventories" / "slurm-small" / "cluster.yml"
BAD = ROOT / "tests" / "unit" / "bad"


def test_validate_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", str(SMALL)]) == exitcodes.OK
    assert "valid" in capsys.readouterr().err
    assert main(["validate", str(SMALL), str(BAD / "unknown_key.yml")]) == exitcodes.INVALID_INPUT
    err = capsys.readouterr().err
    assert "unknown_key.yml: 2 errors" in err


def test_validate_json_lists_every_file(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", "--json", str(SMALL), str(BAD / "many_errors.yml")]) == exitcodes.INVALID_INPUT
    doc = json.loads(capsys.readouterr().out)
    assert (doc["status"], doc["exit_code"]) == ("invalid", exitcodes.INVALID_INPUT)
    results = doc["files"]
    assert [r["valid"] for r in results] == [True, False]
    errors = [d for d in results[1]["diagnostics"] if d["severity"] == "error"]
    assert len(errors) > 3
    assert all({"file", "line", "col", "path", "message"} <= set(d) for d in errors)


@pytest.mark.tools
def test_user_mistakes_never_print_a_traceback(tmp_path: Path) -> None:
    """Run the installed entry point on every bad file at once (one start of Python, not one per file): exit 3, no
    traceback, and each file counted among the invalid ones."""
    bad = sorted(BAD.glob("*.yml"))
    done = subprocess.run(
        [sys.executable, "-m", "gpuinfra", "validate", *map(str, bad)], capture_output=True, text=True, check=False
    )
    assert done.returncode == exitcodes.INVALID_INPUT, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    counted = re.findall(r"^(.*\.yml): \d+ errors?$", done.stderr, re.M)
    assert counted == [str(path) for path in bad], done.stderr[-3000:]


@pytest.mark.tools
def test_a_reader_that_stops_early_ends_the_output_quietly() -> None:
    """`gpuinfra schema | head -1`: the reader closes the pipe after its first line; gpuinfra stops with the exit code
    a shell gives a tool SIGPIPE ended, and no traceback."""
    with subprocess.Popen(
        [sys.executable, "-m", "gpuinfra", "schema"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as done:
        assert done.stdout is not None and done.stderr is not None
        assert done.stdout.readline().strip() == "{"
        done.stdout.close()
        errors = done.stderr.read()
    assert (done.returncode, errors) == (exitcodes.OUTPUT_CLOSED, ""), errors[-3000:]


def test_schema_is_a_json_schema_that_accepts_the_examples(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["schema"]) == exitcodes.OK
    schema = json.loads(capsys.readouterr().out)
    jsonschema.Draft202012Validator.check_schema(schema)
    for example in EXAMPLES:
        jsonschema.validate(YAML(typ="safe", pure=True).load(example.read_text()), schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"name": "x", "node_groups": {"a": {"hosts": "a1"}}, "bogus": 1}, schema)


@pytest.mark.tools
@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.parent.name)
def test_inventory_matches_ansible_inventory(example: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Our JSON equals what the real ansible-inventory prints for the same inventory written as YAML."""
    assert main(["inventory", str(example)]) == exitcodes.OK
    ours = json.loads(capsys.readouterr().out)
    static = tmp_path / "hosts.yml"
    static.write_text(json.dumps(inventory_yaml(load_cluster(example).resolved)))  # JSON is YAML
    env = {**os.environ, "ANSIBLE_INVENTORY_ENABLED": "yaml", "ANSIBLE_LOCALHOST_WARNING": "false"}
    done = subprocess.run(
        [str(Path(sys.executable).parent / "ansible-inventory"), "-i", str(static), "--list", "--export"],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    )
    assert ours == json.loads(done.stdout)


def test_inventory_of_an_invalid_file_exits_3(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inventory", str(BAD / "unknown_key.yml")]) == exitcodes.INVALID_INPUT
    assert capsys.readouterr().out == ""
    # With --json, the diagnostics come as JSON on stdout, as from every other verb.
    assert main(["inventory", "--json", str(BAD / "unknown_key.yml")]) == exitcodes.INVALID_INPUT
    doc = json.loads(capsys.readouterr().out)
    assert doc["valid"] is False and doc["diagnostics"], doc


def test_every_verb_wraps_its_json_in_one_document(capsys: pytest.CaptureFixture[str]) -> None:
    """inventory and schema print Ansible's inventory and a JSON Schema as they are; with --json, inside the document
    every verb prints (its status and exit code)."""
    assert main(["schema"]) == exitcodes.OK
    schema = json.loads(capsys.readouterr().out)
    assert main(["schema", "--json"]) == exitcodes.OK
    assert json.loads(capsys.readouterr().out) == {"status": "ok", "schema": schema, "exit_code": 0}
    assert main(["inventory", str(SMALL)]) == exitcodes.OK
    inventory = json.loads(capsys.readouterr().out)
    assert "_meta" in inventory
    assert main(["inventory", "--json", str(SMALL)]) == exitcodes.OK
    doc = json.loads(capsys.readouterr().out)
    assert doc == {"status": "ok", "inventory": inventory, "exit_code": 0, "file": str(SMALL)}


def test_plan_writes_every_artifact(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", str(SMALL), "--out", str(tmp_path), "--json"]) == exitcodes.OK
    doc = json.loads(capsys.readouterr().out)
    assert (doc["status"], doc["exit_code"], doc["file"]) == ("ok", 0, str(SMALL))
    listed = doc["artifacts"]
    assert listed, "plan rendered nothing"
    for item in listed:
        written = tmp_path / item["path"]
        assert written.is_file() and written.read_text().strip(), item["path"]


def test_plan_of_an_invalid_file_renders_nothing(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert main(["plan", str(BAD / "mig_does_not_pack.yml"), "--out", str(out)]) == exitcodes.INVALID_INPUT
    assert not out.exists()


def test_plan_diff_shows_exactly_the_artifacts_a_new_gpu_node_changes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One more GPU node: slurm.conf's node and partition lines, gres.conf's node list and one more node exporter
    and DCGM exporter target; every other artifact (the driver's, the toolkit's, prometheus.yml, the alert
    rules...) stays as it was."""
    sandbox = ROOT / "inventories" / "sandbox" / "cluster.yml"
    grown = tmp_path / "cluster.yml"
    grown.write_text(sandbox.read_text().replace("hosts: gpu[01-02]", "hosts: gpu[01-03]"))
    assert main(["plan", str(grown), "--diff", str(sandbox), "--json"]) == exitcodes.OK
    doc = json.loads(capsys.readouterr().out)
    assert (doc["status"], doc["old"]) == ("ok", str(sandbox))
    changes = {c["path"]: c for c in doc["changes"]}
    targets = "monitoring/prometheus/targets"
    wanted = {"slurm/slurm.conf", "slurm/gres.conf", f"{targets}/node.yml", f"{targets}/dcgm_exporter.yml"}
    assert set(changes) == wanted
    assert all(c["status"] == "changed" for c in changes.values())
    assert "+NodeName=gpu[01-03] " in changes["slurm/slurm.conf"]["diff"]
    assert '+- targets: ["gpu03:9100"]' in changes["monitoring/prometheus/targets/node.yml"]["diff"]
    assert main(["plan", str(sandbox), "--diff", str(sandbox)]) == exitcodes.OK
    assert "no artifact differs" in capsys.readouterr().out


def test_plan_diff_of_an_invalid_old_file_reports_it() -> None:
    assert main(["plan", str(SMALL), "--diff", str(BAD / "unknown_key.yml")]) == exitcodes.INVALID_INPUT


def test_version_prints_the_installed_version(capsys: pytest.CaptureFixture[str]) -> None:
    from importlib.metadata import version

    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.strip() == f"gpuinfra {version('gpuinfra')}"


# Every verb that reads a cluster file, with the arguments it needs besides the file.
CLUSTER_VERBS = [
    ["apply", "--yes"],
    ["upgrade", "--yes"],
    ["health"],
    ["report", "usage"],
    ["report", "idle"],
    ["plan"],
    ["inventory"],
]


@pytest.mark.parametrize("verb", CLUSTER_VERBS, ids=" ".join)
def test_every_verb_reports_an_invalid_file_in_one_envelope(
    verb: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    bad = str(BAD / "unknown_key.yml")
    assert main([*verb, bad, "--json"]) == exitcodes.INVALID_INPUT
    doc = json.loads(capsys.readouterr().out)
    assert (doc["status"], doc["valid"], doc["exit_code"], doc["file"]) == ("invalid", False, 3, bad)
    assert [d["path"] for d in doc["diagnostics"]] == ["node_groups[gpu].gpus", "conection"], doc
    assert main([*verb, bad]) == exitcodes.INVALID_INPUT
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.endswith(f"{bad}: 2 errors; nothing was run\n"), captured.err


@pytest.mark.parametrize("verb", [v for v in CLUSTER_VERBS if v[0] in ("upgrade", "health", "report")], ids=" ".join)
def test_bad_extra_vars_are_refused_in_the_same_envelope(verb: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*verb, str(SMALL), "-e", "novalue", "--json"]) == exitcodes.INVALID_INPUT
    captured = capsys.readouterr()
    doc = json.loads(captured.out)
    assert doc["status"] == "invalid" and doc["exit_code"] == 3 and "--extra-vars" in doc["errors"][0], doc
    assert f"gpuinfra {' '.join(v for v in verb if v != '--yes')}: --extra-vars:" in captured.err
