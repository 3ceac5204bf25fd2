"""The one sanitizer of the text a target sent before Postgres stores it
(service.worker.delivery.pg_text); what the worker records from hostile answers:
tests/e2e/test_hostile_answers.py."""

from __future__ import annotations

from service.worker import delivery
from service.worker.delivery import BODY_LIMIT


def test_pg_text_is_the_one_sanitizer() -> None:
    assert delivery.pg_text(None) is None
    assert delivery.pg_text("a\x00b") == "a\ufffdb"
    assert delivery.pg_text(b"\xff\x00ok") == "\ufffd\ufffdok"
    assert delivery.pg_text("lone \udc80 surrogate") == "lone \ufffd surrogate"
    long = delivery.pg_text("x" * 10_000)
    assert long is not None and len(long) <= BODY_LIMIT
    assert delivery.pg_text("é" * 5000, limit=10) == "é" * 10
