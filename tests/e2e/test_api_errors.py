"""Authentication, every error shape, body limits, health checks and the OpenAPI document."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import httpx
import psycopg
import pytest
from litestar import get

from service import store, tokens
from service.api.app import create_app
from service.config import Settings
from tests.support.api import Api, assert_error, serving

ROUTES = [("GET", "/api/v1/webhooks"), ("POST", "/api/v1/webhooks/"),
          ("GET", "/api/v1/webhooks/1"), ("PUT", "/api/v1/webhooks/1/"),
          ("DELETE", "/api/v1/webhooks/1"), ("GET", "/api/v1/hook_events"),
          # Routes with a body: the token is checked before the body is read.
          ("POST", "/api/v1/webhooks/1/backfill"), ("POST", "/api/v1/webhooks/1/recover")]


async def test_requests_without_a_valid_token_are_401(api: Api) -> None:
    with psycopg.connect(api.db_url, autocommit=True) as conn:
        revoked_id, revoked = tokens.create(conn, "alice")
        tokens.revoke(conn, revoked_id)
    bad_headers: list[dict[str, str]] = [
        {}, {"Authorization": ""}, {"Authorization": "Bearer"}, {"Authorization": "Bearer  x"},
        {"Authorization": f"Basic {api.token}"}, {"Authorization": api.token},
        {"Authorization": "Bearer wht_" + "A" * 43}, {"Authorization": "Bearer nonsense"},
        {"Authorization": f"Bearer {api.token}x"}, {"Authorization": f"Bearer {revoked}"},
        {"Authorization": "Bearer " + "x" * 5000}, {"X-Token": api.token},
    ]
    for method, path in ROUTES:
        for headers in bad_headers:
            response = await api.http.request(method, path, headers=headers,
                                              json={"active": True})
            assert_error(response, 401)
            assert response.headers["www-authenticate"].startswith("Bearer")
    ok = await api.http.get("/api/v1/webhooks", headers={"Authorization": f"bearer  {api.token}"})
    assert ok.status_code == 200


async def test_malformed_bodies_are_400(api: Api) -> None:
    # Each form of a bad body, for every body type: tests/unit/test_bodies.py.
    cases: list[tuple[bytes, str]] = [
        (b"", "empty"), (b"{", "not valid JSON"), (b"[1, 2]", "JSON object, not an array"),
        (b"\xff\xfe{}", "JSON"), (b"[" * 20000 + b"]" * 20000, "JSON"), (b'{"a": 1e999999}', ""),
    ]
    for path, method in (("/api/v1/webhooks", "POST"), ("/api/v1/webhooks/1", "PUT")):
        for raw, fragment in cases:
            response = await api.request(method, path, content=raw)
            assert_error(response, 400, fragment)


async def test_field_errors_name_the_field(api: Api) -> None:
    good = {"resource": "invoices", "events": "create", "target": api.receiver.url}
    # Every field's errors, for every body type: tests/unit/test_bodies.py.
    cases: list[tuple[dict[str, Any], str]] = [
        ({k: v for k, v in good.items() if k != "events"}, "missing field 'events'"),
        ({**good, "secret": "whsec_abc"}, "unknown field 'secret'"),
        ({**good, "events": None}, "'events' must be a string or an array of strings, not null"),
        ({**good, "resource": "invoices\x00"}, "NUL"),
        ({**good, "resource": "x" * 60000}, "unknown resource"),
    ]
    for body, fragment in cases:
        assert_error(await api.request("POST", "/api/v1/webhooks", json=body), 400, fragment)
    assert api.receiver.received == []


async def test_body_over_64_kib_is_413(api: Api) -> None:
    big = json.dumps({"resource": "invoices", "events": "create", "target": "x" * 70000})
    for method, path in (("POST", "/api/v1/webhooks"), ("PUT", "/api/v1/webhooks/1")):
        assert_error(await api.request(method, path, content=big), 413, "65536")

        async def chunks() -> AsyncIterator[bytes]:
            for _ in range(20):
                yield b" " * 4096

        # Without Content-Length the limit is enforced while reading.
        assert_error(await api.request(method, path, content=chunks()), 413)
    exact = b" " * 65000 + b"{}"
    assert_error(await api.request("POST", "/api/v1/webhooks", content=exact), 400, "missing")


async def test_wrong_method_is_405_and_unknown_path_404(api: Api) -> None:
    for method, path in (("PATCH", "/api/v1/webhooks/1"), ("DELETE", "/api/v1/webhooks"),
                         ("PUT", "/api/v1/webhooks/"), ("POST", "/api/v1/webhooks/1"),
                         ("POST", "/api/v1/hook_events"), ("POST", "/healthz")):
        response = await api.request(method, path)
        assert_error(response, 405, method)
        assert "GET" in response.headers["allow"]
    for path in ("/nothing", "/api", "/api/v1", "/api/v2/webhooks", "/api/v1/webhooks/1/x",
                 "/api/v1/hook_events/1", "/%ff", "/api/v1/webhooks/%00/"):
        response = await api.request("GET", path)
        assert_error(response, 404)


async def test_unexpected_errors_are_500_without_details(db_url: str,
                                                         caplog: pytest.LogCaptureFixture
                                                         ) -> None:
    @get("/boom")
    async def boom() -> None:
        raise RuntimeError("whsec_c2VjcmV0 at /very/secret/path")

    settings = Settings(database_url=db_url)
    app = create_app(settings)
    app.register(boom)
    with caplog.at_level(logging.ERROR):
        async with serving(settings, app=app) as url, httpx.AsyncClient(base_url=url) as http:
            response = await http.get("/boom")
    assert_error(response, 500, "internal error")
    assert "whsec_" not in response.text and "Traceback" not in response.text
    assert "RuntimeError" in caplog.text and "whsec_c2VjcmV0" not in caplog.text


async def test_health_checks_need_no_token(api: Api) -> None:
    health = await api.http.get("/healthz")
    assert health.status_code == 200 and health.json() == {"status": "ok"}
    ready = await api.http.get("/readyz/")
    assert ready.status_code == 200 and ready.json() == {"status": "ok"}


async def test_readyz_is_503_when_the_database_is_unreachable(db_url: str) -> None:
    pool = store.make_pool(db_url)
    await pool.open(wait=True)
    settings = Settings(database_url=db_url)
    async with serving(settings, pool=pool) as url, httpx.AsyncClient(base_url=url) as http:
        await pool.close()
        assert_error(await http.get("/readyz"), 503, "database")
        response = await http.get("/api/v1/webhooks", headers={"Authorization": "Bearer " +
                                                               tokens.new_token()})
        assert_error(response, 503, "database")
        assert (await http.get("/healthz")).status_code == 200


async def test_openapi_document(api: Api) -> None:
    response = await api.http.get("/schema/openapi.json")
    assert response.status_code == 200
    doc = response.json()
    paths = doc["paths"]
    assert set(paths) >= {"/api/v1/webhooks", "/api/v1/webhooks/{webhook_id}",
                          "/api/v1/hook_events", "/healthz", "/readyz"}
    assert set(paths["/api/v1/webhooks"]) >= {"get", "post"}
    assert set(paths["/api/v1/webhooks/{webhook_id}"]) >= {"get", "put", "delete"}
    schemas = doc["components"]["schemas"]
    assert schemas["ErrorBody"]["properties"] == {"error": {"type": "string"}}
    assert set(schemas["Subscription"]["properties"]) == {
        "id", "resource", "events", "target", "active", "last_status", "last_success_at",
        "last_failure_at", "last_failure_content", "filter", "ordering", "inactive_reason",
        "rate_limit"}
    for method, name in (("post", "CreateSubscription"), ("put", "UpdateSubscription")):
        operation = paths["/api/v1/webhooks" + ("/{webhook_id}" if method == "put" else "")]
        body = operation[method]["requestBody"]["content"]["application/json"]["schema"]
        assert body == {"$ref": f"#/components/schemas/{name}"}
        assert schemas[name]["title"] == name and schemas[name]["additionalProperties"] is False
    assert doc["components"]["securitySchemes"]["BearerToken"]["scheme"] == "bearer"
    for path in paths.values():
        for operation in path.values():
            for code, answer in operation["responses"].items():
                if code.startswith(("4", "5")):
                    schema = answer["content"]["application/json"]["schema"]
                    assert schema == {"$ref": "#/components/schemas/ErrorBody"}, (code, answer)
    assert "detail" not in json.dumps(schemas)
    docs = await api.http.get("/schema")
    assert docs.status_code == 200 and "<html" in docs.text.lower()


async def test_no_secret_or_token_reaches_a_log_record(api: Api,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG):
        created = await api.create()
        await api.request("PUT", f"/api/v1/webhooks/{created['id']}", json={"active": False})
        await api.request("GET", "/api/v1/webhooks", token="wht_" + "B" * 43)
        await api.request("POST", "/api/v1/webhooks", content=b"{bad json")
    sent = [r.headers["x-hook-secret"] for r in api.receiver.received]
    text = "\n".join(f"{r.getMessage()} {r.__dict__}" for r in caplog.records)
    assert sent and not any(secret in text for secret in sent)
    assert api.token not in text and "wht_BBBB" not in text
