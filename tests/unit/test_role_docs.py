"""Every role's defaults/main.yml and the variables section of its README.md are generated from its
meta/argument_specs.yml, the one place a default is written.

scripts/role_docs.py writes both; the defaults file entirely, the README between its markers (the rest of a README is
written by hand and kept as it is).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from file_module import load
from ruamel.yaml import YAML

ROOT = Path(__file__).resolve().parents[2]


role_docs = load("scripts/role_docs.py", "role_docs")
ROLES = [p.name for p in role_docs.roles([])]


def test_every_role_is_documented() -> None:
    assert sorted(p.name for p in (ROOT / "roles").iterdir() if p.is_dir()) == ROLES


@pytest.mark.parametrize("role", ROLES)
def test_readme_is_up_to_date(role: str) -> None:
    found = role_docs.stale(ROOT / "roles" / role)
    assert found is None, f"roles/{role}/README.md is stale; regenerate it with `{role_docs.COMMAND}`"


@pytest.mark.parametrize("role", ROLES)
def test_defaults_are_up_to_date(role: str) -> None:
    found = role_docs.stale_defaults(ROOT / "roles" / role)
    assert found is None, f"roles/{role}/defaults/main.yml is stale; regenerate it with `{role_docs.COMMAND}`"


@pytest.mark.parametrize("role", ROLES)
def test_ansible_reads_the_spec_defaults(role: str) -> None:
    """Read as Ansible reads YAML (PyYAML, YAML 1.1), defaults/main.yml holds each optional argument's `default:`,
    in every entry point that declares it, and nothing else."""
    specs = yaml.safe_load((ROOT / "roles" / role / "meta" / "argument_specs.yml").read_text())["argument_specs"]
    defaults = yaml.safe_load((ROOT / "roles" / role / "defaults" / "main.yml").read_text())
    wanted: dict[str, Any] = {}
    for entry, spec in specs.items():
        for name, option in (spec.get("options") or {}).items():
            if not option.get("required"):
                assert defaults.get(name) == option.get("default"), f"{entry}.{name}"
                wanted[name] = option.get("default")
    assert defaults == wanted


@pytest.mark.parametrize("role", ROLES)
def test_readme_lists_every_option_with_its_default(role: str) -> None:
    text = (ROOT / "roles" / role / "README.md").read_text()
    specs = role_docs._load(ROOT / "roles" / role / "meta" / "argument_specs.yml")["argument_specs"]
    for entry in specs.values():
        for name, option in (entry.get("options") or {}).items():
            assert f"| `{name}` | {role_docs.type_text(option)} | " in text, name


def test_prose_outside_the_markers_is_kept(tmp_path: Path) -> None:
    role = ROOT / "roles" / "munge"
    generated = role_docs.section(role)
    written = f"# munge\n\nHand-written intro.\n\n{role_docs.BEGIN}\nold table\n{role_docs.END}\n\n## Example\n\ntext\n"
    assert role_docs.readme(role, written) == f"# munge\n\nHand-written intro.\n\n{generated}\n## Example\n\ntext\n"
    # A README without markers gets the section appended; a missing one is created with a title.
    assert role_docs.readme(role, "# munge\n\nProse.\n") == f"# munge\n\nProse.\n\n{generated}"
    assert role_docs.readme(role, None).startswith("# gpuinfra.cluster.munge\n")


def test_check_mode_names_the_stale_readme_and_the_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    role = tmp_path / "roles" / "demo"
    (role / "meta").mkdir(parents=True)
    spec = "argument_specs:\n  main:\n    options:\n      demo_port: {type: int, default: 1, description: Port.}\n"
    (role / "meta" / "argument_specs.yml").write_text(spec)
    monkeypatch.setattr(role_docs, "ROOT", tmp_path)
    monkeypatch.setattr(role_docs, "ROLES", tmp_path / "roles")
    assert role_docs.main([]) == 0
    assert "| `demo_port` | int | `1` | Port. |" in (role / "README.md").read_text()
    assert (role / "defaults" / "main.yml").read_text() == f"---\n{role_docs.DEFAULTS_HEADER}\n# Port.\ndemo_port: 1\n"
    assert role_docs.main(["--check"]) == 0
    (role / "meta" / "argument_specs.yml").write_text(spec.replace("default: 1", "default: 2"))
    capsys.readouterr()
    assert role_docs.main(["--check"]) == 1
    assert capsys.readouterr().out == "".join(
        f"roles/demo/{path} is stale; regenerate it with `{role_docs.COMMAND}`\n"
        for path in ("defaults/main.yml", "README.md")
    )
    # A hand edit of the generated file is stale too.
    role_docs.main([])
    with (role / "defaults" / "main.yml").open("a") as file:
        file.write("demo_extra: 1\n")
    assert role_docs.main(["--check"]) == 1


def _demo_role(tmp_path: Path, specs: dict[str, Any]) -> Path:
    role = tmp_path / "demo"
    (role / "meta").mkdir(parents=True)
    with (role / "meta" / "argument_specs.yml").open("w") as file:
        YAML().dump({"argument_specs": specs}, file)
    return role


TRICKY = {
    "off": "off",
    "yes": "yes",
    "octal": "0755",
    "slurm_time": "7-0",
    "sexagesimal": "12:30",
    "float": "1e3",
    "null_word": "~",
    "date": "2024-01-01",
    "colon": "gpuinfra: maintenance",
    "quotes": 'it\'s "quoted"',
    "backslash": "\\d+",
    "template": "{{ groups['all'] | default([]) }}",
    "multi_line": "{{ a\n   ~ b }}",
    "long": "{{ " + " | ".join(f"filter_{i}" for i in range(30)) + " }}",
    "empty": "",
    "true": True,
    "int": 7,
    "none": None,
    "empty_list": [],
    "empty_dict": {},
    "nested": {"weights": {"a": 1, "b": "off"}, "list": [{"key": "x", "values": ["0755", "yes"]}]},
}


def test_defaults_keep_every_value(tmp_path: Path) -> None:
    """Each value reads back as the spec's, both as YAML 1.2 and as YAML 1.1 (Ansible): strings that either would
    read as something else are quoted, collections are block style, and no line passes the width."""
    options = {f"demo_{name}": {"default": value, "description": f"The {name}."} for name, value in TRICKY.items()}
    options["demo_needed"] = {"required": True, "description": "Has no default."}
    role = _demo_role(tmp_path, {"main": {"options": options}})
    text = role_docs.defaults(role)
    assert text is not None
    wanted = {f"demo_{name}": value for name, value in TRICKY.items()}
    assert list(YAML(typ="safe").load(text).items()) == list(wanted.items())
    assert yaml.safe_load(text) == wanted
    assert max(len(line) for line in text.splitlines()) <= role_docs.WIDTH
    assert '\ndemo_off: "off"\n' in text
    assert "\ndemo_empty_list: []\n" in text
    assert "\ndemo_nested:\n  weights:\n    a: 1\n" in text
    assert "\ndemo_long: >-\n" in text
    assert "demo_needed" not in text


def test_defaults_take_each_entry_points_options_once(tmp_path: Path) -> None:
    role = _demo_role(
        tmp_path,
        {
            "extra": {"options": {"demo_b": {"default": 2}, "demo_a": {"default": 1}}},
            "main": {"options": {"demo_a": {"default": 1, "description": ["First.", "Second."]}}},
        },
    )
    assert role_docs.defaults(role) == f"---\n{role_docs.DEFAULTS_HEADER}\n# First.\n# Second.\ndemo_a: 1\ndemo_b: 2\n"


def test_defaults_refuse_an_option_with_two_defaults(tmp_path: Path) -> None:
    role = _demo_role(
        tmp_path, {"main": {"options": {"demo_a": {"default": 1}}}, "other": {"options": {"demo_a": {"default": 2}}}}
    )
    with pytest.raises(SystemExit, match="demo_a has one default in entry point 'main' and another in 'other'"):
        role_docs.defaults(role)


def test_a_role_without_options_has_no_defaults_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    role = _demo_role(tmp_path / "roles", {"main": {"short_description": "Nothing to set."}})
    (role / "defaults").mkdir()
    (role / "defaults" / "main.yml").write_text("---\n")
    monkeypatch.setattr(role_docs, "ROOT", tmp_path)
    monkeypatch.setattr(role_docs, "ROLES", tmp_path / "roles")
    assert role_docs.defaults(role) is None
    assert role_docs.main(["--check"]) == 1
    assert role_docs.main([]) == 0
    assert not (role / "defaults" / "main.yml").exists()
