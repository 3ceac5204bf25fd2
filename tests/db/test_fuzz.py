"""Schemathesis against the service's own /schema/openapi.json: every operation, with a valid
token, without one and with a wrong one, positive and negative data. No 5xx; every answer
conforms to the document (status, content type, headers, body schema); every error is
{"error": str}.

FUZZ_EXAMPLES sets the examples per operation, mode and auth (`make fuzz` raises it); the
bounded default keeps this test under a minute.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import psycopg
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from schemathesis import Case, CheckContext, GenerationMode, Response
from schemathesis.checks import (
    content_type_conformance,
    ignored_auth,
    negative_data_rejection,
    not_a_server_error,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from service import tokens
from service.config import Settings
from tests.support.api import background_api

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "8"))
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance,
          response_headers_conformance, response_schema_conformance]


@dataclass
class Served:
    """The API and a receiver for handshakes, both on loopback, run by a background loop."""

    url: str
    receiver: str
    token: str
    ids: list[int]
    counts: dict[str, int]


@pytest.fixture
def served(db_url: str) -> Iterator[Served]:
    settings = Settings(database_url=db_url, allow_private_targets=True, verify_timeout=1.0,
                        rate_limit=0.0)
    with background_api(settings) as (url, receiver), \
            psycopg.connect(db_url, autocommit=True) as conn:
        token = tokens.create(conn, "fuzz")[1]
        ids = []
        with httpx.Client(base_url=url, timeout=30,
                          headers={"Authorization": f"Bearer {token}"}) as http:
            for events in EVENTS:
                response = http.post("/api/v1/webhooks", json={
                    "resource": "invoices", "events": events, "target": receiver})
                assert response.status_code == 201, response.text
                ids.append(response.json()["id"])
        yield Served(url, receiver, token, ids, {})


def error_shape(ctx: CheckContext, response: Response, case: Case) -> bool | None:
    """Every 4xx/5xx body is exactly {"error": "<non-empty string>"}."""
    if response.status_code >= 400:
        body = response.json()
        assert isinstance(body, dict) and set(body) == {"error"}, f"not an error body: {body}"
        assert isinstance(body["error"], str) and body["error"], f"empty error: {body}"
    return None


AUTHS = ("token", "none", "wrong")
EVENTS = ("create", "invoice.update, payment.create", "destroy,create")


def _wire_distinct(case: Case) -> bool:
    """False when the case's invalid data looks valid on the wire: a query or path value
    that is a list of at most one item is sent exactly like a plain string (or not at all),
    so the server cannot know it was generated as something else."""
    values = [*(case.query or {}).values(), *(case.path_parameters or {}).values()]
    return not any(isinstance(v, list) and len(v) <= 1 for v in values)


def _run(served: Served, operation: Any, mode: GenerationMode, examples: int) -> None:
    """Runs `examples` cases per auth mode of one operation and generation mode."""
    negative = mode is GenerationMode.NEGATIVE
    # The valid token is given to schemathesis, so that it never "negates" it; the other
    # two modes replace whatever header it made, and their answer is a 401 in any case.
    token = {"Authorization": f"Bearer {served.token}"}
    strategies = {"token": operation.as_strategy(generation_mode=mode, headers=token),
                  "none": operation.as_strategy(generation_mode=mode),
                  "wrong": operation.as_strategy(generation_mode=mode)}
    # Half of the cases carry the valid token: those reach the handlers.
    cases = st.sampled_from(("token", "token", "none", "wrong")).flatmap(
        lambda auth: strategies[auth].map(lambda case: (auth, case)))

    @settings(max_examples=examples * len(AUTHS), deadline=None, database=None,
              phases=[Phase.explicit, Phase.generate, Phase.shrink],
              suppress_health_check=list(HealthCheck))
    @given(drawn=cases, real_target=st.booleans(), events=st.sampled_from(EVENTS),
           known_id=st.booleans())
    def check(drawn: tuple[str, Case], real_target: bool, events: str, known_id: bool
              ) -> None:
        auth, case = drawn
        headers = dict(case.headers or {})
        if auth != "token":
            headers = {k: v for k, v in headers.items() if k.lower() != "authorization"}
            if auth == "wrong":
                headers["Authorization"] = "Bearer wht_" + "0" * 43
        case.headers = headers
        # Positive cases only: replacing parts of a negative one could make it valid.
        if (not negative and real_target and case.method == "POST"
                and isinstance(case.body, dict) and "target" in case.body):
            # Half of the creates name a real resource and receiver, so the handshake and
            # the 201 path are fuzzed too, not only refusals.
            case.body = {**case.body, "resource": "invoices", "events": events,
                         "target": served.receiver}
        if not negative and known_id and "webhook_id" in (case.path_parameters or {}):
            # And half of the ids are of subscriptions that exist (some of them deleted).
            case.path_parameters = {**(case.path_parameters or {}),
                                    "webhook_id": str(served.ids[len(served.counts) %
                                                                 len(served.ids)])}
        checks = list(CHECKS)
        if negative and _wire_distinct(case):
            checks.append(negative_data_rejection)
        if auth == "token" and case.path.startswith("/api"):
            checks.append(ignored_auth)
        response = case.call(base_url=served.url, timeout=30)
        key = f"{case.method} {response.status_code}"
        served.counts[key] = served.counts.get(key, 0) + 1
        case.validate_response(response, checks=checks, additional_checks=[error_shape],
                               headers=headers)

    check()


def _fuzz(served: Served, examples: int) -> None:
    schema = schemathesis.openapi.from_url(served.url + "/schema/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert {op.label for op in operations} >= {
        "GET /api/v1/webhooks", "POST /api/v1/webhooks", "GET /api/v1/webhooks/{webhook_id}",
        "PUT /api/v1/webhooks/{webhook_id}", "DELETE /api/v1/webhooks/{webhook_id}",
        "GET /api/v1/hook_events", "GET /healthz", "GET /readyz"}
    for operation in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            if mode is GenerationMode.NEGATIVE and not (
                    operation.body or operation.query or operation.path_parameters):
                continue  # nothing of it can be made invalid
            try:
                _run(served, operation, mode, examples)
            except Unsatisfiable:
                assert mode is GenerationMode.NEGATIVE, operation.label


@pytest.mark.timeout(900)
def test_schemathesis_finds_nothing(served: Served) -> None:
    _fuzz(served, EXAMPLES)
    total = sum(served.counts.values())
    print(f"\nschemathesis: {total} requests; by method and status: "
          + ", ".join(f"{k}: {v}" for k, v in sorted(served.counts.items())))
    assert served.counts.get("POST 201", 0) > 0 or EXAMPLES < 4, served.counts
    assert not any(k.endswith(tuple(f" {c}" for c in range(500, 600)))
                   for k in served.counts)
