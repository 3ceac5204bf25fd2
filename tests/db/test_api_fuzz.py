"""Property-based: whatever a client sends, the API answers without a 5xx, and every error
is {"error": str}. The app runs under uvicorn in a thread; requests go over real HTTP."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote, urlencode

import httpx
import psycopg
import pytest
import uvicorn
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from service import tokens
from service.api.app import create_app
from service.config import Settings


@pytest.fixture
def base_url(db_url: str) -> Iterator[str]:
    """The API on a free port, served from its own thread and event loop."""
    app = create_app(Settings(database_url=db_url, allow_private_targets=False,
                              verify_timeout=1.0))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_config=None,
                                           access_log=False))
    thread = threading.Thread(target=lambda: asyncio.run(server.serve()), daemon=True)
    thread.start()
    deadline = time.monotonic() + 15
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(15)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner,
                                                                max_size=4),
    max_leaves=12,
)
resources = st.sampled_from(["invoices", "payments", "", "invoices\x00"]) | st.text(max_size=12)
event_strings = st.sampled_from(["create", "invoice.create", "destroy, update",
                                 "payment.destroy", " , ", "x.y.z"]) | st.text(max_size=20)
targets = st.sampled_from(["http://127.0.0.1:1/", "http://10.0.0.1/", "ftp://x/",
                           "http://u@h/", "http://[::1]/", "http://2130706433/"]) | \
    st.text(max_size=20)
create_bodies = st.fixed_dictionaries(
    {}, optional={"resource": resources | json_values, "events": event_strings | json_values,
                  "target": targets | json_values, "active": json_values})
update_bodies = st.fixed_dictionaries(
    {}, optional={"active": st.booleans() | json_values, "id": json_values,
                  "events": event_strings, "resource": resources, "target": targets,
                  "secret": st.text(max_size=5)})
bodies = (
    create_bodies.map(lambda b: json.dumps(b).encode())
    | update_bodies.map(lambda b: json.dumps(b).encode())
    | json_values.map(lambda v: json.dumps(v).encode())
    | st.binary(max_size=64)
    | st.just(b"")
)
paths = st.sampled_from(["/api/v1/webhooks", "/api/v1/webhooks/", "/api/v1/hook_events",
                         "/api/v1/hook_events/", "/healthz", "/readyz", "/", "/api/v1"]) | \
    st.builds(lambda s, tail: f"/api/v1/webhooks/{quote(s, safe='')}{tail}",
              st.text(max_size=25) | st.integers().map(str), st.sampled_from(["", "/"])) | \
    st.text(max_size=30).map(lambda s: "/" + quote(s, safe="/"))
queries = st.dictionaries(st.sampled_from(["limit", "after", "active", "resource", "x"]),
                          st.text(max_size=12) | st.integers().map(str), max_size=4)
header_text = st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=60)


@pytest.mark.timeout(600)
def test_no_input_produces_a_server_error(db_url: str, base_url: str) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        token = tokens.create(conn, "fuzz")[1]
    auths = st.sampled_from([f"Bearer {token}", f"bearer {token}", "Bearer wht_x", None]) | \
        header_text.map(lambda t: "Bearer " + t)
    with httpx.Client(base_url=base_url, timeout=30) as http:

        @settings(max_examples=200, deadline=None,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
        @given(method=st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"]),
               path=paths, query=queries, body=bodies, auth=auths,
               content_type=st.sampled_from(["application/json", "text/plain", "", None]) |
               header_text)
        def check(method: str, path: str, query: dict[str, str], body: bytes,
                  auth: str | None, content_type: str | None) -> None:
            headers: dict[str, Any] = {}
            if auth is not None:
                headers["Authorization"] = auth
            if content_type is not None:
                headers["Content-Type"] = content_type
            url = path + ("?" + urlencode(query) if query else "")
            try:
                response = http.request(method, url, content=body or None, headers=headers)
            except httpx.LocalProtocolError:
                return  # the client itself refused to send this (bad header syntax)
            assert response.status_code < 500, (method, url, body, response.text)
            if response.status_code >= 400:
                data = response.json()
                assert isinstance(data, dict) and set(data) == {"error"}, data
                assert isinstance(data["error"], str) and data["error"]

        check()
