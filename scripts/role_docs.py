#!/usr/bin/env python3
"""Write every role's defaults/main.yml and the variables section of its README.md from its meta/argument_specs.yml.

Usage: .venv/bin/python scripts/role_docs.py [--check] [ROLE...]

A role's defaults are written once, as the `default:` of each option of its argument specs. defaults/main.yml is
generated from them and never edited: each option that is not required, the `main` entry point's first in spec order
and then those only other entry points declare, with its description as a comment. An option that two entry points
declare with different defaults stops the command. A role without options gets no defaults/main.yml.

The section of a README between the BEGIN and END markers is generated: each entry point's description and a table
of its options with their type, default and description. Anything outside the markers is kept as written, so a
README can carry prose and examples of its own. A README that does not exist yet is created with a title and the
section.

With --check nothing is written; the command lists the stale files and exits 1 if there are any
(tests/unit/test_role_docs.py runs the same check).
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import textwrap
from pathlib import Path
from typing import Any, cast

from ruamel.yaml import YAML
from ruamel.yaml.emitter import Emitter
from ruamel.yaml.nodes import ScalarNode
from ruamel.yaml.representer import RoundTripRepresenter
from ruamel.yaml.resolver import VersionedResolver
from ruamel.yaml.scalarstring import FoldedScalarString, LiteralScalarString

ROOT = Path(__file__).resolve().parents[1]
ROLES = ROOT / "roles"
COMMAND = ".venv/bin/python scripts/role_docs.py"
BEGIN_PREFIX = "<!-- BEGIN VARIABLES"  # how a README's section is found, whatever the rest of its marker says
BEGIN = f"{BEGIN_PREFIX}: generated from meta/argument_specs.yml by `{COMMAND}`; do not edit -->"
END = "<!-- END VARIABLES -->"
DEFAULTS_HEADER = f"# Generated from meta/argument_specs.yml by `{COMMAND}`; do not edit."
WIDTH = 120  # the longest line of a defaults file, as the rest of the repository writes them
INDENT = 2


def _load(path: Path) -> Any:
    return YAML(typ="safe").load(path.read_text()) if path.exists() else None


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _cell(text: str) -> str:
    """Text for a table cell: one line, with the column separator escaped."""
    return _one_line(text).replace("|", "\\|")


def _code(text: str) -> str:
    """Inline code that survives backticks in the text."""
    fence = "``" if "`" in text else "`"
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def _paragraphs(description: Any) -> list[str]:
    if description is None:
        return []
    items = description if isinstance(description, list) else [description]
    return [_one_line(str(item)) for item in items if str(item).strip()]


def default_text(spec: dict[str, Any]) -> str:
    """The default as the table shows it: templates and strings as written, other values as JSON (= YAML flow)."""
    if spec.get("required"):
        return "required"
    value = spec.get("default")
    if isinstance(value, str):
        return _code(_one_line(value)) if value else '`""`'
    return _code(json.dumps(value, sort_keys=False))


def type_text(spec: dict[str, Any]) -> str:
    kind = str(spec.get("type", "str"))
    if kind == "list" and spec.get("elements"):
        return f"list of {spec['elements']}"
    return kind


def _option_row(name: str, spec: dict[str, Any]) -> str:
    words = _paragraphs(spec.get("description"))
    if spec.get("choices"):
        words.append("One of: " + ", ".join(_code(str(choice)) for choice in spec["choices"]) + ".")
    if spec.get("no_log"):
        words.append("A secret: never logged.")
    return f"| {_code(name)} | {type_text(spec)} | {_cell(default_text(spec))} | {_cell(' '.join(words))} |"


def section(role_dir: Path) -> str:
    """The generated part of a role's README, markers included."""
    specs = (_load(role_dir / "meta" / "argument_specs.yml") or {}).get("argument_specs") or {}
    lines = [BEGIN, ""]
    several = len(specs) > 1
    for entry, spec in specs.items():
        if several:
            how = "the role" if entry == "main" else f"`tasks_from: {entry}.yml`"
            lines += [f"## Entry point `{entry}` ({how})", ""]
        if spec.get("short_description"):
            lines += [_one_line(spec["short_description"]), ""]
        paragraphs = _paragraphs(spec.get("description"))
        if paragraphs:
            lines += [f"- {paragraph}" for paragraph in paragraphs] if len(paragraphs) > 1 else paragraphs
            lines.append("")
        options = spec.get("options") or {}
        lines += ["### Variables" if several else "## Variables", ""]
        if options:
            lines += ["| variable | type | default | description |", "|---|---|---|---|"]
            lines += [_option_row(name, option) for name, option in options.items()]
        else:
            lines.append("None.")
        lines.append("")
    lines.append(END)
    return "\n".join(lines) + "\n"


