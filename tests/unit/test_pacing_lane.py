"""When the claim also takes the first due delivery of other queues (service/worker/
pacing.py: the lane that others_due walks), without a database."""

from __future__ import annotations

from datetime import UTC, datetime

from service.worker.delivery import Claim
from service.worker.pacing import LANE_EVERY, LANE_SPACING, Pacing
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
    p.lane_ran(42, 100.0, 100.001)
    assert p.lane_after == 42
    assert not p.lane_due(100.0 + LANE_EVERY / 2)
    assert p.lane_due(100.0 + LANE_EVERY)
    # A walk that took 20 ms: the next one waits LANE_SPACING times as long.
    p.lane_ran(0, 200.0, 200.02)
    assert not p.lane_due(200.0 + LANE_SPACING * 0.02 - 0.01)
    assert p.lane_due(200.0 + LANE_SPACING * 0.02 + 0.001)
    p.claimed([], 4, 300.0)  # the queue drained
    assert not p.lane_due(400.0)


def test_the_claim_gets_what_the_lane_found() -> None:
    p = pacing()
    created = [NOW]
    params = p.claim_params(10, {"last": 0, "ids": [7], "created": created})
    assert params["extra_ids"] == [7] and params["extra_created"] == created
    params = p.claim_params(10)
    assert params["extra_ids"] == [] and params["extra_created"] == []
