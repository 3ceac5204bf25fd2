"""Connections: the session settings every connection of the service pins, the network
options that keep one from hanging, and the commands' connections with their deadlines."""

from __future__ import annotations

import math
import os
import socket
import threading
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from service.db.queries import log

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

# statement_timeout, lock_timeout: 0, the server's own default, whatever the database or
# role says; the options of DATABASE_URL may set them (they come after these). The service
# bounds its own waits where one could pile up behind DDL or hold up writers (retention's
# DDL waits at most 2 s for a lock, a backfill batch 1 s, a subscription's activation
# WEBHOOKS_VERIFY_TIMEOUT; the worker's HTTP is never inside a transaction); a timeout a
# role keeps for interactive sessions would cancel a migration, the fan-out of a large
# statement or a detach waiting for old snapshots.
# idle_in_transaction_session_timeout: a minute. The service never waits inside a
# transaction (its statements follow each other), but a connection abandoned at its
# deadline behind a proxy that hangs keeps its server side alive, and the cancel request
# cannot pass either: the server ends that transaction, and frees what it locked, here.
SESSION_DEFAULTS: dict[str, str] = {
    "statement_timeout": "0",
    "lock_timeout": "0",
    "idle_in_transaction_session_timeout": "1min",
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


# libpq's parameters of network_options and the server's settings of the same meaning.
_SERVER_SIDE = {"keepalives_idle": "tcp_keepalives_idle",
                "keepalives_interval": "tcp_keepalives_interval",
                "keepalives_count": "tcp_keepalives_count",
                "tcp_user_timeout": "tcp_user_timeout"}


def server_network_settings(tcp_timeout: float = TCP_TIMEOUT) -> dict[str, str]:
    """The server's side of network_options, set on each service connection: its own
    keepalives and tcp_user_timeout notice a client host that vanished (a crashed node, a
    partition) as the client's notice the server's. Without them a backend whose client
    vanished in the middle of a pipeline or a result waits for the operating system's
    keepalives (two hours by default) with its transaction's locks held. Ignored on a Unix
    socket; the URL's own options may set them."""
    client = network_options(tcp_timeout)
    return {setting: str(client[parameter]) for parameter, setting in _SERVER_SIDE.items()}


def conninfo(url: str, settings: dict[str, str] | None = None, *,
             tcp_timeout: float = TCP_TIMEOUT,
             connect_timeout: float = CONNECT_TIMEOUT) -> str:
    """The connection string of `url` with the service's session options (and
    `settings`, after them) and its network options (network_options; the URL's own
    keepalive and timeout parameters, when it has any, are kept)."""
    own = conninfo_to_dict(url)
    options = (session_options(server_network_settings(tcp_timeout)) + " "
               + service_options(str(own["options"]) if own.get("options") else None))
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
