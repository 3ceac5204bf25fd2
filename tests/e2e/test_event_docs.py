"""The OpenAPI document's `webhooks`: with a valid token, one POST per public event with
its body's schema and the signature headers; without one, no table's columns, and the
document is served while the database is down."""

from __future__ import annotations

import json
import time

import httpx
import jsonschema
import psycopg

from service.config import Settings
from tests.e2e.test_event_schemas import ROWS, errors, make_kinds
from tests.support.api import Api, serving
from tests.support.net import free_port
from tests.support.worker import poll, running_worker

HEADERS = {"webhook-id", "webhook-timestamp", "webhook-signature", "X-Hook-Signature"}
# Columns of the example tables and of the one made below, which only a token may see.
COLUMNS = ["card_token", "invoice_id", "company_id", "updated_by", "colour_of_mood"]


async def test_with_a_token_every_public_event_is_a_webhook(api: Api) -> None:
    with psycopg.connect(api.db_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE moods (id int PRIMARY KEY, colour_of_mood text NOT NULL)")
        conn.execute("SELECT webhooks.attach('moods', resource => 'moods', noun => 'mood')")
        conn.execute("SELECT webhooks.attach('moods', resource => 'moods', noun => 'mood',"
                     " public => false)")
    listed = (await api.request("GET", "/api/v1/hook_events")).json()
    events = {e["event"]: e["schema"] for e in listed}
    assert "mood.create" not in events  # private: neither listed nor documented
    response = await api.request("GET", "/schema/openapi.json")
    assert response.status_code == 200
    document = response.json()
    assert document["openapi"].startswith("3.1")
    hooks = document["webhooks"]
    assert set(events) <= set(hooks)
    assert set(hooks) - set(events) == {"webhook.test", "invoice.snapshot",
                                        "payment.snapshot"}
    for name, path_item in hooks.items():
        assert set(path_item) == {"post"}, name
        post = path_item["post"]
        headers = {p["name"] for p in post["parameters"] if p["in"] == "header"}
        assert headers == HEADERS and all(p["required"] for p in post["parameters"])
        schema = post["requestBody"]["content"]["application/json"]["schema"]
        jsonschema.Draft202012Validator.check_schema(schema)
        assert schema == events.get(name, schema), name
        assert "2XX" in post["responses"], name
    payment = hooks["payment.create"]["post"]["requestBody"]["content"]["application/json"]
    assert "card_token" not in payment["schema"]["properties"]["resource"]["properties"]
    assert "invoice_id" in payment["schema"]["properties"]["resource"]["properties"]
    assert "mood.create" not in hooks and "colour_of_mood" not in response.text
    # The rest of the document is the one served without a token.
    public = (await api.http.get("/schema/openapi.json")).json()
    assert {k: v for k, v in document.items() if k != "webhooks"} == public


async def test_without_a_valid_token_no_table_is_named(api: Api) -> None:
    with psycopg.connect(api.db_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE moods (id int PRIMARY KEY, colour_of_mood text NOT NULL)")
        conn.execute("SELECT webhooks.attach('moods', resource => 'moods', noun => 'mood')")
    for headers in ({}, {"Authorization": "Bearer not-a-token"},
                    {"Authorization": "Basic abc"}):
        response = await api.http.get("/schema/openapi.json", headers=headers)
        assert response.status_code == 200, headers
        assert "webhooks" not in response.json()
        for column in COLUMNS:
            assert column not in response.text, (headers, column)
    revoked = api.new_token("bob")
    api.sql("UPDATE webhooks.tokens SET revoked_at = now() WHERE owner = 'bob'")
    response = await api.request("GET", "/schema/openapi.json", token=revoked)
    assert "webhooks" not in response.json()


async def test_the_document_is_served_while_the_database_is_down() -> None:
    settings = Settings(database_url=f"postgresql://postgres@127.0.0.1:{free_port()}/none",
                        db_connect_timeout=1.0)
    async with serving(settings) as url, httpx.AsyncClient(base_url=url, timeout=30) as http:
        for headers in ({}, {"Authorization": "Bearer wht_" + "a" * 43}):
            started = time.monotonic()
            response = await http.get("/schema/openapi.json", headers=headers)
            assert response.status_code == 200, response.text
            assert "webhooks" not in response.json()
            assert "/api/v1/hook_events" in response.json()["paths"]
            assert time.monotonic() - started < 10


async def test_backfill_snapshots_validate_against_their_documented_schema(api: Api) -> None:
    with psycopg.connect(api.db_url, autocommit=True) as conn:
        make_kinds(conn, exclude_columns="'{secret}'", user_column="'t'")
        for statement in ROWS[:4]:
            conn.execute(statement)
    document = (await api.request("GET", "/schema/openapi.json")).json()
    schema = document["webhooks"]["kind.snapshot"]["post"]["requestBody"]["content"][
        "application/json"]["schema"]
    sub = await api.create(events="kind.update", resource="kinds")
    async with running_worker(api.db_url):
        started = await api.request("POST", f"/api/v1/webhooks/{sub['id']}/backfill", json={})
        assert started.status_code == 202, started.text
        await poll(lambda: len(api.receiver.deliveries()) >= 4, timeout=30,
                   what="four snapshots")
    bodies = [json.loads(r.body) for r in api.receiver.deliveries()]
    assert sorted(b["event"]["resource_id"] for b in bodies) == [1, 2, 3, 4]
    assert {b["event"]["name"] for b in bodies} == {"kind.snapshot"}
    for body in bodies:
        assert errors(schema, body) == [], body
    wrong = {**bodies[0], "event": {**bodies[0]["event"], "changed": ["t"]}}
    assert errors(schema, wrong) != []
