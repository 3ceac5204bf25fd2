"""Database plumbing: the SQL files and the named queries' text (queries.py), connection
strings and the commands' connections (connection.py), and migrations (install.py).
Named queries run through service.store."""

from service.db.connection import (
    CONNECT_TIMEOUT,
    SERVER_SETTINGS,
    SESSION_DEFAULTS,
    SESSION_SETTINGS,
    TCP_TIMEOUT,
    CliConnection,
    DeadlineCursor,
    connect,
    conninfo,
    network_options,
    pin_server_settings,
    server_settings,
    service_options,
    session_options,
    shut_down,
)
from service.db.install import (
    YOYO_SCHEMA,
    YOYO_TABLES,
    MigrationRefused,
    migrate,
    prepare_yoyo,
    regenerate_captures,
    replaceable_files,
    yoyo_url,
)
from service.db.queries import (
    MIGRATION_LOCK,
    MIGRATIONS_DIR,
    SQL_DIR,
    compact,
    parse_queries,
    queries,
    query,
    raw_query,
    resource_dir,
)

__all__ = [
    "CONNECT_TIMEOUT", "MIGRATIONS_DIR", "MIGRATION_LOCK", "SERVER_SETTINGS",
    "SESSION_DEFAULTS", "SESSION_SETTINGS", "SQL_DIR", "TCP_TIMEOUT", "YOYO_SCHEMA",
    "YOYO_TABLES", "CliConnection", "DeadlineCursor", "MigrationRefused", "compact",
    "connect", "conninfo", "migrate", "network_options", "parse_queries",
    "pin_server_settings", "prepare_yoyo", "queries", "query", "raw_query",
    "regenerate_captures", "replaceable_files", "resource_dir", "server_settings",
    "service_options", "session_options", "shut_down", "yoyo_url",
]
