"""The `webhooks` command line: migrate, api, worker, run, token, status, demo."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
import traceback
from collections.abc import Sequence
from types import TracebackType

import psycopg

from service import __version__, db
from service.commands import deliveries
from service.commands.runner import run_loop
from service.config import DEFAULT_DATABASE_URL, ConfigError, Settings
from service.logs import printable, protect_url, redact, setup_logging
from service.store import StoreRejected, StoreUnavailable

log = logging.getLogger("webhooks.cli")


def _settings() -> Settings:
    try:
        return Settings.from_env()
    except ConfigError as exc:
        raise SystemExit(f"webhooks: configuration error: {exc}") from None


def cmd_migrate(args: argparse.Namespace) -> int:
    try:
        applied = db.migrate(_settings().database_url)
    except RuntimeError as exc:
        raise SystemExit(f"webhooks migrate: {printable(str(exc))}") from None
    except psycopg.OperationalError:
        raise  # cannot reach the database: main says so
    except psycopg.Error as exc:
        raise SystemExit(f"webhooks migrate: the database refused: {one_line(exc)}") from None
    print(f"applied {len(applied)} migration(s): {', '.join(applied)}" if applied
          else "database is up to date")
    return 0


def cmd_api(args: argparse.Namespace) -> int:
    from service.commands.runner import api_socket, run_api

    settings = _settings()
    if args.processes < 1:
        raise SystemExit("webhooks api: --processes must be at least 1")
    if args.processes > 1:
        from service.commands.processes import api_child_argv, run_processes

        return run_processes([api_child_argv(args.host, args.port)
                              for _ in range(args.processes)])
    sock = api_socket(args.host, args.port, reuse_port=args.reuse_port)
    run_loop(run_api(settings, sock))
    return 0


def cmd_worker(args: argparse.Namespace) -> int:
    from service.worker.loop import run_worker

    settings = _settings()
    if args.processes < 1:
        raise SystemExit("webhooks worker: --processes must be at least 1")
    if args.processes > 1:
        from service.commands.processes import child_argv, run_processes

        return run_processes([child_argv(i, args.concurrency, args.metrics_port,
                                         args.metrics_host) for i in range(args.processes)])
    run_loop(run_worker(settings, concurrency=args.concurrency or settings.concurrency,
                        metrics_port=args.metrics_port, metrics_host=args.metrics_host))
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from service.commands.runner import api_socket, run_all

    settings = _settings()
    sock = api_socket(args.host, args.port)
    run_loop(run_all(settings, sock, concurrency=args.concurrency or settings.concurrency))
    return 0


def cmd_dev(args: argparse.Namespace) -> int:
    from service.commands.dev import dev

    return dev(_settings(), host=args.host, port=args.port, token_file=args.token_file)


def cmd_demo(args: argparse.Namespace) -> int:
    from service.commands.demo import run_demo

    return run_loop(run_demo(_settings(), api=args.api, token=args.token,
                                token_file=args.token_file))


def cmd_status(args: argparse.Namespace) -> int:
    from service.commands.status import print_status

    return print_status(_settings(), as_json=args.json)


def cmd_token(args: argparse.Namespace) -> int:
    from service import tokens

    with db.connect(_settings().database_url) as conn:
        if args.token_command == "create":
            try:
                token_id, token = tokens.create(conn, args.owner, args.tenant)
            except ValueError as exc:
                raise SystemExit(f"webhooks token create: {printable(str(exc))}") from None
            scope = f" (tenant {printable(args.tenant)})" if args.tenant else ""
            print(f"created token {token_id} for owner {printable(args.owner)}{scope}; "
                  "it is shown only now:")
            print(token)
        elif args.token_command == "list":
            rows = tokens.list_all(conn)
            print(f"{'id':>6}  {'owner':<20} {'tenant':<16} {'created':<20} revoked")
            for row in rows:
                revoked = row["revoked_at"]
                print(f"{row['id']:>6}  {printable(str(row['owner'])):<20} "
                      f"{printable(str(row['tenant'] or '-')):<16} "
                      f"{row['created_at']:%Y-%m-%d %H:%M:%S}  "
                      f"{format(revoked, '%Y-%m-%d %H:%M:%S') if revoked else '-'}")
        else:
            if not tokens.revoke(conn, args.id):
                print(f"webhooks token revoke: no token with id {args.id}", file=sys.stderr)
                return 1
            print(f"revoked token {args.id}")
    return 0


def cmd_secrets(args: argparse.Namespace) -> int:
    from service.crypto import SecretsError, new_key, reseal_all

    if args.secrets_command == "keygen":
        print(new_key())
        return 0
    with db.connect(_settings().database_url) as conn:
        try:
            changed, total = reseal_all(conn, _settings().encryption_key)
        except SecretsError as exc:
            raise SystemExit(f"webhooks secrets encrypt: {exc}") from None
    print(f"re-sealed {changed} of {total} subscription secrets")
    return 0


def _serve_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port to bind (default 8000)")


def _add_process_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """api, worker and run: the service's processes."""
    p = sub.add_parser("api", help="serve the REST API",
                       description="Serve the REST API (/api/v1/...) until SIGTERM or Ctrl-C.")
    _serve_options(p)
    p.add_argument("--processes", type=int, default=1,
                   help="API processes sharing the port (SO_REUSEPORT: the kernel spreads "
                        "the connections), each with its own pool and rate limits "
                        "(default 1; see docs/operations.md)")
    p.add_argument("--reuse-port", action="store_true",
                   help="bind with SO_REUSEPORT, so that several `webhooks api` commands "
                        "can serve one port")
    p.set_defaults(func=cmd_api)

    p = sub.add_parser("worker", help="deliver webhooks",
                       description="Fan out captured events and deliver them, until SIGTERM "
                                   "or Ctrl-C; in-flight deliveries finish or are released.")
    p.add_argument("--concurrency", type=int, default=None,
                   help="deliveries in flight at once (default WEBHOOKS_CONCURRENCY, 64)")
    p.add_argument("--processes", type=int, default=1,
                   help="worker processes to run on this host, each with its own "
                        "concurrency and connections (default 1; see the README)")
    p.add_argument("--metrics-port", type=int, default=None,
                   help="serve Prometheus metrics at /metrics on this port (with "
                        "--processes N: this port and the N-1 after it)")
    p.add_argument("--metrics-host", default="127.0.0.1",
                   help="address of the metrics server (default 127.0.0.1)")
    p.set_defaults(func=cmd_worker)

    p = sub.add_parser("run", help="serve the API and run a worker in one process",
                       description="The API and a worker together, for small installations.")
    _serve_options(p)
    p.add_argument("--concurrency", type=int, default=None, help="worker concurrency")
    p.set_defaults(func=cmd_run)