def readme(role_dir: Path, current: str | None) -> str:
    """The README with its generated section brought up to date; the rest of `current` is kept as it is."""
    generated = section(role_dir)
    if current is None or BEGIN_PREFIX not in current:
        title = f"# gpuinfra.cluster.{role_dir.name}\n\n"
        meta = _load(role_dir / "meta" / "main.yml") or {}
        summary = (meta.get("galaxy_info") or {}).get("description")
        intro = f"{_one_line(summary)}\n\n" if summary else ""
        if current is None:
            return title + intro + generated
        return current.rstrip("\n") + "\n\n" + generated
    head, rest = current.split(BEGIN_PREFIX, 1)
    if END not in rest:
        raise SystemExit(f"{role_dir / 'README.md'}: {END!r} is missing after the BEGIN marker")
    tail = rest.split(END, 1)[1]
    return head + generated.rstrip("\n") + tail


def _default(option: dict[str, Any]) -> tuple[bool, Any]:
    return bool(option.get("required")), option.get("default")


def role_options(role_dir: Path) -> dict[str, dict[str, Any]]:
    """Every option of the role, once: the `main` entry point's in spec order, then those only other entry points
    declare. Stops when two entry points declare one option with different defaults."""
    specs = (_load(role_dir / "meta" / "argument_specs.yml") or {}).get("argument_specs") or {}
    entries = sorted(specs.items(), key=lambda item: item[0] != "main")
    options: dict[str, dict[str, Any]] = {}
    where: dict[str, str] = {}
    for entry, spec in entries:
        for name, option in (spec.get("options") or {}).items():
            if name not in options:
                options[name], where[name] = option, entry
                continue
            if _default(options[name]) != _default(option):
                raise SystemExit(
                    f"{role_dir / 'meta' / 'argument_specs.yml'}: {name} has one default in entry point"
                    f" {where[name]!r} and another in {entry!r}; give it one"
                )
    return options


_STR = "tag:yaml.org,2002:str"
_YAML_1_1 = VersionedResolver(version=(1, 1))


class _Resolver(VersionedResolver):
    """Reads a plain scalar as YAML 1.2 does and also as YAML 1.1 does (Ansible's PyYAML): a string that either would
    read as something else (off, yes, 0755, 12:30) is quoted."""

    def resolve(self, kind: Any, value: Any, implicit: Any) -> Any:
        tag = super().resolve(kind, value, implicit)
        if kind is ScalarNode and implicit[0] and str(tag) == _STR:
            old = _YAML_1_1.resolve(kind, value, implicit)
            if str(old) != _STR:
                return old
        return tag


class _Emitter(Emitter):
    """Quotes with double quotes, as the repository's YAML does, where that needs no escapes."""

    def choose_scalar_style(self) -> Any:
        style = super().choose_scalar_style()
        if style == "'" and not any(char in self.event.value for char in '"\\'):
            return '"'
        return style


def _represent_none(representer: RoundTripRepresenter, _: None) -> ScalarNode:
    return representer.represent_scalar("tag:yaml.org,2002:null", "null")


def _dumper() -> YAML:
    yaml = YAML(typ="rt")
    yaml.Resolver = _Resolver
    yaml.Emitter = _Emitter
    yaml.width = 4096  # lines are folded here, where they must be, never by the emitter
    yaml.indent(mapping=INDENT, sequence=2 * INDENT, offset=INDENT)
    yaml.representer.add_representer(type(None), _represent_none)
    return yaml


def _folded(text: str, width: int) -> FoldedScalarString:
    """One-line `text` as a folded block whose lines fit `width`: folded at single spaces between words."""
    folded = FoldedScalarString(text)  # the constructor is typed Any
    spaces = [i for i in range(1, len(text) - 1) if text[i] == " " and " " not in (text[i - 1], text[i + 1])]
    positions: list[int] = []
    start = 0
    for i, space in enumerate(spaces):
        following = spaces[i + 1] if i + 1 < len(spaces) else len(text)
        if following - start > width:
            positions.append(space)
            start = space + 1
    folded.fold_pos = positions
    return cast(FoldedScalarString, folded)


