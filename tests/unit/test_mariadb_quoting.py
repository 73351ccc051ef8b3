"""The collection's MariaDB quoting filters, and the SQL the slurm_dbd role sends, read by a real MariaDB server.

A private mariadbd (its own data folder and socket, no network) starts once for the module where MariaDB is
installed (`apt-get install mariadb-server`); those tests are skipped, saying so, where it is not.
"""

from __future__ import annotations

import getpass
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jinja2
import pytest
from ansible.errors import AnsibleFilterError
from file_module import load
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ruamel.yaml import YAML

pytestmark = pytest.mark.tools  # runs Ansible or a system tool (tests/unit/tool_guard.py)

ROOT = Path(__file__).resolve().parents[2]
ROLE = ROOT / "roles" / "slurm_dbd"


FILTERS = load("plugins/filter/mariadb.py", "gpuinfra_mariadb_filters")
string = FILTERS.mariadb_string
identifier = FILTERS.mariadb_identifier
grants = FILTERS.mariadb_grants
RECEIPT = load("plugins/modules/receipt.py")


# --- the quoting itself ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "quoted"),
    [
        ("slurm", "'slurm'"),
        ("it's", "'it''s'"),
        ("a\\", "'a\\\\'"),
        ("\\'", "'\\\\'''"),
        ("x'; DROP DATABASE mysql; --", "'x''; DROP DATABASE mysql; --'"),
        ("", "''"),
        ("line\r\nnext", "'line\\r\\nnext'"),
    ],
)
def test_string_literals(value: str, quoted: str) -> None:
    assert string(value) == quoted


@pytest.mark.parametrize(
    ("value", "pattern", "quoted"),
    [
        ("slurm_acct_db", False, "`slurm_acct_db`"),
        ("slurm_acct_db", True, "`slurm\\_acct\\_db`"),
        ("a`b", False, "`a``b`"),
        ("100%", True, "`100\\%`"),
        ("a\\b", True, "`a\\\\b`"),
    ],
)
def test_identifiers(value: str, pattern: bool, quoted: str) -> None:
    assert identifier(value, pattern=pattern) == quoted


def test_nul_and_empty_names_are_refused() -> None:
    with pytest.raises(AnsibleFilterError, match="NUL"):
        string("a\0b")
    with pytest.raises(AnsibleFilterError, match="NUL"):
        identifier("a\0b")
    with pytest.raises(AnsibleFilterError, match="empty"):
        identifier("")
    with pytest.raises(AnsibleFilterError, match="control character"):
        identifier("a\rb")


def test_the_collection_offers_its_filters() -> None:
    assert set(FILTERS.FilterModule().filters()) == {"mariadb_string", "mariadb_identifier", "mariadb_grants"}


def test_the_grants_leave_out_the_password_clause_only() -> None:
    usage = "GRANT USAGE ON *.* TO `slurm`@`localhost`"
    hashed = f"{usage} IDENTIFIED BY PASSWORD '*D821809F681A40A6E379B50D0463EFAE20BDD122'"
    assert grants([hashed, "GRANT ALL PRIVILEGES ON `a\\_b`.* TO `slurm`@`localhost`"]) == [
        usage, "GRANT ALL PRIVILEGES ON `a\\_b`.* TO `slurm`@`localhost`"
    ]  # fmt: skip
    # Anything else on the account's line is not a password, and so stays to differ.
    for other in (f"{hashed} REQUIRE SSL", f"{usage} IDENTIFIED VIA ed25519 USING 'x'", f"{hashed} WITH GRANT OPTION"):
        assert grants([other]) == [other]
    with pytest.raises(AnsibleFilterError, match="stdout_lines"):
        grants(hashed)


# --- a real server ------------------------------------------------------------------------------------------------


class Sql:
    """The real mariadb client, as root over the socket of a private mariadbd, or as another login."""

    OPTIONS = ("--batch", "--raw", "--skip-column-names", "--default-character-set=utf8mb4")

    def __init__(self, client: str, socket: Path) -> None:
        self.client, self.socket = client, socket

    def argv(self, options: list[str] | tuple[str, ...] = OPTIONS, login: str = "root") -> list[str]:
        """The client's command line: `options` (a role's argv, but its program) after the connection's."""
        return [self.client, "--no-defaults", f"--socket={self.socket}", f"--user={login}", *options]

    def __call__(
        self, text: str, login: str = "root", password: str | None = None, options: list[str] | None = None
    ) -> subprocess.CompletedProcess[bytes]:
        """`text` on stdin; the password, where given, in the environment."""
        argv = self.argv(options or self.OPTIONS, login)
        env = {**os.environ, "MYSQL_PWD": password} if password is not None else dict(os.environ)
        return subprocess.run(argv, input=text.encode(), capture_output=True, env=env, timeout=60, check=False)


