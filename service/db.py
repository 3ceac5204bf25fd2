"""Database plumbing: the SQL files, the named queries' text, connection strings and
migrations. Named queries run through service.store."""

from __future__ import annotations

import logging
import math
import os
import re
import socket
import threading
from collections.abc import Collection
from functools import cache
from importlib.resources import files
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo


def resource_dir(name: str) -> Path:
    """The directory `name` (sql or migrations) of the installed package, or of the checkout.

    A built wheel carries them inside the package (pyproject.toml maps the checkout's
    top-level sql/ and migrations/ there); an editable install runs from the checkout.
    """
    packaged = files("service") / name
    if packaged.is_dir():
        return Path(str(packaged))
    checkout = Path(__file__).resolve().parent.parent / name
    if checkout.is_dir():
        return checkout
    raise RuntimeError(f"the service's {name}/ files are missing from the installed package")


log = logging.getLogger(__name__)

SQL_DIR = resource_dir("sql")
MIGRATIONS_DIR = resource_dir("migrations")

# Taken while migrating, so two processes starting at once apply each migration once.
MIGRATION_LOCK = 0x77686B73  # "whks"

_NAME = re.compile(r"^--\s*name:\s*([a-z_][a-z0-9_]*)\s*--?\s*$", re.MULTILINE)


def parse_queries(text: str) -> dict[str, str]:
    """The queries of a file, keyed by the name in the `-- name: x --` line above each,
    each without its comments and indentation (see compact)."""
    queries: dict[str, str] = {}
    parts = _NAME.split(text)
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        if name in queries:
            raise ValueError(f"query {name!r} is defined twice")
        queries[name] = compact(body)
    return queries


def compact(body: str) -> str:
    """A query as it is sent: its `--` comments (outside string literals) and indentation
    are for the reader of sql/queries. psycopg caches the parsing of a query's placeholders
    only for queries of at most 4 KB; the worker's claim, fan-out and record statements,
    run many times a second, were longer with their comments and were parsed again at
    every execution (the async store now sends them with PostgreSQL's placeholders,
    raw_query; the commands' plain connection still goes through psycopg's parsing)."""
    lines = []
    for line in body.splitlines():
        at = line.find("--")
        while at >= 0 and line.count("'", 0, at) % 2:  # inside a literal: not a comment
            at = line.find("--", at + 2)
        if at >= 0:
            line = line[:at]
        if line := line.strip():
            lines.append(line)
    return "\n".join(lines)


@cache
def queries() -> dict[str, str]:
    """Every named query in sql/queries/*.sql, loaded once."""
    found: dict[str, str] = {}
    for path in sorted((SQL_DIR / "queries").glob("*.sql")):
        for name, body in parse_queries(path.read_text()).items():
            if name in found:
                raise ValueError(f"query {name!r} is defined twice (again in {path.name})")
            found[name] = body
    return found


def query(name: str) -> str:
    """The SQL text of the named query."""
    return queries()[name]


_PLACEHOLDER = re.compile(r"%\((\w+)\)s|%%")


@cache
def raw_query(name: str) -> tuple[bytes, tuple[str, ...]]:
    """The named query with PostgreSQL's own placeholders ($1, $2, ...) and the parameter
    names they stand for, in order. Sent through a raw cursor, it is not parsed again at
    each execution: psycopg caches the parsing of a `%(name)s` query only up to 4 KB, and
    the fan-out is longer (its conversion took 45 us a statement, 9 us raw; the claim's
    is 13 us either way, mostly its arrays' dumping). A query without named placeholders
    is sent as it is, as psycopg sends it."""
    text = query(name)
    names: list[str] = []

    def number(m: re.Match[str]) -> str:
        if m.group(1) is None:
            return "%"  # %% stands for a literal %
        if m.group(1) not in names:
            names.append(m.group(1))
        return f"${names.index(m.group(1)) + 1}"

    if "%(" in text:
        text = _PLACEHOLDER.sub(number, text)
    return text.encode(), tuple(names)


