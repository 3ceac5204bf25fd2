"""A private PostgreSQL cluster in .pgdata/ for `make run` and `make test` on machines
without one, started from the installed server binaries (as the `postgres` OS user when
the caller is root, since initdb refuses root)."""

from __future__ import annotations

import glob
import hashlib
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import psycopg

PRIVATE_PORT = 54329
SHARED_URL = "postgresql://postgres@127.0.0.1:5432/postgres"


def private_url(port: int = PRIVATE_PORT) -> str:
    """The URL of the private cluster's maintenance database."""
    return f"postgresql://postgres@127.0.0.1:{port}/postgres"


def answers(url: str, timeout: float = 2.0) -> bool:
    """Whether a server accepts a connection at `url`."""
    try:
        with psycopg.connect(url, connect_timeout=max(1, int(timeout))):
            return True
    except psycopg.Error:
        return False


def bindir() -> Path:
    """The directory of the PostgreSQL server binaries (initdb, pg_ctl)."""
    candidates: list[Path] = []
    pg_config = shutil.which("pg_config")
    if pg_config:
        out = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True)
        if out.returncode == 0:
            candidates.append(Path(out.stdout.strip()))
    def major(path: str) -> int:
        name = Path(path).parent.name
        return int(name) if name.isdigit() else 0

    versions = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=major, reverse=True)
    candidates += [Path(p) for p in versions]
    if shutil.which("initdb"):
        candidates.append(Path(shutil.which("initdb") or "").parent)
    for path in candidates:
        if (path / "initdb").exists() and (path / "pg_ctl").exists():
            return path
    raise RuntimeError(
        "no PostgreSQL server binaries found (looked in `pg_config --bindir` and "
        "/usr/lib/postgresql/*/bin): install the PostgreSQL server, or set DATABASE_URL"
    )


def _as_server_user(argv: Sequence[str]) -> list[str]:
    """The command, run as the `postgres` OS user when we are root."""
    if os.geteuid() != 0:
        return list(argv)
    runuser = shutil.which("runuser")
    if runuser:
        return [runuser, "-u", "postgres", "--", *argv]
    return ["su", "postgres", "-s", "/bin/sh", "-c", " ".join(_quote(a) for a in argv)]


def _quote(arg: str) -> str:
    return "'" + arg.replace("'", "'\\''") + "'"


