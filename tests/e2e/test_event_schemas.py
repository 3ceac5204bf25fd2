"""The JSON Schema of each event's delivery body (GET /api/v1/hook_events `schema`): every
payload delivered from a table of many column types validates against it, before and
after ALTER TABLE ... ADD COLUMN, and it refuses what is not sent."""

from __future__ import annotations

import copy
import json
from typing import Any

import jsonschema
import psycopg
import pytest

from service.store import Store
from tests.support.api import Api
from tests.support.fanout import drain_outbox
from tests.support.subscriptions import subscribe
from tests.support.worker import open_pool, running_worker

Validator = jsonschema.Draft202012Validator

KINDS = """
CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy');
CREATE DOMAIN posint AS integer CHECK (VALUE > 0);
CREATE TYPE pair AS (a integer, b text);
CREATE TABLE kinds (
    id bigint PRIMARY KEY, i2 smallint, i4 integer NOT NULL DEFAULT 1, i8 bigint,
    num numeric, num2 numeric(10, 2), f4 real, f8 double precision, t text NOT NULL DEFAULT '',
    vc varchar(5), ch char(3), b boolean, tstz timestamptz, ts timestamp, d date, tm time,
    iv interval, u uuid, by bytea, j json, jb jsonb, m mood, dom posint, ia int[], ta text[],
    ip inet, r int4range, p pair, ma mood[], secret text)
"""
ROWS = [
    "INSERT INTO kinds VALUES (1, 1, 2, 3, 12.50, 1.10, 1.5, 2.25, 'x', 'abcde', 'a', true,"
    " '2026-01-02 03:04:05.123456+02', '2026-01-02 03:04:05', '2026-01-02', '03:04:05.5',"
    " '1 day 2 hours', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '\\x0102',"
    " '{\"b\": 1, \"a\": [1, {\"z\": null}]}', '{\"b\": {\"z\": [1, 2]}, \"a\": null}',"
    " 'happy', 5, '{1,NULL,3}', '{a,NULL,\"c d\"}', '10.0.0.1', '[1,5)', '(1,\"x y\")',"
    " '{sad,happy}', 'hidden')",
    "INSERT INTO kinds (id, num, f4, f8, tstz, ts, d, r, iv, ia, jb) VALUES (2, 'NaN',"
    " 'Infinity', '-Infinity', 'infinity', '-infinity', '-infinity', 'empty', '-1 year',"
    " '{{1,2},{3,NULL}}', '[]')",
    "INSERT INTO kinds (id, f8, num, tstz, d, ts) VALUES (3, 'NaN', 1e30,"
    " '0044-03-15 12:00:00+00 BC', '12000-01-01', '2026-01-01 00:00:00.5')",
    "INSERT INTO kinds (id, num, f8, i2, i8) VALUES (4, '-Infinity', 1e300, -32768,"
    " 9223372036854775807)",
    "UPDATE kinds SET t = 'changed', ma = '{}', jb = '{\"deep\": {\"er\": [true]}}' WHERE id = 1",
    "UPDATE kinds SET id = 20 WHERE id = 2",  # a key change: no previous
    "DELETE FROM kinds WHERE id = 3",
]
EVENTS = ["kind.create", "kind.update", "kind.delete", "kind.truncate"]


def make_kinds(conn: psycopg.Connection[Any], **attach: str) -> None:
    conn.execute(KINDS)
    options = "".join(f", {k} => {v}" for k, v in attach.items())
    conn.execute(f"SELECT webhooks.attach('kinds', resource => 'kinds', noun => 'kind'{options})")


async def published(api: Api) -> dict[str, dict[str, Any]]:
    """Each listed event's schema, checked to be a valid 2020-12 schema."""
    response = await api.request("GET", "/api/v1/hook_events")
    assert response.status_code == 200, response.text
    found = {}
    for entry in response.json():
        assert set(entry) == {"resource", "event", "schema"}
        Validator.check_schema(entry["schema"])
        assert entry["schema"]["$schema"] == "https://json-schema.org/draft/2020-12/schema"
        found[entry["event"]] = entry["schema"]
    return found


def errors(schema: dict[str, Any], body: Any) -> list[str]:
    validator = Validator(schema, format_checker=Validator.FORMAT_CHECKER)
    return [f"{list(e.absolute_path)}: {e.message[:200]}" for e in validator.iter_errors(body)]


def delivered(api: Api) -> list[dict[str, Any]]:
    return [json.loads(r.body) for r in api.receiver.deliveries()]


