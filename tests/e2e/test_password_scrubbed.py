"""No message, log line or error of the commands, the API or the worker holds the password
of DATABASE_URL, nor any part of it four characters long or longer: a malformed URL, a
URL whose password libpq reads as part of the host, at start-up and while waiting."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.support.net import free_port

PASSWORD = "Sup3r%zzS3cret"
# libpq refuses the percent-encoding; everything else is well formed.
MALFORMED = f"postgresql://app:{PASSWORD}@127.0.0.1:5432/app"
# An unencoded @ in the password: libpq takes what follows the first @ for the host, and
# quotes it when it cannot resolve it.
SPLIT = "postgresql://app:Sup3rS3cr@et99S3cret@127.0.0.1:{port}/app"


def parts(secret: str) -> list[str]:
    return [secret[i:j] for i in range(len(secret)) for j in range(i + 4, len(secret) + 1)]


def assert_no_part(text: str, secret: str) -> None:
    leaked = [p for p in parts(secret) if p in text]
    assert not leaked, (leaked, text)


def webhooks(url: str, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "service", *argv],
                          env={**os.environ, "DATABASE_URL": url}, capture_output=True,
                          text=True, timeout=60)


@pytest.mark.parametrize("argv", [["status"], ["migrate"], ["token", "list"], ["worker"],
                                  ["api", "--port", "0"]])
def test_a_malformed_url_is_refused_without_its_password(argv: list[str]) -> None:
    done = webhooks(MALFORMED, *argv)
    assert done.returncode != 0
    assert "DATABASE_URL is not a valid PostgreSQL URI" in done.stderr
    assert "percent-encoded" in done.stderr
    assert_no_part(done.stdout + done.stderr, PASSWORD)


def test_the_cli_never_echoes_a_part_of_the_password() -> None:
    url = SPLIT.format(port=free_port())
    secret = "Sup3rS3cr@et99S3cret"
    for argv in (["status"], ["deliveries", "show", "1"], ["migrate"]):
        done = webhooks(url, *argv)
        assert done.returncode != 0
        assert "webhooks" in done.stderr
        assert_no_part(done.stdout + done.stderr, secret)


def run_until(argv: list[str], env: dict[str, str], log: Path, fragment: str,
              timeout: float = 30.0) -> str:
    """Runs the command until its output holds `fragment` (polled), then stops it."""
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "service", *argv],
                                env={**os.environ, **env}, stdout=out,
                                stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + timeout
        while fragment not in log.read_text(errors="replace"):
            assert proc.poll() is None, log.read_text(errors="replace")
            assert time.monotonic() < deadline, log.read_text(errors="replace")
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return log.read_text(errors="replace")


def test_the_worker_waiting_for_the_database_never_logs_the_password(tmp_path: Path) -> None:
    secret = "Sup3rS3cr@et99S3cret"
    for fmt in ("text", "json"):
        env = {"DATABASE_URL": SPLIT.format(port=free_port()), "WEBHOOKS_LOG_FORMAT": fmt}
        text = run_until(["worker"], env, tmp_path / f"worker-{fmt}.log", "next try in 2s")
        assert "waiting for the database" in text
        assert "resolve host" in text  # libpq quoted the "host": what followed the @
        assert_no_part(text, secret)


def test_the_api_never_logs_or_answers_the_password(tmp_path: Path) -> None:
    secret = "Sup3rS3cr@et99S3cret"
    port = free_port()
    log = tmp_path / "api.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "service", "api", "--port", str(port)],
            env={**os.environ, "DATABASE_URL": SPLIT.format(port=free_port())}, stdout=out,
            stderr=subprocess.STDOUT)
    bodies = []
    try:
        deadline = time.monotonic() + 30
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=15) as http:
            while True:
                try:
                    if http.get("/healthz").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert proc.poll() is None, log.read_text()
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.05)
            for path in ("/readyz", "/api/v1/webhooks", "/api/v1/hook_events"):
                response = http.get(path, headers={"Authorization": "Bearer wht_x"})
                assert response.status_code == 503
                bodies.append(response.text)
            # The pool's own failures to connect are logged too, in time.
            while "resolve host" not in log.read_text(errors="replace"):
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    assert_no_part(log.read_text(errors="replace") + "".join(bodies), secret)