def _run(argv: Sequence[str]) -> None:
    result = subprocess.run(_as_server_user(argv), capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed:\n{result.stdout}{result.stderr}")


def _server_can_reach(directory: Path) -> bool:
    """Whether the `postgres` OS user can enter `directory` (every parent must let it)."""
    return subprocess.run(_as_server_user(["test", "-x", str(directory)]),
                          capture_output=True).returncode == 0


def _place(datadir: Path) -> Path:
    """The data directory to use, made reachable for the `postgres` user when we are root.

    A checkout under a directory the `postgres` user cannot enter (/root, a mktemp -d
    folder) cannot hold its cluster: the data then lives in /var/tmp and `datadir` becomes
    a symbolic link to it, so it is still found (and kept) at the same place.
    """
    if os.geteuid() != 0 or datadir.exists() or datadir.is_symlink():
        return datadir.resolve()
    parent = datadir.absolute().parent
    parent.mkdir(parents=True, exist_ok=True)
    if _server_can_reach(parent):
        return datadir.absolute()
    digest = hashlib.sha1(str(datadir.absolute()).encode()).hexdigest()[:12]
    real = Path("/var/tmp") / f"pg-webhooks-{digest}"
    real.mkdir(mode=0o700, exist_ok=True)
    datadir.symlink_to(real, target_is_directory=True)
    print(f"devdb: the postgres user cannot enter {parent}; keeping the cluster in {real} "
          f"({datadir} links to it)", file=sys.stderr)
    return real


def start(datadir: Path, port: int = PRIVATE_PORT) -> bool:
    """Initialises (once) and starts the cluster; returns False if it was already running."""
    if answers(private_url(port)):
        return False
    bins = bindir()
    datadir = _place(datadir)
    if not (datadir / "PG_VERSION").exists():
        datadir.mkdir(mode=0o700, parents=True, exist_ok=True)
        if os.geteuid() == 0:
            shutil.chown(datadir, "postgres", "postgres")
        print(f"devdb: creating a private cluster in {datadir}", file=sys.stderr)
        _run([str(bins / "initdb"), "-D", str(datadir), "-U", "postgres", "--auth=trust",
              "--encoding=UTF8", "--no-instructions"])
    print(f"devdb: starting PostgreSQL on 127.0.0.1:{port}", file=sys.stderr)
    _run([str(bins / "pg_ctl"), "-D", str(datadir), "-l", str(datadir / "server.log"), "-w",
          "-t", "60", "-o",
          f"-p {port} -c listen_addresses=127.0.0.1 -c unix_socket_directories=''", "start"])
    return True


def running_port(datadir: Path) -> int | None:
    """The port the cluster in `datadir` runs on (its postmaster.pid's fourth line), or
    None when it does not run."""
    try:
        lines = (datadir.resolve() / "postmaster.pid").read_text().splitlines()
        return int(lines[3])
    except (OSError, IndexError, ValueError):
        return None


def last_port(datadir: Path) -> int | None:
    """The port the cluster in `datadir` was last started on (PostgreSQL keeps the
    command line in postmaster.opts), or None."""
    try:
        opts = (datadir.resolve() / "postmaster.opts").read_text()
    except OSError:
        return None
    found = re.search(r'"-p" "(\d+)"', opts)
    return int(found.group(1)) if found else None


def cluster_port(datadir: Path, asked: int | None = None) -> int:
    """The port of the private cluster: `asked` (`make run DB_PORT=...`), else the one it
    runs on, else the one it last ran on, else PRIVATE_PORT. So `make demo` and `make
    status` find the cluster `make run DB_PORT=...` started, and a later `make run` starts
    it on the same port again."""
    running = running_port(datadir)
    if asked is not None:
        if running is not None and running != asked and answers(private_url(running)):
            raise SystemExit(
                f"devdb: the private cluster in {datadir} already runs on port {running}: "
                "stop what runs it first, or leave DB_PORT out to use it there")
        return asked
    return running or last_port(datadir) or PRIVATE_PORT


def stop(datadir: Path, mode: str = "fast") -> None:
    """Stops the cluster if it runs (`mode`: smart, fast or immediate, as pg_ctl has them)."""
    datadir = datadir.resolve()
    if not (datadir / "postmaster.pid").exists():
        return
    print("devdb: stopping PostgreSQL", file=sys.stderr)
    _run([str(bindir() / "pg_ctl"), "-D", str(datadir), "-m", mode, "-w", "stop"])


def restart(datadir: Path, port: int = PRIVATE_PORT, mode: str = "fast") -> None:
    """Stops and starts the cluster again, on the same port."""
    stop(datadir, mode)
    start(datadir, port)


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m service.commands.devdb exec [--shared-ok] [--port P] -- CMD...`: runs
    CMD with a DATABASE_URL.

    DATABASE_URL from the environment wins; with --shared-ok a server answering on
    127.0.0.1:5432 is used next; otherwise the private cluster in .pgdata/ (on --port, or
    where it runs, see cluster_port) is used, started first when it does not run, and
    stopped again when CMD ends.
    """
    import argparse

    parser = argparse.ArgumentParser(prog="python -m service.commands.devdb")
    sub = parser.add_subparsers(dest="command", required=True)
    ex = sub.add_parser("exec", help="run a command with DATABASE_URL pointing at a server")
    ex.add_argument("--shared-ok", action="store_true",
                    help="use the server on 127.0.0.1:5432 when it answers")
    ex.add_argument("--datadir", default=".pgdata")
    ex.add_argument("--port", type=int, default=None,
                    help="the private cluster's port (default: the one it runs or last ran "
                         f"on, else {PRIVATE_PORT})")
    ex.add_argument("cmd", nargs=argparse.REMAINDER)
    sub.add_parser("stop", help="stop the private cluster").add_argument("--datadir",
                                                                         default=".pgdata")
    args = parser.parse_args(argv)
    if args.command == "stop":
        stop(Path(args.datadir))
        return 0

    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        parser.error("exec needs a command after --")
    env = dict(os.environ)
    started = False
    if not env.get("DATABASE_URL"):
        if args.shared_ok and answers(SHARED_URL):
            env["DATABASE_URL"] = SHARED_URL
        else:
            port = cluster_port(Path(args.datadir), args.port)
            started = start(Path(args.datadir), port)
            env["DATABASE_URL"] = private_url(port)
    proc = subprocess.Popen(cmd, env=env)
    # SIGTERM (not only Ctrl-C) ends the command first, then the cluster we started.
    signal.signal(signal.SIGTERM, lambda *_: proc.terminate())
    try:
        while True:
            try:
                return proc.wait()
            except KeyboardInterrupt:
                # The child got the same Ctrl-C; wait for it to finish shutting down.
                continue
    finally:
        if started:
            stop(Path(args.datadir))


if __name__ == "__main__":
    raise SystemExit(main())
