"""An API address already in use stops `webhooks api`, `webhooks run` and `webhooks dev`
(what `make run` runs) at once, with one clear line: before, uvicorn's bind exited from
inside its task, `make run` printed its banner (its curl line reaching the other process),
went on without an API, and could hang on shutdown."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.parametrize("command", ["api", "run", "dev"])
def test_an_address_in_use_stops_the_command_with_a_clear_message(
        db_url: str, tmp_path: Path, command: str) -> None:
    with socket.socket() as busy:
        busy.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        argv = [sys.executable, "-m", "service", command, "--host", "127.0.0.1",
                "--port", str(port)]
        if command == "dev":
            argv += ["--token-file", str(tmp_path / "token")]
        done = subprocess.run(argv, env={**os.environ, "DATABASE_URL": db_url},
                              capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert f"cannot listen on 127.0.0.1:{port}: Address already in use" in done.stderr
    assert "choose another port with --port" in done.stderr
    assert "Traceback" not in done.stderr and "never retrieved" not in done.stderr
    assert "Bearer" not in done.stdout  # no banner pointing at the other process
    assert not (tmp_path / "token").exists()
