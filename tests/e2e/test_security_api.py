"""What a security reviewer asks of the API: no redirect of the handshake followed, owner
and tenant isolation (property-based), revocation at once, one answer for every bad token,
and no secret or token in an error body, a log line or a metrics label. The forms of an
address that the SSRF guard refuses at creation: tests/unit/test_ssrf.py."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from typing import Any

import httpx
import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from service import tokens
from service.config import Settings
from service.logs import JsonFormatter
from tests.support.api import Api, assert_error, background_api
from tests.support.receivers import Receiver, status

pytestmark = pytest.mark.api_settings(verify_timeout=5.0)


# --- SSRF at creation: the handshake follows no redirect --------------------------------

@pytest.mark.parametrize(("code", "where"), [
    (301, "other"), (302, "other"), (303, "other"), (307, "other"), (308, "other"),
    (302, "http://169.254.169.254/latest/meta-data/"),
])
async def test_handshake_redirects_are_never_followed(api: Api, code: int, where: str) -> None:
    async with Receiver() as other:
        location = other.url if where == "other" else where
        api.receiver.behaviour = status(code, {"Location": location})
        response = await api.request("POST", "/api/v1/webhooks", json={
            "resource": "invoices", "events": "create", "target": api.receiver.url})
        assert_error(response, 400, f"redirect ({code}")
        assert other.received == [] and len(api.receiver.received) == 1
        assert api.sql("SELECT count(*) FROM webhooks.subscriptions") == [(0,)]


# --- isolation: owners and tenants never see each other's subscriptions -----------------

OWNERS = st.sampled_from(["alice", "bob", "carol"])
TENANTS = st.none() | st.sampled_from(["acme", "globex"])


def visible(viewer: tuple[str, str | None], creator: tuple[str, str | None]) -> bool:
    """A token sees its owner's subscriptions; a tenant-scoped one, only its tenant's."""
    return viewer[0] == creator[0] and (viewer[1] is None or viewer[1] == creator[1])


@pytest.fixture
def served(db_url: str) -> Iterator[tuple[str, str]]:
    with background_api(Settings(database_url=db_url, allow_private_targets=True,
                                 verify_timeout=2.0, rate_limit=0.0)) as urls:
        yield urls


@pytest.mark.timeout(300)
def test_no_token_sees_another_owners_or_tenants_subscriptions(
        db_url: str, served: tuple[str, str]) -> None:
    url, receiver = served

    @settings(max_examples=15, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(principals=st.lists(st.tuples(OWNERS, TENANTS), min_size=2, max_size=4,
                               unique=True),
           creators=st.lists(st.integers(0, 3), min_size=1, max_size=6))
    def check(principals: list[tuple[str, str | None]], creators: list[int]) -> None:
        with psycopg.connect(db_url, autocommit=True) as conn:
            conn.execute("DELETE FROM webhooks.subscriptions")
            keys = [tokens.create(conn, owner, tenant)[1] for owner, tenant in principals]
        made: list[tuple[int, tuple[str, str | None]]] = []
        with httpx.Client(base_url=url, timeout=30) as http:
            def call(method: str, path: str, who: int, **kw: Any) -> httpx.Response:
                return http.request(method, path, headers={
                    "Authorization": f"Bearer {keys[who]}"}, **kw)

            for index in creators:
                who = index % len(principals)
                response = call("POST", "/api/v1/webhooks", who, json={
                    "resource": "invoices", "events": "create", "target": receiver})
                assert response.status_code == 201, response.text
                made.append((response.json()["id"], principals[who]))
            for who, viewer in enumerate(principals):
                listed = [s["id"] for s in call("GET", "/api/v1/webhooks", who).json()]
                assert listed == [i for i, creator in made if visible(viewer, creator)]
                for sid, creator in made:
                    got = call("GET", f"/api/v1/webhooks/{sid}", who)
                    if visible(viewer, creator):
                        assert got.status_code == 200
                        continue
                    # Exactly what an id that never existed gets.
                    for method, body in (("GET", None), ("PUT", {"active": False}),
                                         ("DELETE", None)):
                        answer = call(method, f"/api/v1/webhooks/{sid}", who, json=body)
                        assert answer.status_code == 404
                        assert answer.json() == {"error": f"no webhook with id {sid}"}
                    filtered = call("GET", "/api/v1/webhooks?resource=invoices&active=true",
                                    who).json()
                    assert sid not in [s["id"] for s in filtered]
        with psycopg.connect(db_url, autocommit=True) as conn:
            # Nothing was changed or deleted through another principal's token.
            rows = conn.execute("SELECT id, owner, tenant, active FROM webhooks.subscriptions "
                                "ORDER BY id").fetchall()
        assert [(r[0], (r[1], r[2])) for r in rows] == made
        assert all(r[3] for r in rows)

    check()


# --- tokens ---------------------------------------------------------------------------

async def test_revoked_token_stops_working_at_once(api: Api) -> None:
    with psycopg.connect(api.db_url, autocommit=True) as conn:
        token_id, token = tokens.create(conn, "alice")
    other = api.new_token("alice")
    created = await api.create(token=token)
    # The same keep-alive connection, before and after: no cached authentication.
    assert (await api.request("GET", f"/api/v1/webhooks/{created['id']}",
                              token=token)).status_code == 200
    with psycopg.connect(api.db_url, autocommit=True) as conn:
        assert tokens.revoke(conn, token_id)
    for method, path in (("GET", "/api/v1/webhooks"), ("GET", "/api/v1/hook_events"),
                         ("GET", f"/api/v1/webhooks/{created['id']}"),
                         ("DELETE", f"/api/v1/webhooks/{created['id']}")):
        assert_error(await api.request(method, path, token=token), 401, "unknown or revoked")
    # The owner's other tokens go on working, and the subscription is still there.
    got = await api.request("GET", f"/api/v1/webhooks/{created['id']}", token=other)
    assert got.status_code == 200


async def test_a_bad_token_is_401_before_the_requests_own_errors(api: Api) -> None:
    # The reads that check the token in their own statement (GET one, the list) answer a
    # bad token as every endpoint does, before a malformed id or query; a good token then
    # gets the request's own error.
    bad = "wht_" + "A" * 43
    for path, code in (("/api/v1/webhooks/abc", 404), ("/api/v1/webhooks?limit=0", 400),
                         ("/api/v1/webhooks?after=x", 400), ("/api/v1/webhooks/999999", 404)):
        assert_error(await api.request("GET", path, token=bad), 401, "unknown or revoked")
        assert (await api.request("GET", path)).status_code == code, path


async def test_every_bad_token_gets_the_same_answer(api: Api,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    with psycopg.connect(api.db_url, autocommit=True) as conn:
        revoked_id, revoked = tokens.create(conn, "alice")
        tokens.revoke(conn, revoked_id)
    good = api.token
    def flip(c: str) -> str:
        return "A" if c != "A" else "B"

    candidates = [
        good[:-1] + flip(good[-1]),         # near miss: last character
        good[:4] + flip(good[4]) + good[5:],  # near miss: first random character
        good[:-1],                          # one short
        good + "A",                         # one long
        "wht_" + "A" * 43,                  # well-formed, unknown
        "WHT_" + good[4:],                  # prefix in the wrong case
        "wht_short", "x", "wht_" + "A" * 400, good.replace("_", "-", 1),
        revoked,
    ]
    answers = set()
    for candidate in candidates:
        response = await api.request("GET", "/api/v1/webhooks", token=candidate)
        assert response.status_code == 401
        assert candidate not in response.text
        answers.add((response.text, response.headers["www-authenticate"]))
    assert len(answers) == 1, answers
    # The lookup is by hash and the comparison constant-time.
    compared: list[tuple[bytes, bytes]] = []
    original = tokens.hmac.compare_digest

    def spy(a: Any, b: Any) -> bool:
        compared.append((a, b))
        return original(a, b)

    monkeypatch.setattr(tokens.hmac, "compare_digest", spy)
    assert (await api.request("GET", "/api/v1/webhooks")).status_code == 200
    assert compared == [(tokens.hash_token(good), tokens.hash_token(good))]
    stored = api.sql("SELECT row_to_json(t)::text FROM webhooks.tokens t")
    assert stored and not any(good[4:] in row[0] or revoked[4:] in row[0] for row in stored)


# --- nothing secret in error bodies, log lines or metrics labels -------------------------

async def test_no_secret_or_token_in_errors_logs_or_metrics(api: Api) -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    bodies: list[str] = []
    try:
        created = await api.create()
        # A target that echoes the secret back everywhere it can, and fails the handshake.
        async def leaky(req: Any) -> Any:
            secret = req.headers.get("x-hook-secret", "")
            return await status(302, {"Location": f"http://example.com/?s={secret}",
                                      "X-Hook-Secret": secret + "x"}, body=secret)(req)

        api.receiver.behaviour = leaky
        for path, kwargs in (
            ("/api/v1/webhooks", {"json": {"resource": "invoices", "events": "create",
                                           "target": api.receiver.url}}),
            ("/api/v1/webhooks", {"json": {"resource": api.token, "events": "create",
                                           "target": api.receiver.url}}),
            ("/api/v1/webhooks", {"json": {"resource": "invoices", "events": api.token,
                                           "target": api.receiver.url}}),
            ("/api/v1/webhooks", {"json": {"resource": "invoices", "events": "create",
                                           "target": f"http://{api.token}.invalid/"}}),
            ("/api/v1/webhooks", {"json": {api.token: 1}}),
            ("/api/v1/webhooks", {"content": api.token.encode()}),
        ):
            bodies.append((await api.request("POST", path, **kwargs)).text)
        for method, path in (("GET", f"/api/v1/webhooks/{api.token}"),
                             ("GET", f"/api/v1/webhooks?limit={api.token}"),
                             ("PUT", f"/api/v1/webhooks/{created['id']}")):
            bodies.append((await api.request(method, path, json={"secret": api.token})).text)
        bodies.append((await api.request("GET", "/api/v1/webhooks",
                                         token=api.token[:-1] + "x")).text)
        metrics = (await api.http.get("/metrics")).text
    finally:
        root.removeHandler(handler)
        root.setLevel(old_level)
    secrets = [r.headers["x-hook-secret"] for r in api.receiver.received]
    assert len(secrets) == 2
    lines = stream.getvalue().splitlines()
    for line in lines:
        json.loads(line)  # every line is one JSON object
    for text in [*bodies, stream.getvalue(), metrics]:
        for secret in [api.token, *secrets]:
            assert secret not in text
            assert secret[6:20] not in text  # not even a part of one
    for body in bodies:
        assert set(json.loads(body)) == {"error"}
    assert api.receiver.url not in metrics
