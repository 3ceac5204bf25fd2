"""Slots and isolation (service/worker/slots.py), without a database."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from service.outcomes import Answer, classify
from service.worker.ahead import AHEAD
from service.worker.delivery import Claim
from service.worker.pacing import saturated, saturated_owners
from service.worker.slots import Slots
from service.worker.window import INITIAL_WINDOW, SLOW_FACTOR

NOW = datetime(2026, 1, 1, tzinfo=UTC)
_ids = iter(range(1, 10_000))


def claim(subscription_id: int, owner: str = "o") -> Claim:
    return Claim(id=next(_ids), attempts=1, subscription_id=subscription_id, owner=owner,
                 active=True, target="http://t.example/", secret="s", event="x.create",
                 body="{}", due=NOW)


def send(s: Slots, c: Claim, now: float) -> None:
    """Holds `c` and starts what may be sent (`c`, unless its caps hold it back)."""
    s.take(c, now)
    s.ready(now)


def slots(concurrency: int = 8, per_target: int = 2, per_owner: int | None = None,
          batch_size: int = 100, slow_after: float = 1.0) -> Slots:
    return Slots(concurrency, per_target=per_target, per_owner=per_owner,
                 batch_size=batch_size, slow_after=slow_after)


def test_caps_default_to_half_the_slots_per_owner_and_a_quarter_to_claim() -> None:
    s = slots(concurrency=8)
    assert s.per_owner == 4 and s.claim_min == 2
    assert slots(concurrency=1).per_owner == 1
    assert slots(concurrency=8, per_owner=3).per_owner == 3
    assert slots(concurrency=0).concurrency == 1


def test_wanted_waits_for_a_quarter_of_the_slots() -> None:
    s = slots(concurrency=8, batch_size=5, per_owner=8)
    assert s.wanted() == 5  # idle: up to a batch
    taken = [claim(n) for n in range(AHEAD * 8 - 1)]  # AHEAD x the slots may be held
    for c in taken:
        s.take(c, 0.0)
    assert len(s.ready(0.0)) == 8 and s.sending_total == 8
    assert s.wanted() == 0  # one free slot, fewer than claim_min (2)
    s.handed_over(taken[0])
    assert s.wanted() == 2
    for c in taken[1:]:
        s.handed_over(c)
    assert s.wanted() == 5


def test_counts_per_subscription_and_owner_come_and_go() -> None:
    s = slots(per_target=2, per_owner=3)
    a1, a2, b1 = claim(1, "alice"), claim(1, "alice"), claim(2, "alice")
    for c in (a1, a2, b1):
        send(s, c, 0.0)
    assert s.busy == {1: 2, 2: 1} and s.busy_owners == {"alice": 3}
    assert s.sending == {1: 2, 2: 1} and s.sending_owners == {"alice": 3}
    # Claims run ahead of sends: AHEAD x the window and AHEAD x the owner's cap.
    assert s.saturated() == [] and s.saturated_owners() == []
    more = [claim(1, "alice") for _ in range(AHEAD * 2 - 2)] + [claim(2, "alice")]
    more += [claim(3, "alice") for _ in range(AHEAD * 3 - len(more) - 3)]
    for c in more:
        s.take(c, 0.0)
    assert s.ready(0.0) == []  # alice sends 3 at most: the rest waits
    assert s.saturated() == [1] and s.saturated_owners() == ["alice"]
    s.handed_over(a1)
    s.free(a1)
    assert s.ready(0.0) == [more[0]]  # the first waiting claim of the first subscription
    for c in more:
        s.handed_over(c)
        s.free(c)
    assert s.busy == {1: 1, 2: 1} and s.saturated() == [] and s.saturated_owners() == []
    s.free(a2)
    s.free(b1)
    assert s.busy == {} and s.busy_owners == {}


def test_a_struggling_target_is_degraded_until_it_succeeds() -> None:
    s = slots(per_target=3)
    c = claim(5)
    send(s, c, 0.0)
    for status in (0, 429, 500, 503, 599):
        s.degraded.clear()
        s.answered(5, status)
        assert s.degraded == {5}, status
        assert s.saturated() == [5]  # one in flight is its cap now, and no claim ahead
    for status in (400, 404, 410, 301):
        s.answered(5, status)
        assert s.degraded == {5}, status  # neither struggling nor a success: unchanged
    s.answered(5, 204)
    assert s.degraded == set()
    # Each trouble halved the window: it starts again from one and grows on fast answers.
    assert s.cap(5) == 1 and s.saturated() == []  # one sent, one may wait
    s.answered(5, 204, duration_ms=1.0)
    assert s.cap(5) == 2 and s.saturated() == []


def test_an_attempt_in_flight_too_long_degrades_its_subscription() -> None:
    s = slots(slow_after=1.0)
    send(s, claim(1), 10.0)
    send(s, claim(2), 10.5)
    s.mark_slow(11.2)
    assert s.degraded == {1}


def test_shutdown_takes_what_is_still_in_flight() -> None:
    s = slots()
    done, left = claim(1), claim(2)
    send(s, done, 0.0)
    send(s, left, 0.0)
    s.handed_over(done)
    assert s.leftover() == [left]
    assert s.inflight == {}


def test_saturation_helpers() -> None:
    assert saturated({1: 2, 2: 1, 3: 1}, 2, degraded={3}) == [1, 3]
    assert saturated_owners({"a": 4, "b": 1}, 4) == ["a"]
    assert saturated_owners({"a": 4}, None) == []


@pytest.mark.parametrize(("status", "answer"), [
    (0, Answer.NO_ANSWER), (200, Answer.SUCCESS), (299, Answer.SUCCESS),
    (301, Answer.REDIRECT), (400, Answer.REFUSED), (410, Answer.GONE),
    (429, Answer.THROTTLED), (503, Answer.UNAVAILABLE), (500, Answer.SERVER_ERROR),
    (101, Answer.REFUSED),
])
def test_the_outcome_classifier(status: int, answer: Answer) -> None:
    assert classify(status) is answer
    assert answer.honours_retry_after == (status in (429, 503))


def test_a_fast_target_grows_its_window_up_to_the_maximum() -> None:
    s = slots(concurrency=64, per_target=20)
    assert s.cap(1) == INITIAL_WINDOW
    for _ in range(200):
        c = claim(1)
        for _ in range(s.cap(1)):
            send(s, claim(1), 0.0)  # the window is in use
        send(s, c, 0.0)
        s.answered(1, 200, duration_ms=2.0)
        for sid_claim, _ in list(s.inflight.values()):
            s.handed_over(sid_claim)
            s.free(sid_claim)
    assert s.cap(1) == 20  # never past WEBHOOKS_PER_TARGET_CONCURRENCY
    assert slots(per_target=1).cap(1) == 1  # a lower maximum is also the start


def test_a_window_grows_only_while_in_use_and_answers_stay_fast() -> None:
    s = slots(concurrency=64, per_target=64, slow_after=1.0)
    send(s, claim(1), 0.0)
    for _ in range(5):  # one at a time: a trickle never fills more than half the window
        s.answered(1, 200, duration_ms=2.0)
    assert s.cap(1) == INITIAL_WINDOW
    for _ in range(INITIAL_WINDOW):
        send(s, claim(1), 0.0)
    s.answered(1, 200, duration_ms=2.0)
    assert s.cap(1) == INITIAL_WINDOW + 1
    s.answered(1, 200, duration_ms=50.0)  # far slower than the target's usual answers
    s.answered(1, 200, duration_ms=600.0)  # over half the slow mark
    assert s.cap(1) == INITIAL_WINDOW + 1


@pytest.mark.parametrize("status", [0, 429, 503, 500])
def test_trouble_halves_the_window_then_it_grows_by_about_one_per_window(status: int) -> None:
    s = slots(concurrency=64, per_target=64)
    for _ in range(32):
        send(s, claim(1), 0.0)
    for _ in range(8):
        s.answered(1, 200, duration_ms=2.0)
        s.ready(0.0)  # the grown window sends more of what waits
    grown = INITIAL_WINDOW + 8  # one per fast answer: slow start
    assert s.cap(1) == grown
    s.answered(1, status, duration_ms=2.0)
    assert 1 in s.degraded and s.cap(1) == 1
    s.answered(1, 200, duration_ms=2.0)
    half = grown // 2
    assert s.cap(1) == half  # and no more slow start
    for _ in range(half):
        s.answered(1, 200, duration_ms=2.0)
    assert s.cap(1) == half + 1


def test_the_claim_takes_windows_as_shifted_counts() -> None:
    s = slots(concurrency=64, per_target=64)
    growing = [claim(1) for _ in range(16)]
    for c in growing:
        send(s, c, 0.0)
    for _ in growing:  # sixteen fast answers while in use: the initial window + 16
        s.answered(1, 200, duration_ms=2.0)
        s.ready(0.0)
    for c in growing:
        s.handed_over(c)
        s.free(c)
    grown = INITIAL_WINDOW + 16
    assert s.cap(1) == grown
    send(s, claim(1), 0.0)
    send(s, claim(2), 0.0)
    send(s, claim(3), 0.0)
    s.degraded.add(3)
    busy = s.claim_busy()
    # per_target=initial in the query: 1 + initial - AHEAD x grown lets AHEAD x grown - 1
    # more be held (a window sent, the rest waiting); degraded ones as they are (the query
    # holds them to one).
    assert busy == {1: 1 + INITIAL_WINDOW - AHEAD * grown,
                    2: 1 + INITIAL_WINDOW - AHEAD * INITIAL_WINDOW, 3: 1}
    assert saturated(busy, s.initial, s.degraded) == s.saturated() == [3]


def test_a_lone_fast_owner_borrows_beyond_its_share_but_not_while_another_has_work() -> None:
    s = slots(concurrency=8, per_target=8, slow_after=5.0)  # per owner 4; alone all but 2
    assert (s.per_owner, s.lone_owner) == (4, 6)
    first = claim(1, "alice")
    send(s, first, 10.0)
    assert s.owner_cap("alice") == 4  # no fast answer yet
    s.answered(1, 200, duration_ms=2.0, owner="alice")
    assert s.owner_cap("alice") == 6
    assert s.claim_busy_owners() == {"alice": 1 + 4 - AHEAD * 6}  # AHEAD x the cap held
    s.handed_over(first)
    s.free(first)
    assert s.claim_busy_owners() == {"alice": 4 - AHEAD * 6}  # nothing in flight: alone
    send(s, first, 10.0)
    send(s, claim(2, "bob"), 10.1)
    assert s.owner_cap("alice") == 4  # someone else has work: back to the share
    for c, _ in list(s.inflight.values()):
        if c.owner == "bob":
            s.handed_over(c)
            s.free(c)
    s.mark_slow(10.5)
    assert s.owner_cap("alice") == 4  # until CONTENDED_HOLD has passed
    s.mark_slow(11.2)
    assert s.owner_cap("alice") == 6
    s.answered(1, 503, owner="alice")
    assert s.cap(1) == 1 and s.owner_cap("alice") == 6  # the struggling target holds one
    s.mark_slow(80.0)
    assert s.owner_cap("alice") == 4  # no fast answer for a minute: back to the share


def test_a_hanging_attempt_shrinks_the_window_once() -> None:
    s = slots(concurrency=64, per_target=64, slow_after=1.0)
    send(s, claim(1), 0.0)
    s.mark_slow(2.0)
    s.mark_slow(3.0)
    assert 1 in s.degraded and s.windows[1].size == INITIAL_WINDOW / 2


def test_claims_wait_for_room_and_go_out_in_start_order() -> None:
    s = slots(concurrency=4, per_target=2, per_owner=4)
    first = [claim(1) for _ in range(4)]
    other = claim(2)
    for c in [*first, other]:
        s.take(c, 0.0)
    assert s.ready(0.0) == [first[0], first[1], other]  # a window of two, then the next
    assert s.sending == {1: 2, 2: 1} and s.busy == {1: 4, 2: 1}
    s.handed_over(first[0])
    s.free(first[0])
    assert s.ready(1.0) == [first[2]]
    assert s.started[first[2].id] == 1.0  # the attempt's start, not the claim's
    s.handed_over(other)
    s.free(other)
    s.mark_slow(1.5)
    assert s.degraded == {1}  # first[1] started at 0.0: too long
    assert s.stranded() == [first[3]]  # waiting behind a failing target: given back
    assert s.busy == {1: 2} and first[3].id not in s.inflight
    assert s.ready(1.5) == []


def test_the_worker_holds_ahead_of_its_slots() -> None:
    s = slots(concurrency=4, per_target=8, per_owner=4, batch_size=100)
    for n in range(AHEAD * 4):
        s.take(claim(n), 0.0)
    assert len(s.ready(0.0)) == 4 and s.wanted() == 0
    assert len(s.leftover()) == AHEAD * 4  # shutdown gives back the sent and the waiting
    assert s.inflight == {} and s.waiting == {}


def test_a_target_slow_but_answering_is_not_held_to_one_request() -> None:
    """A target that always answers 2xx in 1.5 s (over `slow_after`) is slow, not hanging:
    its attempts count as slow past SLOW_FACTOR times its answers, and its window grows."""
    s = slots(concurrency=16, per_target=8, slow_after=1.0)
    c = claim(1)
    send(s, c, 0.0)
    s.mark_slow(1.2)  # nothing known of the target yet: degraded past slow_after
    assert s.degraded == {1}
    s.answered(1, 200, duration_ms=1500.0)
    s.handed_over(c)
    s.free(c)
    assert s.degraded == set()
    now = 2.0
    for _ in range(6):
        batch = [claim(1) for _ in range(s.cap(1))]
        for b in batch:
            send(s, b, now)
        s.mark_slow(now + 1.2)
        assert s.degraded == set()  # under SLOW_FACTOR times its 1.5 s
        for b in batch:
            s.answered(1, 200, duration_ms=1500.0)
            s.handed_over(b)
            s.free(b)
        now += 1.5
    assert s.cap(1) > 2
    # Far past its usual answer, an attempt is slow again.
    hung = claim(1)
    send(s, hung, now)
    s.mark_slow(now + SLOW_FACTOR * 1.5 + 0.1)
    assert s.degraded == {1}


def test_an_owners_degraded_targets_leave_half_of_its_cap_to_its_healthy_ones() -> None:
    s = slots(concurrency=16, per_target=8, per_owner=8)
    for sid in range(1, 11):
        s.answered(sid, 503)  # ten failing targets of one owner
    assert s.degraded == set(range(1, 11))
    failing = [claim(sid) for sid in range(1, 11)]
    healthy = [claim(20) for _ in range(8)]
    for c in [*failing, *healthy]:
        s.take(c, 0.0)
    started = s.ready(0.0)
    # Before, the ten failing targets came first and took the owner's eight slots.
    assert sum(c.subscription_id != 20 for c in started) == 4
    assert sum(c.subscription_id == 20 for c in started) == s.cap(20) == 2
    # A failing attempt over, another failing target may start; healthy ones keep theirs.
    done = next(c for c in started if c.subscription_id != 20)
    s.handed_over(done)
    s.free(done)
    (again,) = s.ready(0.1)
    assert again.subscription_id != 20