def _block_scalars(role_dir: Path) -> dict[str, str]:
    """Option -> its default as the spec writes it, where that is a block scalar (`>-` or `|-`): the defaults file
    breaks its lines where the spec does."""
    specs = YAML(typ="rt").load((role_dir / "meta" / "argument_specs.yml").read_text()) or {}
    found: dict[str, str] = {}
    for _, spec in sorted((specs.get("argument_specs") or {}).items(), key=lambda item: item[0] != "main"):
        for name, option in (spec.get("options") or {}).items():
            value = option.get("default")
            if isinstance(value, FoldedScalarString | LiteralScalarString):
                found.setdefault(name, value)
    return found


def _dump(name: str, value: Any) -> str:
    """`name: value` as YAML: collections in block style (empty ones `[]` and `{}`), strings quoted where YAML 1.1 or
    1.2 would read them as something else, a block scalar kept as one, another multi-line string as a literal block,
    and a line too long folded."""
    yaml = _dumper()
    if isinstance(value, str) and "\n" in value and not isinstance(value, FoldedScalarString | LiteralScalarString):
        value = LiteralScalarString(value)
    out = io.StringIO()
    yaml.dump({name: value}, out)
    text = out.getvalue()
    if isinstance(value, str) and "\n" not in value and max(map(len, text.splitlines())) > WIDTH:
        out = io.StringIO()
        yaml.dump({name: _folded(value, WIDTH - INDENT)}, out)
        text = out.getvalue()
    for version in ((1, 2), (1, 1)):  # as the specs are read here, and as Ansible reads the file
        reader = YAML(typ="safe")
        reader.version = version
        if reader.load(text) != {name: value}:
            raise SystemExit(f"{name}: its default {value!r} would not read back in YAML {version[0]}.{version[1]}")
    return text


def _comment(description: Any) -> list[str]:
    return [
        line
        for paragraph in _paragraphs(description)
        for line in textwrap.wrap(
            paragraph,
            WIDTH,
            initial_indent="# ",
            subsequent_indent="# ",
            break_long_words=False,
            break_on_hyphens=False,
        )
    ]


def defaults(role_dir: Path) -> str | None:
    """The role's defaults/main.yml: each option that is not required, with its description; None without one."""
    options = {name: spec for name, spec in role_options(role_dir).items() if not spec.get("required")}
    if not options:
        return None
    blocks = _block_scalars(role_dir)
    lines = ["---", DEFAULTS_HEADER]
    for name, spec in options.items():
        value = spec.get("default")
        if name in blocks and blocks[name] == value:
            value = blocks[name]
        lines += _comment(spec.get("description"))
        lines.append(_dump(name, value).rstrip("\n"))
    return "\n".join(lines) + "\n"


def roles(names: list[str]) -> list[Path]:
    found = sorted(p for p in ROLES.iterdir() if (p / "meta" / "argument_specs.yml").exists())
    if names:
        found = [p for p in found if p.name in names]
        missing = set(names) - {p.name for p in found}
        if missing:
            raise SystemExit(f"no role with meta/argument_specs.yml: {', '.join(sorted(missing))}")
    return found


def stale(role_dir: Path) -> tuple[Path, str] | None:
    """(README path, its up-to-date text) when the README differs from what it should be, else None."""
    path = role_dir / "README.md"
    current = path.read_text() if path.exists() else None
    wanted = readme(role_dir, current)
    return None if wanted == current else (path, wanted)


def stale_defaults(role_dir: Path) -> tuple[Path, str | None] | None:
    """(defaults/main.yml path, its up-to-date text, None where the role has no defaults file) when the file differs
    from what it should be, else None."""
    path = role_dir / "defaults" / "main.yml"
    current = path.read_text() if path.exists() else None
    wanted = defaults(role_dir)
    return None if wanted == current else (path, wanted)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 when a file is stale")
    parser.add_argument("roles", nargs="*", metavar="ROLE", help="only these roles (default: all)")
    args = parser.parse_args(argv)
    outdated = [
        found for role_dir in roles(args.roles) for found in (stale_defaults(role_dir), stale(role_dir)) if found
    ]
    for path, text in outdated:
        relative = path.relative_to(ROOT)
        if args.check:
            print(f"{relative} is stale; regenerate it with `{COMMAND}`")
        elif text is None:
            path.unlink()
            print(f"removed {relative}")
        else:
            path.parent.mkdir(exist_ok=True)
            path.write_text(text)
            print(f"wrote {relative}")
    return 1 if args.check and outdated else 0


if __name__ == "__main__":
    sys.exit(main())
