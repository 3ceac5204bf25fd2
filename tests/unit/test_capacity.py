"""The worker's adaptive capacity (service/worker/capacity.py) and the caps that follow it
in the slots, without a database."""

from __future__ import annotations

import resource
from datetime import UTC, datetime

import pytest

from service.config import DELIVERY_BYTES, ConfigError, Settings, ceiling_for
from service.worker import capacity as capacity_module
from service.worker.ahead import AHEAD
from service.worker.capacity import (
    CPU_GROW,
    CPU_HIGH,
    FLOOR,
    LAG_HIGH,
    RESERVED_FDS,
    Capacity,
    Sample,
)
from service.worker.delivery import Claim
from service.worker.slots import Slots

MB = 1 << 20
_ids = iter(range(1, 1_000_000))


def calm(peak: int, rss: int = 100 * MB, cpu: float = 0.2, lag: float = 0.001,
         owners_held: bool = False) -> Sample:
    return Sample(cpu=cpu, lag=lag, rss=rss, peak=peak, owners_held=owners_held)


def capacity(ceiling: int = 4096, budget: int = 512 * MB, nofile: int | None = 100_000
             ) -> Capacity:
    return Capacity(ceiling, memory_budget=budget, nofile=nofile)


def test_starts_at_the_floor_and_grows_while_every_slot_is_used() -> None:
    c = capacity()
    assert c.limit == FLOOR
    sizes = []
    for _ in range(20):
        sizes.append(c.decide(calm(peak=c.limit)))
    assert sizes[:3] == [128, 256, 512]  # doubling per tick
    assert sizes[-1] == 4096 and c.bound == "ceiling"  # up to the ceiling, never past it


def test_does_not_grow_without_demand_and_says_who_holds_it() -> None:
    c = capacity()
    assert c.decide(calm(peak=FLOOR - 1)) == FLOOR and c.bound == "demand"
    assert c.decide(calm(peak=10, owners_held=True)) == FLOOR and c.bound == "owner_share"


def test_cpu_pressure_stops_growth_and_shrinks_to_no_less_than_the_floor() -> None:
    c = capacity()
    for _ in range(3):
        c.decide(calm(peak=c.limit))
    grown = c.limit
    assert c.decide(calm(peak=c.limit, cpu=CPU_GROW + 0.05)) == grown and c.bound == "cpu"
    assert c.decide(calm(peak=c.limit, cpu=CPU_HIGH)) < grown and c.bound == "cpu"
    shrunk = c.limit
    # The loop runs late: with the process busy, a shrink; with the machine busy with
    # others while the process is not, a hold.
    assert c.decide(calm(peak=c.limit, lag=LAG_HIGH)) == shrunk and c.bound == "cpu"
    assert c.decide(calm(peak=c.limit, lag=LAG_HIGH, cpu=CPU_GROW)) < shrunk
    for _ in range(50):
        c.decide(calm(peak=c.limit, cpu=1.0))
    assert c.limit == FLOOR


def test_memory_budget_bounds_growth_and_shrinks_past_it() -> None:
    budget = 200 * MB
    c = capacity(budget=budget)
    # 20 deliveries' worth of room left: grown by that, not by half.
    rss = budget - 20 * DELIVERY_BYTES
    assert c.decide(calm(peak=FLOOR, rss=rss)) == FLOOR + 20 and c.bound == "memory"
    assert c.decide(calm(peak=c.limit, rss=budget)) == FLOOR + 20 and c.bound == "memory"
    assert c.decide(calm(peak=c.limit, rss=budget + 1)) < FLOOR + 20
    assert c.bound == "memory"


def test_descriptors_bound_growth_below_the_ceiling() -> None:
    c = capacity(ceiling=4096, nofile=1024)
    assert c.most == 1024 - RESERVED_FDS and c.static_bound() == "descriptors"
    for _ in range(20):
        c.decide(calm(peak=c.limit))
    assert c.limit == 1024 - RESERVED_FDS and c.bound == "descriptors"


def test_a_ceiling_below_the_floor_fixes_the_capacity() -> None:
    c = capacity(ceiling=8)
    assert c.limit == 8
    assert c.decide(calm(peak=8)) == 8 and c.bound == "ceiling"
    assert c.decide(calm(peak=8, cpu=1.0)) == 8