def _add_development_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """dev, demo and status."""
    p = sub.add_parser("dev", help="what `make run` runs: migrate, demo schema, token, run",
                       description="Apply migrations, load the demo schema "
                                   "(sql/triggers/example_invoices.sql), create or reuse a "
                                   "development token, print it with a curl example, then run "
                                   "the API and a worker.")
    _serve_options(p)
    p.add_argument("--token-file", default=".webhooks-dev-token",
                   help="where the development token is kept between runs")
    p.set_defaults(func=cmd_dev)

    p = sub.add_parser("demo", help="subscribe a local receiver and show signed deliveries",
                       description="Start a receiver on 127.0.0.1, subscribe it through the "
                                   "REST API, insert an invoice and a payment with psql, and "
                                   "print each delivery and whether its signature verified.")
    p.add_argument("--api", default="http://127.0.0.1:8000", help="base URL of the API")
    p.add_argument("--token", default=None, help="API token (default: the development token)")
    p.add_argument("--token-file", default=".webhooks-dev-token")
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("status", help="what the service is doing, at a glance",
                       description="Attached tables, subscriptions by state, deliveries due, "
                                   "oldest pending age, recent failures, outbox backlog.")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.set_defaults(func=cmd_status)


def _add_admin_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """secrets and token."""
    p = sub.add_parser("secrets", help="subscription secrets at rest",
                       description="Subscription secrets are stored Fernet-encrypted when "
                                   "WEBHOOKS_ENCRYPTION_KEY is set.")
    ssub = p.add_subparsers(dest="secrets_command", required=True, metavar="ACTION")
    s = ssub.add_parser("keygen", help="print a new key for WEBHOOKS_ENCRYPTION_KEY",
                        description="Print a new Fernet key.")
    s.set_defaults(func=cmd_secrets)
    s = ssub.add_parser("encrypt", help="re-store every secret under the current key",
                        description="Encrypt every stored secret with the first key of "
                                    "WEBHOOKS_ENCRYPTION_KEY, with progress (after setting "
                                    "the key, or after putting a new key first to rotate); "
                                    "safe to run while serving.")
    s.set_defaults(func=cmd_secrets)

    p = sub.add_parser("token", help="create, list or revoke API tokens",
                       description="Manage API tokens. Tokens are stored only as hashes.")
    tsub = p.add_subparsers(dest="token_command", required=True, metavar="ACTION")
    t = tsub.add_parser("create", help="create a token (printed alone on the last line)",
                        description="Create a token for an owner, optionally scoped to a "
                                    "tenant; the token is printed alone on the last line.")
    t.add_argument("--owner", required=True, help="who the token's subscriptions belong to")
    t.add_argument("--tenant", default=None,
                   help="only rows of this tenant reach this token's subscriptions")
    t.set_defaults(func=cmd_token)
    t = tsub.add_parser("list", help="list tokens (never the tokens themselves)",
                        description="List token ids, owners, tenants and dates.")
    t.set_defaults(func=cmd_token)
    t = tsub.add_parser("revoke", help="revoke a token by id",
                        description="Revoke a token; requests with it get 401 at once.")
    t.add_argument("id", type=int, help="token id (see `webhooks token list`)")
    t.set_defaults(func=cmd_token)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every command."""
    parser = argparse.ArgumentParser(
        prog="webhooks",
        description="Postgres-centric webhook subscription service. Configuration comes from "
                    "DATABASE_URL and WEBHOOKS_* environment variables (see README).",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("migrate", help="apply pending database migrations (idempotent)",
                       description="Apply pending migrations to DATABASE_URL. Safe to run "
                                   "again, and from several processes at once.")
    p.set_defaults(func=cmd_migrate)

    _add_process_commands(sub)
    _add_development_commands(sub)
    _add_admin_commands(sub)
    deliveries.register(sub, _settings)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `webhooks` console script."""
    args = build_parser().parse_args(argv)
    settings = _settings()
    # No message, log line or error of this process shows DATABASE_URL's password.
    protect_url(settings.database_url)
    sys.excepthook = _scrubbed_traceback
    threading.excepthook = _scrubbed_thread_traceback
    setup_logging(settings.log_format, settings.log_level)
    try:
        return int(args.func(args))
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (`webhooks status | head`): nothing more to say, no traceback.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except SystemExit as exc:
        if isinstance(exc.code, str):
            raise SystemExit(printable(redact(exc.code))) from None
        raise
    except (psycopg.OperationalError, StoreUnavailable) as exc:
        print(f"webhooks: cannot reach the database: {one_line(exc)}", file=sys.stderr)
        if "DATABASE_URL" not in os.environ:
            print("webhooks: DATABASE_URL is not set, so this was make run's private "
                  f"cluster ({DEFAULT_DATABASE_URL}): start `make run`, or set DATABASE_URL "
                  "(`make run` prints its cluster's, on whatever port DB_PORT chose)",
                  file=sys.stderr)
        return 1
    except (psycopg.Error, StoreRejected) as exc:
        sqlstate = getattr(exc, "sqlstate", None)
        if sqlstate in ("42P01", "3F000", "42883"):  # no such table, schema or function
            print("webhooks: the database is not migrated for this version "
                  f"({one_line(exc)}): run `webhooks migrate`", file=sys.stderr)
        else:
            print(f"webhooks: the database refused: {one_line(exc)}", file=sys.stderr)
        return 1


def one_line(exc: BaseException) -> str:
    """The first line of an error's message (libpq adds hints and a LINE/caret excerpt),
    printable: the database's text (a table's name) with its control characters escaped,
    and no part of the database's password."""
    return printable(redact((str(exc).strip().splitlines() or [type(exc).__name__])[0]))


def _scrubbed_traceback(kind: type[BaseException], exc: BaseException,
                        tb: TracebackType | None) -> None:
    """An unexpected error's traceback, as Python prints it, without the database's
    password and with control characters escaped."""
    text = "".join(traceback.format_exception(kind, exc, tb))
    sys.stderr.write("\n".join(printable(redact(line)) for line in text.splitlines()) + "\n")


def _scrubbed_thread_traceback(args: threading.ExceptHookArgs) -> None:
    """The same for an error that ends a thread (the worker's metrics server's, say)."""
    if args.exc_type is SystemExit or args.exc_value is None:
        return
    sys.stderr.write(f"Exception in thread {args.thread.name if args.thread else '?'}:\n")
    _scrubbed_traceback(args.exc_type, args.exc_value, args.exc_traceback)
