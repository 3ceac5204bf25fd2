"""When the claim also takes the first due delivery of other queues (service/worker/
pacing.py: the lane that others_due walks), without a database."""

from __future__ import annotations

from datetime import UTC, datetime

from service.store.worker import OthersDue
from service.worker.delivery import Claim
from service.worker.pacing import LANE_EVERY, LANE_SPACING, LANE_TAKE, Lane, Pacing
from service.worker.slots import Slots

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def pacing() -> Pacing:
    return Pacing(Slots(8, per_target=2, batch_size=100, slow_after=1.0), lease=60.0,
                  scan=100)


def claim(i: int) -> Claim:
    return Claim(id=i, attempts=1, subscription_id=1, owner="o", active=True,
                 target="http://t.example/", secret="s", event="x.create", body="{}",
                 due=NOW)


def test_the_lane_runs_only_while_claims_find_work_and_at_most_every_lane_every() -> None:
    p = pacing()
    assert not p.lane_due(100.0)  # nothing claimed yet: an idle queue walks nothing
    p.claimed([claim(1)], 4, 100.0)
    assert p.lane_due(100.0)
    p.lane_ran({"last": 42, "sids": [], "owners": [], "created": []}, 100.0, 100.001)
    assert p.lane_after == 42
    assert not p.lane_due(100.0 + LANE_EVERY / 2)
    assert p.lane_due(100.0 + LANE_EVERY)
    # A walk that took 20 ms: the next one waits LANE_SPACING times as long.
    p.lane_ran(None, 200.0, 200.02)
    assert not p.lane_due(200.0 + LANE_SPACING * 0.02 - 0.01)
    assert p.lane_due(200.0 + LANE_SPACING * 0.02 + 0.001)
    p.claimed([], 4, 300.0)  # the queue drained
    assert not p.lane_due(400.0)


def found(*queues: tuple[int, str]) -> OthersDue:
    return {"last": 0, "sids": [sid for sid, _ in queues],
            "owners": [owner for _, owner in queues], "created": [NOW] * len(queues)}


def claim_of(sid: int, i: int = 0) -> Claim:
    return Claim(id=i or sid, attempts=1, subscription_id=sid, owner="o", active=True,
                 target="http://t.example/", secret="s", event="x.create", body="{}",
                 due=NOW)


def test_the_claims_take_from_the_queues_the_lane_found_while_they_have_due_ones() -> None:
    p = pacing()
    assert p.claim_params(10)["lane_sids"] == []
    p.lane_ran(found((7, "a"), (9, "b")), 100.0, 100.001)
    params = p.claim_params(10)
    assert params["lane_sids"] == [7, 9] and params["lane_since"] == [NOW, NOW]
    # A claim filled by the lane's queues says nothing of what is left: both are kept.
    p.claimed([claim_of(7, i) for i in range(10)], 10, 100.0)
    assert p.claim_params(10)["lane_sids"] == [7, 9]
    # One that took from 7 only, filled up with other queues' deliveries: 9 had nothing
    # due any more (the claim takes the lane's queues first).
    p.claimed([claim_of(7), *(claim_of(1, i) for i in range(100, 109))], 10, 100.0)
    assert p.claim_params(10)["lane_sids"] == [7]
    # 7 at its cap (its claims held: AHEAD times its window) is held back, not dropped.
    for i in range(p.slots.claim_cap(7)):
        p.slots.take(claim_of(7, 100 + i), 100.0)
    params = p.claim_params(10)
    assert 7 in params["saturated"] and params["lane_sids"] == [7]
    p.claimed([], 10, 100.0)
    assert p.claim_params(10)["lane_sids"] == [7]


def test_the_lane_keeps_its_queues_one_per_owner_first() -> None:
    lane = Lane()
    big = list(range(1, LANE_TAKE + 1))
    lane.found(found(*((sid, "big") for sid in big)))
    assert list(lane.queues) == big
    # Queues already kept go before new ones of the same owner.
    lane.found(found((0, "big")))
    assert sorted(lane.queues) == big
    # Another owner's queues found later take turns with the first owner's: the first
    # owner's last ones make room.
    lane.found(found((1000, "small"), (2000, "small")))
    assert sorted(lane.queues) == [*big[:-2], 1000, 2000]


def test_a_leasing_fan_out_that_found_work_due_makes_the_next_fan_out_claim() -> None:
    """A quiet queue's fan-out leases what it makes; when it finds deliveries due that it
    did not lease, the claim is due and the queue is no longer taken for quiet, so a
    notification that comes before the next step brings a fan-out with a claim beside it,
    not another leasing one that finds the same deliveries due and leases nothing."""
    p = pacing()
    p.claimed([], 4, 100.0)  # a claim found the queue drained
    p.next_due(None, 100.0)
    assert p.quiet(100.1) and p.idle(100.1) is not None
    p.not_quiet()
    assert not p.quiet(100.1)
    assert p.idle(100.1) is None  # the claim is due at once
    p.claimed([claim(1)], 4, 100.2)  # it claimed what was due, and found no more
    assert p.quiet(100.2)