# Every connection of the service (API and worker pools, the worker's LISTEN connection,
# the commands, migrate and yoyo's own) sets these itself, in the startup packet, where
# they outrank whatever `ALTER DATABASE`/`ALTER ROLE ... SET` says: the service's code
# reads and writes timestamps, intervals, floats and bytea as text in one format, runs
# plain read-committed transactions that write, and bounds its own waits.
#
# search_path: unqualified names resolve in pg_catalog only. Every object of the service
# is schema-qualified, and a function or operator planted in `public` (say a
# `public.nextval(text)`, a better match for an untyped literal than pg_catalog's) can
# never be picked up by the service's own queries.
# DateStyle, TimeZone, IntervalStyle, extra_float_digits, bytea_output: the formats
# psycopg parses (it cannot read timestamps in any DateStyle but ISO), and the formats
# values written as text are read back in (a bound written in Asia/Kolkata's IST reads
# back as Israel's).
# client_encoding, standard_conforming_strings, array_nulls, xmloption: how the text of
# queries, literals and parameters is read (with standard_conforming_strings off, every
# backslash in a function body that migrate installs would change its meaning).
# default_transaction_isolation and default_transaction_read_only: the service's
# statements write, and its queries were written for read committed (a serializable
# default would fail claims and fan-outs under concurrency).
# jit: the fan-out statement's estimated cost crosses jit_above_cost, and compiling it
# took 1.3 s for a 3 ms query.
# synchronous_commit: the fan-out's commit must be durable before the worker sends what it
# leased (with it off, a crash could make a sent delivery again under a new id).
SESSION_SETTINGS: dict[str, str] = {
    "search_path": "pg_catalog",
    "DateStyle": "ISO,YMD",
    "TimeZone": "UTC",
    "IntervalStyle": "postgres",
    "extra_float_digits": "1",
    "bytea_output": "hex",
    "client_encoding": "UTF8",
    "standard_conforming_strings": "on",
    "array_nulls": "on",
    "xmloption": "content",
    "default_transaction_isolation": "read committed",
    "default_transaction_read_only": "off",
    "default_transaction_deferrable": "off",
    "jit": "off",
    "synchronous_commit": "on",
}

# statement_timeout, lock_timeout, idle_in_transaction_session_timeout: 0, the server's
# own default, whatever the database or role says; the options of DATABASE_URL may set
# them (they come after these). The service bounds its own waits where one could pile up
# behind DDL or hold up writers (retention's DDL waits at most 2 s for a lock, a backfill
# batch 1 s, a subscription's activation WEBHOOKS_VERIFY_TIMEOUT; the worker's HTTP is
# never inside a transaction); a timeout a role keeps for interactive sessions would
# cancel a migration, the fan-out of a large statement or a detach waiting for old
# snapshots.
SESSION_DEFAULTS: dict[str, str] = {
    "statement_timeout": "0",
    "lock_timeout": "0",
    "idle_in_transaction_session_timeout": "0",
}


def session_options(settings: dict[str, str]) -> str:
    """libpq's `options` that set `settings` (spaces and backslashes escaped)."""
    def escape(value: str) -> str:
        return value.replace("\\", "\\\\").replace(" ", "\\ ")
    return " ".join(f"-c {name}={escape(value)}" for name, value in settings.items())


def service_options(url_options: str | None, *,
                    search_path: str = SESSION_SETTINGS["search_path"]) -> str:
    """The options of a service connection: SESSION_DEFAULTS, then the URL's own options,
    then SESSION_SETTINGS (a later -c wins), with `search_path` as given."""
    enforced = {**SESSION_SETTINGS, "search_path": search_path}
    return " ".join(filter(None, [session_options(SESSION_DEFAULTS), url_options,
                                  session_options(enforced)]))


# Settings that only some supported servers know (idle_session_timeout: 14, and
# transaction_timeout: 17 onwards), pinned to 0 by a SET once each connection is made
# (pin_server_settings): in the startup packet, an older server refuses the connection.
# A database's idle_session_timeout would close the pools' idle connections, and its
# transaction_timeout would cut a long fan-out, backfill or migration short.
SERVER_SETTINGS: tuple[tuple[int, str, str], ...] = (
    (140000, "idle_session_timeout", "0"),
    (170000, "transaction_timeout", "0"),
)


