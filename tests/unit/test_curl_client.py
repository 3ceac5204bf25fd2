"""The worker's HTTP client (service/curl/) where no server answers: a target whose name
does not resolve is an attempt error (against real servers on 127.0.0.1:
tests/e2e/test_curl_client.py)."""

from __future__ import annotations

import pytest

from service.curl import AttemptError
from tests.support.clients import curl_client as client

JSON = ["Content-Type: application/json"]




async def test_a_name_that_does_not_resolve_is_an_attempt_error() -> None:
    async with client() as curl:
        with pytest.raises(AttemptError, match="does not resolve"):
            await curl.post("http://no-such-host.invalid/", "no-such-host.invalid", 80,
                            b"{}", JSON, 5.0)
