#!/usr/bin/env python3
"""Write the variables section of every role's README.md from the role's meta/argument_specs.yml.

Usage: .venv/bin/python scripts/role_docs.py [--check] [ROLE...]

The section between the BEGIN and END markers is generated: each entry point's description and a table of its
options with their type, default and description. Anything outside the markers is kept as written, so a README
can carry prose and examples of its own. A README that does not exist yet is created with a title and the section.
With --check nothing is written; the command lists the stale READMEs and exits 1 if there are any
(tests/unit/test_role_docs.py runs the same check).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML

ROOT = Path(__file__).resolve().parents[1]
ROLES = ROOT / "roles"
COMMAND = ".venv/bin/python scripts/role_docs.py"
BEGIN_PREFIX = "<!-- BEGIN VARIABLES"  # how a README's section is found, whatever the rest of its marker says
BEGIN = f"{BEGIN_PREFIX}: generated from meta/argument_specs.yml by `{COMMAND}`; do not edit -->"
END = "<!-- END VARIABLES -->"


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 when a README is stale")
    parser.add_argument("roles", nargs="*", metavar="ROLE", help="only these roles (default: all)")
    args = parser.parse_args(argv)
    outdated = [found for role_dir in roles(args.roles) if (found := stale(role_dir))]
    for path, text in outdated:
        relative = path.relative_to(ROOT)
        if args.check:
            print(f"{relative} is stale; regenerate it with `{COMMAND}`")
        else:
            path.write_text(text)
            print(f"wrote {relative}")
    return 1 if args.check and outdated else 0


if __name__ == "__main__":
    sys.exit(main())