def server_settings(server_version: int) -> str | None:
    """The statement that pins SERVER_SETTINGS on a server of `server_version`, if any."""
    known = [(name, value) for since, name, value in SERVER_SETTINGS if server_version >= since]
    if not known:
        return None
    return "SELECT " + ", ".join(f"pg_catalog.set_config('{name}', '{value}', false)"
                                 for name, value in known)


# Defaults of WEBHOOKS_DB_TCP_TIMEOUT and WEBHOOKS_DB_CONNECT_TIMEOUT (service.config).
TCP_TIMEOUT = 15.0
CONNECT_TIMEOUT = 5.0


def network_options(tcp_timeout: float = TCP_TIMEOUT,
                    connect_timeout: float = CONNECT_TIMEOUT) -> dict[str, Any]:
    """libpq's parameters that keep a connection from hanging on a peer that vanished:
    TCP keepalives on an idle connection (the first probe after a third of `tcp_timeout`,
    four probes in the next two thirds), `tcp_user_timeout` on data the server never
    acknowledges (a NAT or a firewall that forgot the connection, a failover whose old
    host is gone), and `connect_timeout` on a new connection (libpq's whole seconds, at
    least 2). A proxy that keeps the connection open and forwards nothing is left to the
    client-side deadlines (service.store.deadline)."""
    idle = max(1, round(tcp_timeout / 3))
    return {
        "keepalives": 1,
        "keepalives_idle": idle,
        "keepalives_interval": max(1, round((tcp_timeout - idle) / 4)),
        "keepalives_count": 4,
        "tcp_user_timeout": max(1, round(tcp_timeout * 1000)),
        "connect_timeout": max(2, math.ceil(connect_timeout)),
    }


def conninfo(url: str, settings: dict[str, str] | None = None, *,
             tcp_timeout: float = TCP_TIMEOUT,
             connect_timeout: float = CONNECT_TIMEOUT) -> str:
    """The connection string of `url` with the service's session options (and
    `settings`, after them) and its network options (network_options; the URL's own
    keepalive and timeout parameters, when it has any, are kept)."""
    own = conninfo_to_dict(url)
    options = service_options(str(own["options"]) if own.get("options") else None)
    if settings:
        options += " " + session_options(settings)
    network = {k: v for k, v in network_options(tcp_timeout, connect_timeout).items()
               if k not in own}
    return make_conninfo(url, options=options, **network)


class DeadlineCursor(psycopg.Cursor[Any]):
    """A cursor whose every statement has its connection's client-side deadline
    (CliConnection.deadline): past it, the statement is cancelled on the server, where it
    can still be reached, and the connection's socket is shut down, so the command fails
    instead of hanging on a connection that stopped answering."""

    def execute(self, query: Any, params: Any = None, **kwargs: Any) -> DeadlineCursor:
        seconds = getattr(self.connection, "deadline", None)
        if seconds is None:
            super().execute(query, params, **kwargs)
            return self
        fired = threading.Event()

        def expire() -> None:
            fired.set()
            _abandon_sync(self.connection)

        timer = threading.Timer(seconds, expire)
        timer.daemon = True
        timer.start()
        try:
            super().execute(query, params, **kwargs)
        except psycopg.OperationalError as exc:
            if fired.is_set():
                raise psycopg.OperationalError(
                    f"the database did not answer within {seconds:g}s; the connection "
                    "was abandoned") from exc
            raise
        finally:
            timer.cancel()
        return self


class CliConnection(psycopg.Connection[Any]):
    """A connection of the commands: `deadline` bounds each statement (DeadlineCursor)."""

    deadline: float | None = None


def shut_down(fd: int) -> None:
    """Shuts down the socket `fd` (both ways) without closing it: whatever waits on it
    wakes with an end of file, and libpq reports the connection as lost."""
    try:
        sock = socket.socket(fileno=os.dup(fd))
    except OSError:
        return
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    finally:
        sock.close()


