"""Private PostgreSQL clusters a test starts itself (never the shared server), from the
installed server binaries, as the `postgres` OS user when the tests run as root (the way
service/commands/devdb.py runs `make run`'s): to restart one, or to fail over from a
primary to a synchronous standby made with pg_basebackup and promoted with pg_ctl.

    with Cluster.primary() as primary, primary.standby() as standby:
        ...
        standby.promote()
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import psycopg

from service import db
from service.commands.devdb import _as_server_user, bindir
from tests.support.net import free_port


def _run(argv: Sequence[str], timeout: float = 120) -> None:
    result = subprocess.run(_as_server_user(argv), capture_output=True, text=True,
                            timeout=timeout)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed:\n{result.stdout}{result.stderr}")


def _scratch() -> Path:
    """A new directory the `postgres` user owns (when we are root) and can reach."""
    path = Path(tempfile.mkdtemp(prefix="pg-webhooks-test-", dir="/var/tmp"))
    path.chmod(0o700)
    if os.geteuid() == 0:
        shutil.chown(path, "postgres", "postgres")
    return path


class Cluster:
    """One private cluster on 127.0.0.1:`port`, trust authentication for `postgres`."""

    def __init__(self, root: Path, port: int) -> None:
        self.root = root
        self.datadir = root / "data"
        self.port = port
        self.bins = bindir()

    @property
    def url(self) -> str:
        """The URL of its `postgres` database."""
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _pg_ctl(self, *args: str) -> None:
        _run([str(self.bins / "pg_ctl"), "-D", str(self.datadir), "-w", "-t", "60", *args])

    @classmethod
    def primary(cls, synchronous: bool = False) -> Cluster:
        """A new, started cluster; `synchronous`: commits wait for a standby
        (synchronous_standby_names = '*')."""
        cluster = cls(_scratch(), free_port())
        _run([str(cluster.bins / "initdb"), "-D", str(cluster.datadir), "-U", "postgres",
              "--auth=trust", "--no-sync", "-E", "UTF8", "--locale=C"])
        settings = [
            f"port = {cluster.port}", "listen_addresses = '127.0.0.1'",
            f"unix_socket_directories = '{cluster.root}'", "fsync = off",
            "wal_level = replica", "max_wal_senders = 4", "shared_buffers = 16MB",
            "max_connections = 60", "logging_collector = off",
        ]
        if synchronous:
            settings.append("synchronous_standby_names = '*'")
        cluster._append_conf(settings)
        with (cluster.datadir / "pg_hba.conf").open("a") as hba:
            hba.write("host replication postgres 127.0.0.1/32 trust\n")
        cluster.start()
        return cluster

    def _append_conf(self, lines: Sequence[str]) -> None:
        text = "\n".join(lines) + "\n"
        _run(["sh", "-c", f"cat >> {self.datadir}/postgresql.conf <<'EOF'\n{text}EOF"])

    def standby(self) -> Cluster:
        """A started streaming standby of this cluster (pg_basebackup -R), its
        application_name `standby`, so a synchronous primary waits for it."""
        standby = Cluster(_scratch(), free_port())
        _run([str(self.bins / "pg_basebackup"), "-h", "127.0.0.1", "-p", str(self.port),
              "-U", "postgres", "-D", str(standby.datadir), "-R", "-X", "stream",
              "--no-sync"])
        standby._append_conf([
            f"port = {standby.port}", f"unix_socket_directories = '{standby.root}'",
            "primary_conninfo = 'host=127.0.0.1 port="
            f"{self.port} user=postgres application_name=standby'",
            # Promoted, it has no standby of its own to wait for (the copied
            # configuration names the primary's).
            "synchronous_standby_names = ''",
        ])
        standby.start()
        return standby

    def start(self) -> None:
        self._pg_ctl("-l", str(self.root / "log"), "start")

    def stop(self, mode: str = "fast") -> None:
        self._pg_ctl("-m", mode, "stop")

    def restart(self, mode: str = "fast") -> None:
        """Restarts it; returns once it accepts connections again."""
        self._pg_ctl("-m", mode, "-l", str(self.root / "log"), "restart")

    def promote(self) -> None:
        """Promotes this standby; returns once it accepts writes."""
        self._pg_ctl("promote")
        deadline = time.monotonic() + 30
        while True:
            with psycopg.connect(self.url, autocommit=True) as conn:
                row = conn.execute("SELECT pg_is_in_recovery()").fetchone()
            if row == (False,):
                return
            assert time.monotonic() < deadline, "the standby was not promoted in 30 s"
            time.sleep(0.05)

    def install(self) -> None:
        """Migrates its `postgres` database and loads the example schema (invoices)."""
        db.migrate(self.url)
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(db.SQL_DIR.joinpath("triggers", "example_invoices.sql").read_bytes())

    def destroy(self) -> None:
        """Stops it (if running) and removes its files."""
        if (self.datadir / "postmaster.pid").exists():
            with contextlib.suppress(RuntimeError):
                self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.destroy()
