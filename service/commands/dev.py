"""`webhooks dev`, what `make run` runs: a ready installation on a development database."""

from __future__ import annotations

import os
import shlex
from pathlib import Path

from service import db, tokens
from service.config import Settings
from service.store import SyncStore

DEV_OWNER = "developer"
EXAMPLE_SCHEMA = db.SQL_DIR / "triggers" / "example_invoices.sql"


def prepare(settings: Settings, token_file: Path) -> str:
    """Migrates, loads the demo schema and returns the development token (made once, reused)."""
    applied = db.migrate(settings.database_url)
    if applied:
        print(f"applied migrations: {', '.join(applied)}")
    # The demo schema names public explicitly; the session settings are the service's.
    with db.connect(settings.database_url) as conn:
        conn.execute("SET client_min_messages = warning")
        conn.execute(EXAMPLE_SCHEMA.read_bytes())
        token = token_file.read_text().strip() if token_file.exists() else ""
        if token and tokens.well_formed(token) and SyncStore(conn).lookup_token(
                token_hash=tokens.hash_token(token)) is not None:
            return token
        _, token = tokens.create(conn, DEV_OWNER)
    token_file.write_text(token + "\n")
    os.chmod(token_file, 0o600)
    return token


def shown_url(url: str) -> str:
    """`url` to print: its password, if it has one, replaced by `***` (the private
    cluster's has none)."""
    scheme, sep, rest = url.partition("://")
    head, query_sep, query = rest.partition("?")
    userinfo, at, hostpart = head.rpartition("@")
    if sep and at and ":" in userinfo:
        head = f"{userinfo.partition(':')[0]}:***@{hostpart}"
    if "password=" in query:
        query = "&".join("password=***" if p.startswith("password=") else p
                         for p in query.split("&"))
    return f"{scheme}{sep}{head}{query_sep}{query}"


def banner(token: str, host: str, port: int, database_url: str) -> str:
    """What a newcomer needs to try the API right away, and to reach the same database
    from another terminal."""
    base = f"http://{host}:{port}"
    shown = shown_url(database_url)
    hidden = "   (password not shown)" if shown != database_url else ""
    demo = "make demo" if port == 8000 else f"make demo API={base}"
    return f"""
  API       {base}/api/v1/   (docs: {base}/schema)
  token     {token}
  database  {shown}{hidden}

  Try it:
    curl -H 'Authorization: Bearer {token}' {base}/api/v1/hook_events
    {demo:<16} # in another terminal: a receiver, a subscription, signed deliveries

  In another terminal, the commands reach this database with
    export DATABASE_URL={shlex.quote(shown)}
    .venv/bin/webhooks status
"""


def dev(settings: Settings, host: str, port: int, token_file: str) -> int:
    """Prepares the database, prints the token and runs the API and a worker until Ctrl-C."""
    from service.commands.runner import api_socket, run_all, run_loop

    # Bound first: with the port in use, no banner points at another process's API.
    sock = api_socket(host, port)
    token = prepare(settings, Path(token_file))
    print(banner(token, host, port, settings.database_url), flush=True)
    run_loop(run_all(settings, sock, concurrency=settings.concurrency))
    return 0