def _abandon_sync(conn: psycopg.Connection[Any]) -> None:
    """In the deadline's timer thread: asks the server to cancel the statement (at most a
    few seconds), then shuts the connection's socket down."""
    try:
        fd = conn.pgconn.socket
    except psycopg.Error:
        return
    try:
        conn.cancel_safe(timeout=2.0)
    except Exception as exc:  # the server may be what does not answer
        log.info("cancelling an abandoned statement failed: %s", exc)
    shut_down(fd)


def connect(url: str, *, deadline: float | None = None,
            tcp_timeout: float | None = None,
            connect_timeout: float | None = None) -> CliConnection:
    """An autocommit connection for the CLI, with the service's session settings, its
    network options and a client-side deadline on every statement. What is not given
    comes from the environment (WEBHOOKS_MAINTENANCE_DB_TIMEOUT, WEBHOOKS_DB_TCP_TIMEOUT,
    WEBHOOKS_DB_CONNECT_TIMEOUT), or their defaults when it holds no usable value."""
    from service.config import ConfigError, Settings
    try:
        env = Settings.from_env()
    except ConfigError:
        env = Settings()
    conn = CliConnection.connect(
        conninfo(url, tcp_timeout=tcp_timeout or env.db_tcp_timeout,
                 connect_timeout=connect_timeout or env.db_connect_timeout),
        autocommit=True, cursor_factory=DeadlineCursor)
    conn.deadline = deadline or env.maintenance_db_timeout
    pin_server_settings(conn)
    return conn


def pin_server_settings(conn: psycopg.Connection[Any]) -> None:
    """Pins SERVER_SETTINGS on a new connection, as its server knows them."""
    statement = server_settings(conn.info.server_version)
    if statement is not None:
        conn.execute(statement)


