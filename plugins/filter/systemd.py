# Copyright: gpuinfra maintainers
# Apache License 2.0 (see LICENSE)
"""Filters that put values into systemd unit lines and into the ARGS of /etc/default files safely.

- `systemd_quote`: one word of an `ExecStart=` line (or, with `command=false`, one `Environment=` assignment),
  double-quoted with systemd's C-style escapes, so that a space, a quote or a newline in the value stays inside
  that one word and on that one line; `%` (specifiers) and, on command lines, `$` (variable expansion) are
  doubled.
- `systemd_args_word`: one word of an `ARGS="..."` line that a Debian unit expands as `$ARGS`. systemd splits
  such a value at whitespace and takes quotes in it literally, so no escaping can keep a space inside a word:
  a value with whitespace, a quote, a backslash, `$` or a control character is refused with an error that names it.
"""

from __future__ import annotations

from typing import Any

from ansible.errors import AnsibleFilterError

# Escapes systemd's unquoting understands (systemd.syntax(7), "Quoting").
_ESCAPES = {
    "\\": "\\\\",
    '"': '\\"',
    "\n": "\\n",
    "\t": "\\t",
    "\r": "\\r",
    "\a": "\\a",
    "\b": "\\b",
    "\f": "\\f",
    "\v": "\\v",
}
_ARGS_FORBIDDEN = set(" \"'\\$`")


def systemd_quote(value: Any, command: bool = True) -> str:
    """`value` as one double-quoted word of a unit file line."""
    text = str(value)
    out = []
    for char in text:
        if char in _ESCAPES:
            out.append(_ESCAPES[char])
        elif ord(char) < 0x20 or ord(char) == 0x7F:
            out.append(f"\\x{ord(char):02x}")
        elif char == "%":
            out.append("%%")
        elif char == "$" and command:
            out.append("$$")
        else:
            out.append(char)
    return '"' + "".join(out) + '"'


def systemd_args_word(value: Any, name: str = "value") -> str:
    """`value` unchanged when it is safe as one word of a `$ARGS` expansion; an error naming it otherwise."""
    text = str(value)
    bad = sorted({c for c in text if c in _ARGS_FORBIDDEN or c.isspace() or ord(c) < 0x20 or ord(c) == 0x7F})
    if not text or bad:
        shown = ", ".join(repr(c) for c in bad) if bad else "it is empty"
        raise AnsibleFilterError(
            f"{name} {text!r} cannot be one word of the service's ARGS ({shown}): systemd splits $ARGS at "
            "whitespace and takes quotes literally; use a value without whitespace, quotes, backslashes or '$'"
        )
    return text


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"systemd_quote": systemd_quote, "systemd_args_word": systemd_args_word}
