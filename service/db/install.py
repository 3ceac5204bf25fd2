"""Migrations: yoyo's numbered migrations and the replaceable SQL, applied under the
migration lock, then every attachment's capture function written again."""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

import psycopg
from psycopg import sql

from service.db.connection import (
    SERVER_SETTINGS,
    connect,
    network_options,
    service_options,
    session_options,
)
from service.db.queries import MIGRATION_LOCK, MIGRATIONS_DIR, SQL_DIR, log


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