def yoyo_url(url: str, server_version: int = 0) -> str:
    """The libpq URI in the form yoyo expects for the psycopg 3 driver, with the service's
    session options in its query (which yoyo hands to psycopg), with the settings only
    some servers know pinned there too for a server of `server_version` (migrate knows it
    from its own connection; SERVER_SETTINGS), and schema webhooks alone
    on the search path: yoyo names its tables (_yoyo_migration, yoyo_lock ...) without a
    schema, so they live in webhooks, which only the installing role can write (see
    prepare_yoyo). The role's or the database's search path would let whoever owns a
    schema early in it plant those tables, with triggers that the migrating superuser
    runs, and records that skip pending migrations."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme not in ("postgres", "postgresql"):
        raise ValueError("DATABASE_URL must be a postgresql:// URI")
    parts = urlsplit(f"postgresql+psycopg://{rest}")
    query = parse_qsl(parts.query, keep_blank_values=True)
    own = " ".join(v for k, v in query if k == "options") or None
    query = [(k, v) for k, v in query if k != "options"]
    options = service_options(own, search_path=YOYO_SCHEMA)
    known = {name: value for since, name, value in SERVER_SETTINGS if server_version >= since}
    if known:
        options += " " + session_options(known)
    query.append(("options", options))
    query.extend((k, str(v)) for k, v in network_options().items()
                 if k not in {k for k, _ in query})
    return urlunsplit(parts._replace(query=urlencode(query, quote_via=quote)))


class MigrationRefused(RuntimeError):
    """The database cannot be migrated by this version of the service; nothing was changed."""


# yoyo's own tables: they record the numbered migrations applied (and lock and log runs).
YOYO_SCHEMA = "webhooks"
YOYO_TABLES = ("_yoyo_migration", "_yoyo_log", "_yoyo_version", "yoyo_lock")


# The roles whose objects the migrating role may trust: itself, the roles it is a member
# of, and superusers. pg_has_role would say a superuser is a member of every role, and a
# superuser is who installs the service into a database its application's roles share.
_TRUSTED_ROLES = """
WITH RECURSIVE member_of (oid) AS (
    SELECT r.oid FROM pg_catalog.pg_roles r WHERE r.rolname = current_user
    UNION
    SELECT a.roleid FROM pg_catalog.pg_auth_members a JOIN member_of m ON a.member = m.oid
)
SELECT oid FROM member_of
UNION
SELECT r.oid FROM pg_catalog.pg_roles r WHERE r.rolsuper
"""


def prepare_yoyo(conn: psycopg.Connection[Any], known: Collection[str]) -> None:
    """Makes schema webhooks ready to hold yoyo's tables (migration 0001 creates it only
    when it is missing); run under the migration lock, before yoyo connects.

    Refused when the schema belongs to a role the migrating one does not trust (itself, a
    role it is a member of, a superuser): whoever owns it could change what every later
    migrate runs. Versions before this one let yoyo keep its tables in the first schema
    of the role's search path (usually public): found there, in tables a trusted role
    owns, they are moved into webhooks; copies another role owns are never read. When the
    service's tables exist and no such record does, migrate is refused rather than run
    from 0001 again. `known`: the ids of this version's numbered migrations."""
    trusted = {r[0] for r in conn.execute(_TRUSTED_ROLES).fetchall()}
    row = conn.execute(
        "SELECT n.nspowner, n.nspowner::pg_catalog.regrole::pg_catalog.text, current_user"
        " FROM pg_catalog.pg_namespace n WHERE n.nspname = %s", (YOYO_SCHEMA,)).fetchone()
    if row is None:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(YOYO_SCHEMA)))
    elif row[0] not in trusted:
        raise MigrationRefused(
            f"schema {YOYO_SCHEMA} belongs to role {row[1]}, which the migrating role "
            f"({row[2]}) is not and is not a member of: whoever owns the schema could change "
            f"what migrate runs. Drop or rename that schema if {row[1]} should not own it, "
            "or migrate as that role; nothing was changed")
    if conn.execute("SELECT pg_catalog.to_regclass(%s)",
                    (f"{YOYO_SCHEMA}._yoyo_migration",)).fetchone() != (None,):
        return
    # The earlier versions' records, in tables a trusted role owns, the one that records
    # most of the numbered migrations first.
    found = []
    for schema, owner in conn.execute(
            "SELECT n.nspname, c.relowner FROM pg_catalog.pg_class c"
            " JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace"
            " WHERE c.relname = '_yoyo_migration' AND c.relkind = 'r'"
            "   AND n.nspname <> %s AND n.nspname !~ '^pg_'"
            " ORDER BY n.nspname", (YOYO_SCHEMA,)).fetchall():
        if owner not in trusted:
            continue
        ids = conn.execute(sql.SQL("SELECT migration_id FROM {}._yoyo_migration").format(
            sql.Identifier(schema))).fetchall()
        found.append((sum(1 for (i,) in ids if i in known), schema))
    found.sort(key=lambda f: -f[0])
    if not found or found[0][0] == 0:
        if conn.execute("SELECT pg_catalog.to_regclass(%s)",
                        (f"{YOYO_SCHEMA}.subscriptions",)).fetchone() != (None,):
            raise MigrationRefused(
                f"schema {YOYO_SCHEMA} holds the service's tables, but no record of the "
                "migrations applied to them (yoyo's _yoyo_migration) was found in a table "
                "the migrating role trusts: running them again from 0001 would fail. Migrate "
                "as the role that installed the service; nothing was changed")
        return
    if len(found) > 1 and found[1][0] == found[0][0]:
        raise MigrationRefused(
            "records of the migrations applied (yoyo's _yoyo_migration) were found in "
            f"schemas {found[0][1]} and {found[1][1]} alike: keep the right one (drop or "
            "rename the other's _yoyo_* tables and yoyo_lock), then migrate again; nothing "
            "was changed")
    schema = found[0][1]
    with conn.transaction():
        for table in YOYO_TABLES:
            owner = conn.execute(
                "SELECT c.relowner FROM pg_catalog.pg_class c"
                " JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace"
                " WHERE n.nspname = %s AND c.relname = %s", (schema, table)).fetchone()
            if owner is not None and owner[0] in trusted:
                conn.execute(sql.SQL("ALTER TABLE {}.{} SET SCHEMA {}").format(
                    sql.Identifier(schema), sql.Identifier(table),
                    sql.Identifier(YOYO_SCHEMA)))
    log.info("migrate: yoyo's tables moved from schema %s to %s", schema, YOYO_SCHEMA)