@pytest.fixture(scope="module")
def sql() -> Iterator[Sql]:
    """Run SQL through the real mariadb client against a private, throwaway mariadbd."""
    tools = {name: shutil.which(name) for name in ("mariadbd", "mariadb-install-db", "mariadb")}
    if not all(tools.values()):
        pytest.skip("MariaDB is not installed (apt-get install mariadb-server): the real server reads the quoting")
    if shutil.which("mariadbd") is None:
        pytest.skip("mariadbd is not on PATH")
    user = getpass.getuser()
    folder = Path(tempfile.mkdtemp(prefix="gpuinfra-mariadb-"))
    socket = folder / "mariadb.sock"
    base = ["--no-defaults", f"--datadir={folder / 'data'}", f"--user={user}"]
    subprocess.run(
        [str(tools["mariadb-install-db"]), *base, "--auth-root-authentication-method=socket",
         f"--auth-root-socket-user={user}", "--skip-test-db"],
        capture_output=True, check=True,
    )  # fmt: skip
    server = subprocess.Popen(
        [str(tools["mariadbd"]), *base, f"--socket={socket}", "--skip-networking", f"--pid-file={folder / 'pid'}",
         f"--log-error={folder / 'error.log'}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    run = Sql(str(tools["mariadb"]), socket)

    try:
        for _ in range(300):
            if run("SELECT 1").returncode == 0:
                break
            if server.poll() is not None:
                pytest.fail("mariadbd stopped: " + (folder / "error.log").read_text(errors="replace")[-2000:])
            time.sleep(0.1)
        else:
            pytest.fail("mariadbd did not answer within 30 s")
        yield run
    finally:
        server.terminate()
        server.wait(timeout=60)
        shutil.rmtree(folder, ignore_errors=True)


def _ok(result: subprocess.CompletedProcess[bytes]) -> str:
    assert result.returncode == 0, result.stderr.decode(errors="replace")
    return result.stdout.decode()


# Any text MariaDB can hold (utf8mb4, no NUL): quotes, backslashes, semicolons, newlines, comment starts, emoji.
TEXT = st.text(st.characters(blacklist_categories=["Cs"], blacklist_characters="\0"), max_size=40)
TRICKY = st.sampled_from(["'", "\\", '"', "`", ";", "--", "#", "/*", "\n", "\r", "\x1a", "%", "_", "é", "🙂"])
VALUES = st.lists(st.one_of(TEXT, st.lists(TRICKY, max_size=8).map("".join)), min_size=1, max_size=20)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(values=VALUES)
def test_a_string_literal_is_the_value(sql: Sql, values: list[str]) -> None:
    """Each literal reads back as exactly its value, and stays one literal even in NO_BACKSLASH_ESCAPES mode."""
    script = "SET SESSION sql_mode = 'STRICT_ALL_TABLES';\n" + "".join(
        f"SELECT HEX({string(v)}), 'end';\n" for v in values
    )
    rows = _ok(sql(script)).splitlines()
    assert rows == [f"{v.encode().hex().upper()}\tend" for v in values]
    loose = "SET SESSION sql_mode = 'NO_BACKSLASH_ESCAPES';\n" + "".join(
        f"SELECT {string(v)} = 1, 'end';\n" for v in values
    )
    assert [row.split("\t")[-1] for row in _ok(sql(loose)).splitlines()] == ["end"] * len(values)


NAME_CHARS = st.sampled_from(list("abcXYZ019_%-. ;'\"`\\é€"))
NAMES = st.lists(NAME_CHARS, min_size=1, max_size=24).map("".join).filter(lambda n: not n.endswith(" "))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=NAMES)
def test_a_quoted_identifier_names_exactly_that_database(sql: Sql, name: str) -> None:
    script = (
        f"CREATE DATABASE {identifier(name)};\n"
        f"SELECT HEX(SCHEMA_NAME) FROM information_schema.SCHEMATA WHERE SCHEMA_NAME = {string(name)};\n"
        f"DROP DATABASE {identifier(name)};\n"
    )
    assert _ok(sql(script)).split() == [name.encode().hex().upper()]


def test_a_grant_covers_its_database_and_no_other_the_name_matches(sql: Sql) -> None:
    """`_` is a wildcard in GRANT ... ON db.*: unescaped, a grant on a_b also covers aXb."""
    _ok(sql("CREATE DATABASE `gq_a_b`; CREATE DATABASE `gq_aXb`; CREATE DATABASE `gw_a_b`; CREATE DATABASE `gw_aXb`;"))
    for prefix, pattern in (("gq", True), ("gw", False)):
        account = f"{string(prefix + 'user')}@'localhost'"
        _ok(sql(
            f"CREATE USER {account} IDENTIFIED BY 'pw';\n"
            f"GRANT ALL PRIVILEGES ON {identifier(prefix + '_a_b', pattern=pattern)}.* TO {account};"
        ))  # fmt: skip
        own = sql(f"CREATE TABLE `{prefix}_a_b`.t (i INT);", login=prefix + "user", password="pw")
        other = sql(f"CREATE TABLE `{prefix}_aXb`.t (i INT);", login=prefix + "user", password="pw")
        assert own.returncode == 0, own.stderr
        assert (other.returncode == 0) is (not pattern), other.stderr
        if pattern:
            assert b"denied" in other.stderr


# --- the SQL of the slurm_dbd role --------------------------------------------------------------------------------


def _env() -> jinja2.Environment:
    """Jinja with the collection's filters under their full names, as Ansible renders the role."""
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    env.filters["gpuinfra.cluster.mariadb_string"] = string
    env.filters["gpuinfra.cluster.mariadb_identifier"] = identifier
    env.filters["gpuinfra.cluster.mariadb_grants"] = grants
    return env


def _role_task(name: str) -> dict[str, Any]:
    tasks: list[dict[str, Any]] = YAML(typ="safe").load((ROLE / "tasks" / "main.yml").read_text())
    return next(t for t in tasks if t.get("name") == name)


def _role_vars(**values: str) -> dict[str, Any]:
    """The role's variables that name the database account, its grants and the command reading them, rendered in
    the order vars/main.yml defines them."""
    env, defined = _env(), YAML(typ="safe").load((ROLE / "vars" / "main.yml").read_text())
    context: dict[str, Any] = {
        "slurm_dbd_db_name": values["db"],
        "slurm_dbd_db_user": values["user"],
        "__slurm_dbd_password": values["password"],
        "__slurm_dbd_mysql": "mariadb",
    }
    for name in ("__slurm_dbd_account", "__slurm_dbd_grantee", "__slurm_dbd_grants", "__slurm_dbd_show_grants"):
        value = defined[name]
        render = env.from_string
        context[name] = (
            [render(v).render(context) for v in value] if isinstance(value, list) else render(value).render(context)
        )
    return context


def _role_sql(**values: str) -> str:
    """The stdin of the role's task that creates the database and its user, rendered as Ansible renders it."""
    task = _role_task("Create the accounting database and its user")
    context = _role_vars(**values)
    assert task["no_log"] is True, "the task carries the password"
    assert all(values["password"] not in str(arg) for arg in task["ansible.builtin.command"]["argv"])
    return _env().from_string(task["ansible.builtin.command"]["stdin"]).render(context)


@pytest.mark.parametrize(
    "values",
    [
        {"db": "slurm_acct_db", "user": "slurm", "password": "Zq8xF2mN4pL7vR1sT6uW9yB3cD5eG0hJ"},
        {"db": "acct`db'; --", "user": "sl'urm\\", "password": "p'w\\\";DROP DATABASE mysql;-- `x` é"},
    ],
    ids=["defaults", "hostile"],
)
def test_the_roles_sql_creates_exactly_the_account_it_names(sql: Sql, values: dict[str, str]) -> None:
    databases = set(_ok(sql("SHOW DATABASES;")).splitlines())
    _ok(sql(_role_sql(**values)))
    _ok(sql(_role_sql(**values)))  # a second run (the login check failed again) changes nothing and fails nothing
    assert set(_ok(sql("SHOW DATABASES;")).splitlines()) == databases | {values["db"]}
    # slurmdbd's login: its password works, and it may create tables in its database.
    login = sql(
        f"CREATE TABLE {identifier(values['db'])}.probe (i INT); SELECT CURRENT_USER();",
        login=values["user"],
        password=values["password"],
    )
    assert _ok(login).strip() == f"{values['user']}@localhost"
    assert sql("SELECT 1;", login=values["user"], password=values["password"] + "x").returncode != 0
    _ok(sql(f"DROP DATABASE {identifier(values['db'])}; DROP USER {string(values['user'])}@'localhost';"))


# --- the account's exact grants -------------------------------------------------------------------------------------

ACCOUNTS = {
    "defaults": {"db": "slurm_acct_db", "user": "slurm", "password": "Zq8xF2mN4pL7vR1sT6uW9yB3cD5eG0hJ"},
    "hostile": {"db": "acct`db'; --", "user": "sl'urm\\", "password": "p'w\\\";DROP DATABASE mysql;-- `x` é"},
}

# What an admin may do to the account by hand (the account written as `{account}`, its database as `{db}`): each
# leaves it with grants other than its own, which the role must see and take back, not only put back what is missing.
BY_HAND = {
    "all on every database with grant option": "GRANT ALL PRIVILEGES ON *.* TO {account} WITH GRANT OPTION;",
    "grant option on its database": "GRANT GRANT OPTION ON {db}.* TO {account};",
    "a table of another database": "GRANT SELECT ON mysql.global_priv TO {account};",
    "a role": "CREATE ROLE IF NOT EXISTS gq_admin; GRANT gq_admin TO {account};",
    "one privilege revoked": "REVOKE DELETE ON {db}.* FROM {account};",
    "every privilege revoked": "REVOKE ALL PRIVILEGES, GRANT OPTION FROM {account};",
    "a resource limit": "ALTER USER {account} WITH MAX_QUERIES_PER_HOUR 10;",
    "the account dropped": "DROP USER {account};",
}


def _shown_grants(sql: Sql, context: dict[str, Any]) -> dict[str, Any]:
    """What the role's read of the grants registers: the command of vars/main.yml, run with its own options."""
    argv = context["__slurm_dbd_show_grants"]
    assert argv[0] == "mariadb" and context["__slurm_dbd_password"] not in " ".join(argv)
    done = sql("", options=argv[1:])
    return {"rc": done.returncode, "stdout_lines": done.stdout.decode().splitlines()}


def _makes_account_anew(context: dict[str, Any], shown: dict[str, Any]) -> bool:
    """The `when` of the role's task that makes the account, with the login working and these grants read."""
    when = _role_task("Create the accounting database and its user")["when"]
    state = {
        **context,
        "slurm_dbd_service_manage": True,
        "__slurm_dbd_login": {"rc": 0},
        "__slurm_dbd_shown_grants": shown,
    }
    return bool(_env().compile_expression(when)(**state))


def _receipt_command(context: dict[str, Any]) -> list[str]:
    """The one command the role's receipt watches, rendered."""
    receipt = _role_task("Record what this role converged, for the next apply to compare with")
    expression = receipt["gpuinfra.cluster.receipt"]["commands"].strip().removeprefix("{{").removesuffix("}}")
    commands = _env().compile_expression(expression)(**context, slurm_dbd_service_manage=True)
    assert isinstance(commands, list) and len(commands) == 1, commands
    return [str(arg) for arg in commands[0]]


@pytest.mark.parametrize("change", BY_HAND)
@pytest.mark.parametrize("values", ACCOUNTS.values(), ids=ACCOUNTS.keys())
def test_grants_changed_by_hand_make_the_role_and_its_receipt_make_them_exact_again(
    sql: Sql, values: dict[str, str], change: str
) -> None:
    """After the role, the account has exactly its grants and the role leaves it alone; any change by hand shows
    in what the role reads (so it makes the account anew) and in what the receipt watches (the same command, so the
    next apply runs the role); after the role's SQL the account is exactly as before, its password working."""
    context = _role_vars(**values)
    db, account = identifier(values["db"], pattern=True), context["__slurm_dbd_account"]
    receipt_argv = sql.argv(_receipt_command(context)[1:])  # what the receipt watches, run on this server
    try:
        _ok(sql(_role_sql(**values)))
        shown = _shown_grants(sql, context)
        assert grants(shown["stdout_lines"]) == context["__slurm_dbd_grants"], shown
        assert not _makes_account_anew(context, shown)
        recorded = RECEIPT.command_digest(receipt_argv)

        _ok(sql(BY_HAND[change].format(account=account, db=db)))
        assert _makes_account_anew(context, _shown_grants(sql, context))
        assert RECEIPT.command_digest(receipt_argv) != recorded

        _ok(sql(_role_sql(**values)))
        shown = _shown_grants(sql, context)
        assert grants(shown["stdout_lines"]) == context["__slurm_dbd_grants"], shown
        assert not _makes_account_anew(context, shown)
        assert RECEIPT.command_digest(receipt_argv) == recorded
        login = sql("SELECT CURRENT_USER();", login=values["user"], password=values["password"])
        assert _ok(login).strip() == f"{values['user']}@localhost"
    finally:
        _ok(sql(
            f"DROP DATABASE IF EXISTS {identifier(values['db'])}; DROP USER IF EXISTS {account}; "
            "DROP ROLE IF EXISTS gq_admin;"
        ))  # fmt: skip
