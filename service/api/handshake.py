"""The verification handshake: a target proves it wants webhooks by echoing `X-Hook-Secret`.

The service POSTs `{}` with a fresh secret in `X-Hook-Secret`; only a 200 answer carrying
the same value in its own `X-Hook-Secret` header passes. Anything else raises
HandshakeFailed with a message that says what the target did, never the secret.
"""

from __future__ import annotations

import asyncio
import base64
import hmac
import secrets

import httpx
from yarl import URL

from service.curl import AttemptError, CurlClient
from service.http import check_literal, read_limited
from service.outcomes import Answer, classify
from service.ssrf import TargetRejected


class Outbound:
    """The API's outbound client, as the routes get it: httpx, or libcurl when a delivery
    proxy is set (handshakes then go through the proxy by CONNECT, as deliveries do). One
    class, so that dependency injection can name it."""

    __slots__ = ("client",)

    def __init__(self, client: httpx.AsyncClient | CurlClient) -> None:
        self.client = client

SECRET_PREFIX = "whsec_"
HEADER = "X-Hook-Secret"
# The answer's body means nothing to the handshake; read a little so the connection can
# be reused, never more.
BODY_LIMIT = 4096
_SHOWN = 200


class HandshakeFailed(Exception):
    """The target did not pass verification; the message tells an integrator what it did.

    `outcome` is one word for metrics: refused (it answered, but wrongly), timeout or
    unreachable.
    """

    def __init__(self, message: str, outcome: str = "refused") -> None:
        super().__init__(message)
        self.outcome = outcome


def new_secret() -> str:
    """A fresh subscription secret: `whsec_` and standard base64 of 32 random bytes."""
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(32)).decode("ascii")


def _cut(text: str) -> str:
    return text if len(text) <= _SHOWN else text[:_SHOWN] + "..."


def _outcome(status: int, echoed: list[str], location: str | None, secret: str) -> str | None:
    """Why an answer fails the handshake, or None when it passes."""
    if classify(status) is Answer.REDIRECT:
        where = f" to {_cut(location)}" if location else ""
        return (f"the target answered the verification request with a redirect ({status}"
                f"{where}); redirects are not followed, so use the final URL as the target")
    if status != 200:
        return (f"the target answered the verification request with HTTP {status}; it must "
                f"answer 200 and echo the {HEADER} header")
    if not echoed:
        return (f"the target answered 200 but did not echo the {HEADER} header it was sent")
    if len(echoed) != 1 or not hmac.compare_digest(echoed[0].encode(), secret.encode()):
        return (f"the target answered 200 but its {HEADER} header differs from the one it "
                "was sent")
    return None


async def verify(client: Outbound | httpx.AsyncClient | CurlClient, target: str, secret: str,
                 timeout: float) -> None:
    """Runs the handshake against `target`; raises HandshakeFailed unless it passes.

    The whole exchange is bounded by `timeout` seconds; redirects are not followed (the
    client never follows them) and at most BODY_LIMIT bytes of the answer are read.
    """
    if isinstance(client, Outbound):
        client = client.client
    if isinstance(client, CurlClient):
        return await _verify_through_proxy(client, target, secret, timeout)
    outcome = "refused"
    try:
        async with asyncio.timeout(timeout):
            async with client.stream("POST", target, json={}, headers={HEADER: secret},
                                     timeout=timeout) as response:
                await read_limited(response, BODY_LIMIT)
                reason = _outcome(response.status_code, response.headers.get_list(HEADER),
                                  response.headers.get("location"), secret)
    except (TimeoutError, httpx.TimeoutException):
        outcome = "timeout"
        reason = (f"the target did not answer the verification request within {timeout:g} "
                  "seconds (WEBHOOKS_VERIFY_TIMEOUT)")
    except httpx.ConnectError as exc:
        outcome = "unreachable"
        reason = f"the verification request could not reach the target: {exc}"
    except httpx.HTTPError as exc:
        outcome = "unreachable"
        reason = f"the verification request to the target failed: {exc or type(exc).__name__}"
    except (httpx.InvalidURL, ValueError) as exc:
        # URLs that urlsplit accepts but httpx or yarl do not (odd IDNA, ports, escapes).
        outcome = "unreachable"
        reason = f"target is not a valid URL: {exc}"
    if reason is not None:
        # Transport messages come from libraries; make sure none carries the secret.
        raise HandshakeFailed(reason.replace(secret, "***"), outcome)


async def _verify_through_proxy(client: CurlClient, target: str, secret: str,
                                timeout: float) -> None:
    """The handshake through the delivery proxy (service.curl: CONNECT to the address the
    guard checked); the same answers pass and fail."""
    outcome = "refused"
    reason: str | None
    try:
        url = URL(target)
        check_literal(url.host, client.allow_private)
        async with asyncio.timeout(timeout):
            status, headers, _ = await client.exchange(
                str(url), url.raw_host or "", url.port or 0, b"{}",
                # Names as httpx sends them (lowercase): a receiver may look them up so.
                ["content-type: application/json", f"{HEADER.lower()}: {secret}"], timeout)
        echoed = [value for name, value in headers if name == HEADER.lower()]
        location = next((value for name, value in headers if name == "location"), None)
        reason = _outcome(status, echoed, location, secret)
    except TimeoutError:
        outcome = "timeout"
        reason = (f"the target did not answer the verification request within {timeout:g} "
                  "seconds (WEBHOOKS_VERIFY_TIMEOUT)")
    except (AttemptError, TargetRejected) as exc:
        outcome = "unreachable"
        reason = f"the verification request could not reach the target: {exc}"
    except ValueError as exc:
        outcome = "unreachable"
        reason = f"target is not a valid URL: {exc}"
    if reason is not None:
        raise HandshakeFailed(reason.replace(secret, "***"), outcome)

