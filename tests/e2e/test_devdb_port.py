"""`make run DB_PORT=P` starts its private cluster on P, and `make demo` and `make status`
(devdb exec without a port) find it there, while it runs and after it stopped."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from service.commands import devdb
from tests.support.net import free_port

SHOW_PORT = ("import os, psycopg; url = os.environ['DATABASE_URL']; "
             "print(url, psycopg.connect(url).execute('SHOW port').fetchone()[0], flush=True)")


def _has_server_binaries() -> bool:
    try:
        devdb.bindir()
    except RuntimeError:
        return False
    return True


pytestmark = pytest.mark.skipif(not _has_server_binaries(),
                                reason="needs the PostgreSQL server binaries (initdb)")


@pytest.fixture
def datadir() -> Iterator[Path]:
    """Where a private cluster lives (a folder the `postgres` user may enter)."""
    parent = Path(tempfile.mkdtemp(prefix="devdb-", dir="/tmp"))
    parent.chmod(0o755)
    path = parent / ".pgdata"
    try:
        yield path
    finally:
        devdb.stop(path, "immediate")
        shutil.rmtree(path.resolve(), ignore_errors=True)
        shutil.rmtree(parent, ignore_errors=True)


def devdb_exec(datadir: Path, *argv: str, port: int | None = None, **kwargs: object
               ) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    command = [sys.executable, "-m", "service.commands.devdb", "exec", "--datadir",
               str(datadir), *(["--port", str(port)] if port else []), "--", *argv]
    return subprocess.Popen(command, env=env, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, **kwargs)  # type: ignore[call-overload]


def run(datadir: Path, *argv: str, port: int | None = None) -> tuple[int, str, str]:
    proc = devdb_exec(datadir, *argv, port=port)
    out, err = proc.communicate(timeout=120)
    return proc.returncode, out, err


def test_make_run_takes_a_database_port_that_demo_and_status_find(datadir: Path) -> None:
    port = free_port()
    # `make run DB_PORT=port`: a command that holds the cluster until its stdin closes.
    holder = devdb_exec(datadir, sys.executable, "-c", SHOW_PORT + "; import sys; "
                        "sys.stdin.read()", port=port, stdin=subprocess.PIPE)
    try:
        assert holder.stdout is not None
        line = holder.stdout.readline()
        assert line.split() == [devdb.private_url(port), str(port)], holder.stderr
        # `make status`, `make demo`: no port given, the running cluster is found.
        code, out, err = run(datadir, sys.executable, "-c", SHOW_PORT)
        assert code == 0, err
        assert out.split() == [devdb.private_url(port), str(port)]
        # Another port asked for while it runs: refused, saying where it runs.
        code, out, err = run(datadir, "true", port=free_port())
        assert code == 1
        assert f"already runs on port {port}" in err
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(60)
    assert devdb.running_port(datadir) is None  # stopped with the command that started it
    # Stopped, it starts again on the port it last ran on.
    code, out, err = run(datadir, sys.executable, "-c", SHOW_PORT)
    assert code == 0, err
    assert out.split() == [devdb.private_url(port), str(port)]