def replaceable_files() -> list[Path]:
    """The replaceable SQL files (functions, triggers, event triggers, views), in the order
    sql/replaceable.txt gives: every `migrate` runs them all again."""
    listed = (SQL_DIR / "replaceable.txt").read_text().splitlines()
    return [SQL_DIR / line.strip() for line in listed
            if line.strip() and not line.lstrip().startswith("#")]


def migrate(url: str) -> list[str]:
    """Applies the pending numbered migrations, then every replaceable SQL file and every
    attached table's capture function again; returns the ids of the migrations applied
    (empty when there were none). Refuses a database migrated by a newer version."""
    from yoyo import get_backend, read_migrations

    from service.config import ConfigError, Settings
    try:
        env = Settings.from_env()
    except ConfigError:
        env = Settings()
    with connect(url, deadline=env.migrate_db_timeout) as conn:
        conn.execute("SELECT pg_advisory_lock(%s)", (MIGRATION_LOCK,))
        try:
            migrations = read_migrations(str(MIGRATIONS_DIR))
            if not migrations:
                raise RuntimeError(f"no migrations found in {MIGRATIONS_DIR}: the "
                                   "installed package is incomplete")
            prepare_yoyo(conn, {m.id for m in migrations})
            backend = get_backend(yoyo_url(url, conn.info.server_version))
            try:
                with backend.lock():
                    _refuse_newer(backend, migrations)
                    pending = backend.to_apply(migrations)
                    backend.apply_migrations(pending)
            finally:
                backend.connection.close()
            with conn.transaction():
                for path in replaceable_files():
                    conn.execute(path.read_bytes())
                regenerate_captures(conn)
            return [m.id for m in pending]
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s)", (MIGRATION_LOCK,))


def _refuse_newer(backend: Any, migrations: Any) -> None:
    """Raises MigrationRefused when the database holds a migration this code does not have
    (it was migrated by a newer version): running older functions over newer tables would
    break both."""
    known = {m.hash for m in migrations}
    unknown = [h for h in backend.get_applied_migration_hashes() if h not in known]
    if not unknown:
        return
    rows = backend.execute(backend.format_sql(
        "SELECT migration_id FROM {0.migration_table_quoted} ORDER BY applied_at_utc"
    )).fetchall()
    newer = [row[0] for row in rows if row[0] not in {m.id for m in migrations}]
    raise MigrationRefused(
        "the database was migrated by a newer version of the service (it has migration(s) "
        f"{', '.join(newer or unknown)}, which this version does not know): upgrade the "
        "service's package to that version or later; nothing was changed")


def regenerate_captures(conn: psycopg.Connection[Any]) -> None:
    """Writes every attached table's capture function again from today's generator, so a
    fix to it reaches every table attached by an earlier version."""
    tables = conn.execute("SELECT a.table_oid::oid, a.table_oid::text"
                          " FROM webhooks.attachments a ORDER BY a.id").fetchall()
    for table_oid, table_name in tables:
        try:
            with conn.transaction():
                row = conn.execute("SELECT webhooks.refresh_capture(%s::oid::regclass)",
                                   (table_oid,)).fetchone()
            if row and row[0]:
                log.warning("migrate: table %s was detached: %s", table_name, row[0])
        except psycopg.Error as exc:
            # One broken attachment (a named column dropped where no event trigger could
            # refuse it) must not hold back the upgrade of every other table; its own
            # writes fail until it is attached again, as they did before.
            log.warning("migrate: the capture function of table %s was not rewritten: %s",
                        table_name, str(exc).strip())
