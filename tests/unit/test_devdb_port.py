"""`make run DB_PORT=...`: which port the private cluster takes, and the DATABASE_URL that
`make run` prints for other terminals."""

from __future__ import annotations

from pathlib import Path

import pytest

from service.commands import devdb
from service.commands.dev import banner, shown_url

OPTS = ('/usr/lib/postgresql/15/bin/postgres "-D" "/x/.pgdata" "-p" "54341" "-c" '
        '"listen_addresses=127.0.0.1" "-c" "unix_socket_directories="\n')


def test_the_port_asked_for_wins_else_the_last_one_else_the_default(tmp_path: Path) -> None:
    assert devdb.cluster_port(tmp_path) == devdb.PRIVATE_PORT
    assert devdb.cluster_port(tmp_path, 54350) == 54350
    (tmp_path / "postmaster.opts").write_text(OPTS)
    assert devdb.last_port(tmp_path) == 54341
    assert devdb.cluster_port(tmp_path) == 54341  # where `make run DB_PORT=54341` ran it
    assert devdb.cluster_port(tmp_path, 54350) == 54350


def test_a_running_cluster_is_found_on_its_port(tmp_path: Path) -> None:
    (tmp_path / "postmaster.opts").write_text(OPTS)
    (tmp_path / "postmaster.pid").write_text(
        "4242\n/x/.pgdata\n1764400000\n54377\n\n127.0.0.1\n  5432001  0\nready\n")
    assert devdb.running_port(tmp_path) == 54377
    assert devdb.cluster_port(tmp_path) == 54377


def test_the_banner_prints_the_database_url_for_other_terminals() -> None:
    url = "postgresql://postgres@127.0.0.1:54341/postgres"
    text = banner("wht_x", "127.0.0.1", 8001, url)
    assert f"export DATABASE_URL={url}\n" in text  # as it is: nothing to quote
    assert "make demo API=http://127.0.0.1:8001" in text
    assert "make demo API" not in banner("wht_x", "127.0.0.1", 8000, url)


@pytest.mark.parametrize(("url", "shown"), [
    ("postgresql://app:Sup3rS3cret@db:5432/app", "postgresql://app:***@db:5432/app"),
    ("postgresql://db/app?sslmode=require&password=Sup3rS3cret",
     "postgresql://db/app?sslmode=require&password=***"),
    ("postgresql://postgres@127.0.0.1:54329/postgres",
     "postgresql://postgres@127.0.0.1:54329/postgres"),
])
def test_the_banner_never_prints_a_password(url: str, shown: str) -> None:
    assert shown_url(url) == shown
    text = banner("wht_x", "127.0.0.1", 8000, url)
    assert "Sup3r" not in text and "S3cret" not in text
    assert shown in text