async def test_every_delivered_payload_validates_before_and_after_add_column(api: Api) -> None:
    with psycopg.connect(api.db_url, autocommit=True) as conn:
        make_kinds(conn, exclude_columns="'{secret}'", include_previous="true")
    before = await published(api)
    assert set(EVENTS) <= set(before)
    await api.create(events=",".join(EVENTS), resource="kinds")
    async with running_worker(api.db_url):
        with psycopg.connect(api.db_url, autocommit=True) as conn:
            for statement in ROWS:
                conn.execute(statement)
        await api.receiver.wait_for(lambda r: len(r.deliveries()) == len(ROWS), timeout=30)
        first = delivered(api)
        with psycopg.connect(api.db_url, autocommit=True) as conn:
            conn.execute("ALTER TABLE kinds ADD COLUMN added_at timestamptz NOT NULL"
                         " DEFAULT '2026-05-01 10:00:00+00', ADD COLUMN tags varchar(4)[]")
            after = await published(api)
            conn.execute("INSERT INTO kinds (id, tags) VALUES (5, '{ab,NULL,abcd}')")
            conn.execute("UPDATE kinds SET num = 0.001 WHERE id = 4")
            conn.execute("TRUNCATE kinds")
        await api.receiver.wait_for(lambda r: len(r.deliveries()) == len(ROWS) + 3,
                                    timeout=30)
    second = delivered(api)[len(ROWS):]
    names = [b["event"]["name"] for b in first + second]
    assert sorted(set(names)) == sorted(EVENTS), names
    for body in first:
        assert errors(before[body["event"]["name"]], body) == [], body
    for body in second:
        assert errors(after[body["event"]["name"]], body) == [], body
    # The schema followed the DDL: the new columns are in it, and the old one refuses them.
    row = after["kind.create"]["properties"]["resource"]
    assert "added_at" in row["required"] and row["properties"]["added_at"]["anyOf"][-1] != {
        "type": "null"}
    assert row["properties"]["tags"]["items"]["anyOf"][0] == {
        "type": ["string", "null"], "maxLength": 4}
    assert "added_at" not in before["kind.create"]["properties"]["resource"]["properties"]
    assert errors(before["kind.create"], second[0]) != []
    # What the bodies carried: NaN, infinities, NULL array elements, a nested jsonb.
    created = {b["resource"]["id"]: b["resource"] for b in first
               if b["event"]["name"] == "kind.create"}
    assert created[2]["num"] == "NaN" and created[2]["f4"] == "Infinity"
    assert created[1]["ia"] == [1, None, 3] and created[2]["ia"] == [[1, 2], [3, None]]
    assert "secret" not in created[1]
    assert "secret" not in before["kind.create"]["properties"]["resource"]["properties"]


async def test_the_schema_refuses_what_is_never_sent(api: Api, pool: Any) -> None:
    with psycopg.connect(api.db_url, autocommit=True) as conn:
        make_kinds(conn, include_previous="true")
        subscribe(conn, events=EVENTS, resource="kinds")
        conn.execute(ROWS[0])
        conn.execute(ROWS[4])
    await drain_outbox(Store(pool), 100)
    bodies = {n: json.loads(b) for n, b in api.sql(
        "SELECT name, body FROM webhooks.events ORDER BY id")}
    schemas = await published(api)
    create, update = bodies["kind.create"], bodies["kind.update"]
    assert errors(schemas["kind.create"], create) == []
    assert errors(schemas["kind.update"], update) == []
    assert update["event"]["changed"] == ["t", "jb", "ma"] and "previous" in update
    wrong = [("i4", None), ("num", "12.50"), ("m", "angry"), ("vc", "abcdef"), ("ch", "ab"),
             ("ia", [1, "2"]), ("tstz", "2026-01-02 01:04:05+00"), ("u", "not-a-uuid"),
             ("b", "true"), ("i2", 40000), ("by", "0102"), ("d", "2026-01-02T00:00:00"),
             ("f8", "NaNa"), ("dom", 1.5), ("p", {"a": 1}), ("unknown", 1)]
    for column, value in wrong:
        body = copy.deepcopy(create)
        body["resource"][column] = value
        assert errors(schemas["kind.create"], body) != [], (column, value)
    missing = copy.deepcopy(create)
    del missing["resource"]["t"]
    assert errors(schemas["kind.create"], missing) != []
    renamed = copy.deepcopy(create)
    renamed["event"]["name"] = "kind.update"
    assert errors(schemas["kind.create"], renamed) != []
    unchanged = copy.deepcopy(update)
    unchanged["event"]["changed"] = ["nope"]
    assert errors(schemas["kind.update"], unchanged) != []
    both = copy.deepcopy(create)
    both["resource_omitted"] = "too_large"
    assert errors(schemas["kind.create"], both) != []


