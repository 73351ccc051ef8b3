# Copyright: gpuinfra maintainers
# Apache License 2.0 (see LICENSE)
"""Filters that put values into the SQL a role feeds to the mariadb client, quoted, so that no value is ever read as
SQL.

- `mariadb_string`: a string literal, `'...'`: `'` doubled, `\\` doubled, and a line feed, a carriage return and
  ctrl-Z written as `\\n`, `\\r` and `\\Z` (the mariadb client reads its input as lines, and drops a carriage return
  at a line's end). A value can then hold any character but NUL and stays one literal: in MariaDB's default SQL
  mode, and with NO_BACKSLASH_ESCAPES as well (a doubled quote never ends the literal; only the backslash
  sequences would then be read as written). SQL that uses it sets the session's sql_mode first, as the slurm_dbd
  role does, so that the literal is exactly the value. Account names (`'user'@'host'`) and passwords are string
  literals.
- `mariadb_identifier`: a quoted identifier, `` `...` ``, with `` ` `` doubled. With `pattern=true` it is the
  database of a `GRANT ... ON db.*`, where `_` and `%` are wildcards: they, and `\\`, are escaped with `\\`, so that
  the grant covers that one database and not every name the pattern matches (`slurm_acct_db` would match
  `slurmXacct_db`).

Both refuse a value with a NUL character, which neither can hold; an identifier also refuses other control
characters, which it cannot escape (and the client would drop a carriage return).

- `mariadb_grants`: the lines of `SHOW GRANTS` (read with `--batch --raw`), as data to compare with the grants a
  role wants, written with the two filters above as MariaDB writes them. The password's clause at the end of the
  account's line (`IDENTIFIED BY PASSWORD '<hash>'`) is left out: a login shows whether the password is right, and
  the hash is no grant. Any other clause (another authentication plugin, `REQUIRE SSL`, `WITH MAX_...`) stays, so
  it differs.
"""

from __future__ import annotations

import re
from typing import Any

from ansible.errors import AnsibleFilterError

# MariaDB's own escapes for a string literal (with backslash escapes on), but a quote is doubled: that ends no
# literal in any SQL mode.
_STRING_ESCAPES = {"\\": "\\\\", "'": "''", "\n": "\\n", "\r": "\\r", "\x1a": "\\Z"}


def _text(value: Any, what: str) -> str:
    text = str(value)
    if "\0" in text:
        raise AnsibleFilterError(f"a MariaDB {what} cannot hold a NUL character: {text!r}")
    return text


def mariadb_string(value: Any) -> str:
    """`value` as one MariaDB string literal."""
    text = _text(value, "string")
    return "'" + "".join(_STRING_ESCAPES.get(char, char) for char in text) + "'"


def mariadb_identifier(value: Any, pattern: bool = False) -> str:
    """`value` as one quoted MariaDB identifier; `pattern=true`: the database of a GRANT, without wildcards."""
    text = _text(value, "identifier")
    if not text:
        raise AnsibleFilterError("a MariaDB identifier cannot be empty")
    if any(ord(char) < 0x20 or ord(char) == 0x7F for char in text):
        raise AnsibleFilterError(f"a MariaDB identifier cannot hold a control character here: {text!r}")
    if pattern:
        text = text.replace("\\", "\\\\").replace("_", "\\_").replace("%", "\\%")
    return "`" + text.replace("`", "``") + "`"


# The clause SHOW GRANTS ends the account's USAGE line with when it has a password (mysql_native_password's hash).
_PASSWORD_CLAUSE = re.compile(r" IDENTIFIED BY PASSWORD '[^']*'$")


def mariadb_grants(lines: Any) -> list[str]:
    """The grants `SHOW GRANTS` listed, one per line, without the password's clause."""
    if isinstance(lines, str) or not isinstance(lines, list):
        raise AnsibleFilterError(f"mariadb_grants takes the lines of SHOW GRANTS (stdout_lines), not {lines!r}")
    return [_PASSWORD_CLAUSE.sub("", str(line), count=1) for line in lines]


class FilterModule:
    """MariaDB quoting, and reading SHOW GRANTS."""

    def filters(self) -> dict[str, Any]:
        return {
            "mariadb_string": mariadb_string,
            "mariadb_identifier": mariadb_identifier,
            "mariadb_grants": mariadb_grants,
        }
