"""What users install is what must work: the built wheel, installed into a fresh virtualenv
outside the checkout, migrates a new database, creates a token and serves the API."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import time
import zipfile
from pathlib import Path

import httpx
import pytest

from tests.support.net import free_port

CHECKOUT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The `webhooks` command of a venv where the wheel is installed (not editable)."""
    root = tmp_path_factory.mktemp("installed")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(root / "dist"), str(CHECKOUT)], check=True, timeout=300)
    [wheel] = (root / "dist").glob("*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "service/migrations/0001.initial.sql" in names
    assert "service/sql/queries/api.sql" in names
    assert "service/sql/triggers/capture.sql" in names
    assert "service/sql/replaceable.txt" in names
    # The schema dump is the tests' (tests/schema.dump.sql), not the service's.
    assert not any(name.endswith("schema.dump.sql") for name in names)
    assert {f"service/api/apidocs/static/{name}" for name in (
        "swagger-ui-bundle.js", "swagger-ui.css", "init.js", "swagger-ui.LICENSE.txt")
        } <= set(names)
    assert {f"service/api/dashboard/static/{name}" for name in (
        "index.html", "app.js", "api.js", "view.js", "payload.js", "dashboard.css",
        "favicon.svg")} <= set(names)
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path("
                           "'purelib'))"], capture_output=True, text=True, check=True
                          ).stdout.strip()
    # The dependencies come from the test environment's site-packages, appended to the
    # path (a plain path line: its own .pth files, the checkout's editable finder among
    # them, are not run); the service itself only from the wheel.
    Path(site, "deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install",
                    "--no-deps", "-q", str(wheel)], check=True, timeout=300)
    return venv / "bin" / "webhooks"


def run(command: list[str], env: dict[str, str], cwd: Path) -> str:
    result = subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout



def test_the_installed_wheel_migrates_creates_a_token_and_serves(
        installed: Path, empty_db: str, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WEBHOOKS_")}
    env["DATABASE_URL"] = empty_db
    env.pop("PYTHONPATH", None)
    where = run([str(installed.parent / "python"), "-c",
                 "import service, service.db; print(service.__file__, service.db.SQL_DIR)"],
                env, tmp_path)
    assert str(CHECKOUT) not in where, where
    out = run([str(installed), "migrate"], env, tmp_path)
    assert out.startswith("applied ") and "0001.initial" in out
    assert run([str(installed), "migrate"], env, tmp_path).strip() == "database is up to date"
    token = run([str(installed), "token", "create", "--owner", "pkg"], env,
                tmp_path).strip().splitlines()[-1]
    port = free_port()
    server = subprocess.Popen([str(installed), "api", "--port", str(port)], env=env,
                              cwd=tmp_path, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                health = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2)
                break
            except httpx.TransportError:
                assert server.poll() is None, server.stderr.read() if server.stderr else ""
                assert time.monotonic() < deadline, "the API did not start"
                time.sleep(0.1)
        assert health.status_code == 200
        listed = httpx.get(f"http://127.0.0.1:{port}/api/v1/webhooks",
                           headers={"Authorization": f"Bearer {token}"}, timeout=5)
        assert listed.status_code == 200 and listed.json() == []
        # The API documentation's files come from the installed package.
        docs = httpx.get(f"http://127.0.0.1:{port}/schema/static/swagger-ui-bundle.js",
                         timeout=5)
        assert docs.status_code == 200 and len(docs.content) > 1_000_000
    finally:
        server.terminate()
        server.wait(timeout=30)
