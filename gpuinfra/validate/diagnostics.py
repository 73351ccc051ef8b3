"""Where rules report: each finding positioned in the file, with a readable path, all of them at once."""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field

from ..errors import Diagnostic
from .source import Loc, YamlSource

# Keys whose children are named items, shown as name[key] rather than name.key.
_COLLECTIONS = {
    "node_groups",
    "partitions",
    "qos",
    "accounts",
    "tenants",
    "layouts",
    "receivers",
    "addresses",
    "gpus",
    "priorities",
}


@dataclass
class Diagnostics:
    source: YamlSource
    found: list[Diagnostic] = field(default_factory=list)

    def error(self, loc: Loc, message: str) -> None:
        self.found.append(self.source.diagnostic(loc, display(loc), message))

    def warning(self, loc: Loc, message: str) -> None:
        self.found.append(self.source.diagnostic(loc, display(loc), message, "warning"))

    @property
    def has_errors(self) -> bool:
        return any(d.severity == "error" for d in self.found)


def key_text(key: str | int) -> str:
    """A key as a path shows it: as written, or quoted when it holds what would break the one-line message."""
    text = str(key)
    return text if text.isprintable() else repr(text)


def display(loc: Loc) -> str:
    out = ""
    previous: str | int | None = None
    for part in loc:
        if isinstance(part, int) or previous in _COLLECTIONS:
            out += f"[{key_text(part)}]"
        else:
            out += f".{key_text(part)}" if out else key_text(part)
        previous = part
    return out


def suggest(name: str, choices: list[str]) -> str:
    close = difflib.get_close_matches(name, choices, n=1, cutoff=0.6)
    if close:
        return f"did you mean {close[0]!r}?"
    return f"known: {', '.join(choices)}" if choices else "none are defined"
