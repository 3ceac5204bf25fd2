"""What an HTTP answer from a target means: the one classifier of statuses.

The worker decides from it whether a delivery succeeded, stops for good, honours a
Retry-After and whether the target is struggling; the verification handshake whether an
answer was a redirect. Status 0 stands for "no answer" (a timeout, a refused connection).
"""

from __future__ import annotations

import enum


class Answer(enum.Enum):
    """The kinds of answer a target can give, as the service treats them."""

    SUCCESS = "success"  # 2xx
    NO_ANSWER = "no_answer"  # 0: timed out, unreachable, refused by the SSRF guard
    REDIRECT = "redirect"  # 3xx: never followed
    GONE = "gone"  # 410: the target asks for no more deliveries
    THROTTLED = "throttled"  # 429
    UNAVAILABLE = "unavailable"  # 503
    SERVER_ERROR = "server_error"  # any other status from 500 up
    REFUSED = "refused"  # any other status (4xx, 1xx)

    @property
    def honours_retry_after(self) -> bool:
        """Whether a Retry-After header of this answer may push the retry later (429, 503)."""
        return self in (Answer.THROTTLED, Answer.UNAVAILABLE)

    @property
    def struggling(self) -> bool:
        """Whether the target looks overloaded or down (no answer, 429, 5xx): the worker
        then keeps one attempt in flight for it until it succeeds again."""
        return self in (Answer.NO_ANSWER, Answer.THROTTLED, Answer.UNAVAILABLE,
                        Answer.SERVER_ERROR)


def classify(status: int) -> Answer:
    """The kind of answer `status` is (0: no answer came)."""
    if status == 0:
        return Answer.NO_ANSWER
    if 200 <= status < 300:
        return Answer.SUCCESS
    if 300 <= status < 400:
        return Answer.REDIRECT
    if status == 410:
        return Answer.GONE
    if status == 429:
        return Answer.THROTTLED
    if status == 503:
        return Answer.UNAVAILABLE
    if status >= 500:
        return Answer.SERVER_ERROR
    return Answer.REFUSED
