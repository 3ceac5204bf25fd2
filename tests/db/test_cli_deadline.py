"""The commands' connections (service.db.connect) cannot hang on a database connection
that stops answering: each statement has its deadline, past which the statement is
cancelled where the server can be reached and the command fails."""

from __future__ import annotations

import time

import psycopg
import pytest

from service import db
from tests.support.proxy import Proxy, port_of


def test_a_statement_on_a_hung_connection_fails_at_its_deadline(
        db_url: str, conn: psycopg.Connection) -> None:
    with Proxy(port_of(db_url)) as proxy, db.connect(proxy.url(db_url), deadline=1.0) as cli:
        assert cli.execute("SELECT 1").fetchone() == (1,)
        proxy.hang()
        started = time.monotonic()
        with pytest.raises(psycopg.OperationalError, match="did not answer within 1s"):
            cli.execute("SELECT 1")
        assert time.monotonic() - started < 4


def test_the_connection_has_keepalives_and_a_tcp_user_timeout(db_url: str) -> None:
    with db.connect(db_url, tcp_timeout=6.0, connect_timeout=3.0) as cli:
        params = cli.info.get_parameters()
        dsn = cli.info.dsn
    assert "keepalives=1" in dsn and "tcp_user_timeout=6000" in dsn, dsn
    assert "keepalives_idle=2" in dsn and "connect_timeout=3" in dsn, dsn
    assert params.get("dbname")
