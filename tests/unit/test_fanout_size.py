"""How many captured statements each fan-out takes (service.worker.fanout.FanoutSize)."""

from __future__ import annotations

from service.worker.fanout import FANOUT_WORK, GROWTH, FanoutSize


def test_small_statements_grow_to_the_batch_size() -> None:
    size = FanoutSize(100)
    assert size.limit == GROWTH  # the first fan-out after start is small
    limits = []
    for _ in range(4):
        taken = size.limit  # a backlog: every fan-out takes all it may
        size.learn(taken, changes=taken, created=taken)  # one row, one subscriber each
        limits.append(size.limit)
    assert limits == [16, 64, 100, 100]


def test_big_statements_take_fewer() -> None:
    size = FanoutSize(100)
    size.learn(4, changes=400, created=400)  # 100-row statements, one subscriber
    assert size.limit == FANOUT_WORK // 200 == 10
    size.learn(10, changes=1_000, created=8_000)  # eight subscribers each
    assert size.limit == FANOUT_WORK // 900 == 2
    # A statement is never split: one bigger than the work alone is one fan-out.
    size.learn(2, changes=20_000, created=20_000)
    assert size.limit == 1


def test_quiet_after_a_backlog_starts_small_again() -> None:
    size = FanoutSize(100)
    for _ in range(5):
        size.learn(size.limit, changes=size.limit, created=size.limit)
    assert size.limit == 100
    size.learn(1, changes=1, created=1)  # a light load: one statement a fan-out
    assert size.limit == GROWTH
    size.learn(0, changes=0, created=0)  # nothing there: nothing learned
    assert size.limit == GROWTH


def test_a_batch_size_below_the_growth_is_kept() -> None:
    size = FanoutSize(2)
    assert size.limit == 2
    size.learn(2, changes=2, created=2)
    assert size.limit == 2
