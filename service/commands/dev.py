"""`webhooks dev`, what `make run` runs: a ready installation on a development database."""

from __future__ import annotations

import os
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


def banner(token: str, host: str, port: int) -> str:
    """What a newcomer needs to try the API right away."""
    base = f"http://{host}:{port}"
    return f"""
  API      {base}/api/v1/   (docs: {base}/schema)
  token    {token}

  Try it:
    curl -H 'Authorization: Bearer {token}' {base}/api/v1/hook_events
    make demo        # in another terminal: a receiver, a subscription, signed deliveries
"""


def dev(settings: Settings, host: str, port: int, token_file: str) -> int:
    """Prepares the database, prints the token and runs the API and a worker until Ctrl-C."""
    from service.commands.runner import api_socket, run_all, run_loop

    # Bound first: with the port in use, no banner points at another process's API.
    sock = api_socket(host, port)
    token = prepare(settings, Path(token_file))
    print(banner(token, host, port), flush=True)
    run_loop(run_all(settings, sock, concurrency=settings.concurrency))
    return 0