def test_the_default_ceiling_follows_the_memory_budget() -> None:
    assert Settings().concurrency == ceiling_for(Settings().memory_budget) >= 2000
    env = {"WEBHOOKS_MEMORY_BUDGET": "1GB"}
    assert Settings.from_env(env).concurrency == ceiling_for(1 << 30)
    assert Settings.from_env({**env, "WEBHOOKS_CONCURRENCY": "500"}).concurrency == 500
    assert Settings.from_env({"WEBHOOKS_MEMORY_BUDGET": "300m"}).memory_budget == 300 * MB
    assert Settings.from_env({"WEBHOOKS_MEMORY_BUDGET": "2"}).memory_budget == 2 * MB
    for bad in ("lots", "10kb", "-1GB"):
        with pytest.raises(ConfigError, match="WEBHOOKS_MEMORY_BUDGET"):
            Settings.from_env({"WEBHOOKS_MEMORY_BUDGET": bad})


def test_the_soft_open_files_limit_is_raised_to_the_hard_one(
        monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[int, int]] = []
    monkeypatch.setattr(resource, "getrlimit", lambda _: (1024, 4096))
    monkeypatch.setattr(resource, "setrlimit", lambda _, limits: calls.append(limits))
    assert capacity_module.raise_nofile() == (4096, 4096) and calls == [(4096, 4096)]
    assert capacity_module.connections(10_000) == 4096 - RESERVED_FDS
    # A container's 1,024 that cannot be raised: the capacity says so at start.
    monkeypatch.setattr(resource, "getrlimit", lambda _: (1024, 1024))
    c = capacity_module.for_worker(3072, 512 * MB)
    assert c.most == 1024 - RESERVED_FDS and c.static_bound() == "descriptors"


def claim(subscription_id: int, owner: str) -> Claim:
    return Claim(id=next(_ids), attempts=1, subscription_id=subscription_id, owner=owner,
                 active=True, target="http://t.example/", secret="s", event="x.create",
                 body="{}", due=datetime(2026, 1, 1, tzinfo=UTC))


def test_the_owner_share_is_half_of_the_current_capacity() -> None:
    s = Slots(64, per_target=64, batch_size=100, slow_after=1.0)
    assert s.per_owner == 32
    s.resize(2000)
    assert (s.per_owner, s.lone_owner, s.claim_min) == (1000, 1500, 100)
    # Claims held ahead: the capacity and AHEAD - 1 times 64, not AHEAD x 2,000 bodies.
    assert s.held_max == 2000 + (AHEAD - 1) * 64
    fixed = Slots(64, per_target=64, per_owner=500, batch_size=100, slow_after=1.0)
    fixed.resize(2000)
    assert fixed.per_owner == 500  # WEBHOOKS_PER_OWNER_CONCURRENCY stays what it says


def test_one_owners_slow_targets_never_take_every_slot_of_a_grown_capacity() -> None:
    s = Slots(64, per_target=64, batch_size=100, slow_after=10.0)
    s.resize(3000)
    # Owner "slow" has many subscriptions, each with claims waiting; owner "other" one.
    for sid in range(1, 2001):
        s.take(claim(sid, "slow"), 0.0)
        s.take(claim(sid, "slow"), 0.0)
    s.take(claim(9999, "other"), 0.0)
    sent = s.ready(0.0)
    by_owner = {o: sum(c.owner == o for c in sent) for o in ("slow", "other")}
    assert by_owner == {"slow": 1500, "other": 1}
    peak, held = s.take_peak()
    assert peak == 1501 and held  # the owner share, not the capacity, holds it back


def test_a_slow_mark_undone_by_a_2xx_and_slow_targets_hold_two_windows_of_claims() -> None:
    s = Slots(2000, per_target=64, batch_size=100, slow_after=1.0)
    assert s.claim_max == 250  # an eighth of a large capacity per claim
    first = claim(1, "o")
    s.take(first, 0.0)
    s.ready(0.0)
    assert s.claim_cap(1) == AHEAD * 2  # nothing known of the target yet
    s.mark_slow(1.05)  # past the slow mark before its first answer: halved, degraded
    assert s.degraded == {1} and s.cap(1) == 1
    s.answered(1, 200, duration_ms=1050.0)  # a slow target, not a hanging one
    assert s.degraded == set() and s.cap(1) == 2
    assert s.claim_cap(1) == 2 * 2  # answers in 100 ms or more: two windows ahead
    # A failure after a slow mark keeps the window halved.
    s.free(first)
    again = claim(1, "o")
    s.take(again, 2.0)
    s.ready(2.0)
    s.mark_slow(2.0 + 4 * 1.05 + 0.1)
    s.answered(1, 0)
    assert s.cap(1) == 1