async def test_allow_list_exclusions_include_row_and_too_large(api: Api, pool: Any) -> None:
    with psycopg.connect(api.db_url, autocommit=True) as conn:
        make_kinds(conn, columns="'{id,t,jb,secret}'", exclude_columns="'{secret}'",
                   include_previous="true")
        conn.execute("CREATE TABLE quiet (id uuid PRIMARY KEY, note text)")
        conn.execute("SELECT webhooks.attach('quiet', resource => 'quiet', noun => 'hush',"
                     " include_row => false)")
        subscribe(conn, events=EVENTS, resource="kinds")
        subscribe(conn, events=["hush.create", "hush.update"], resource="quiet")
        conn.execute(ROWS[0])
        conn.execute("UPDATE kinds SET t = repeat('x', 5000) WHERE id = 1")
        conn.execute("INSERT INTO quiet VALUES (gen_random_uuid(), 'a')")
        conn.execute("UPDATE quiet SET note = 'b'")
    await drain_outbox(Store(pool), 100, max_row_bytes=2000)
    schemas = await published(api)
    row = schemas["kind.create"]["properties"]["resource"]
    assert list(row["properties"]) == ["id", "t", "jb"] == row["required"]
    assert schemas["kind.update"]["properties"]["event"]["properties"]["changed"]["items"][
        "enum"] == ["id", "t", "jb"]
    assert set(schemas["hush.create"]["properties"]) == {"event"}
    assert schemas["hush.update"]["properties"]["event"]["properties"]["resource_id"][
        "format"] == "uuid"
    assert set(schemas["kind.truncate"]["properties"]) == {"event"}
    bodies = [(n, json.loads(b)) for n, b in api.sql(
        "SELECT name, body FROM webhooks.events ORDER BY id")]
    assert [n for n, _ in bodies] == ["kind.create", "kind.update", "hush.create",
                                      "hush.update"]
    assert bodies[1][1]["resource_omitted"] == "too_large"
    for name, body in bodies:
        assert errors(schemas[name], body) == [], (name, body)


async def test_service_events_test_event_and_truncate(api: Api, pool: Any) -> None:
    watcher = await api.create(events="webhook.failing,webhook.disabled", resource="webhooks")
    watched = await api.create(events="invoice.create,invoice.truncate")
    schemas = await published(api)
    assert {"webhook.failing", "webhook.recovered", "webhook.disabled"} <= set(schemas)
    api.sql("SELECT webhooks.lifecycle_event(s, 'webhook.failing') FROM webhooks.subscriptions"
            " s WHERE s.id = %s", watched["id"])
    response = await api.request("POST", f"/api/v1/webhooks/{watcher['id']}/test")
    assert response.status_code == 202, response.text
    api.sql("TRUNCATE invoices CASCADE")
    await drain_outbox(Store(pool), 100)
    bodies = [(n, json.loads(b)) for n, b in api.sql(
        "SELECT name, body FROM webhooks.events ORDER BY id")]
    assert sorted(n for n, _ in bodies) == ["invoice.truncate", "webhook.failing",
                                            "webhook.test"]
    tests = {}
    for name, body in bodies:
        if name == "webhook.test":
            tests[name] = body
            continue
        assert errors(schemas[name], body) == [], (name, body)
    failing = dict(bodies)["webhook.failing"]
    assert failing["resource"]["id"] == watched["id"]
    broken = copy.deepcopy(failing)
    broken["resource"]["active"] = "yes"
    assert errors(schemas["webhook.failing"], broken) != []
    assert errors(schemas["invoice.truncate"], {**dict(bodies)["invoice.truncate"],
                                                "resource": {}}) != []
    document = (await api.request("GET", "/schema/openapi.json")).json()
    test_schema = document["webhooks"]["webhook.test"]["post"]["requestBody"]["content"][
        "application/json"]["schema"]
    assert errors(test_schema, tests["webhook.test"]) == []


@pytest.fixture
async def pool(db_url: str) -> Any:
    async with open_pool(db_url, max_size=4) as p:
        yield p
