"""The conditional-NOTIFY protocol's decisions (service/worker/wakeup.py), without a database."""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import pytest

from service.store import Store, StoreUnavailable
from service.worker.wakeup import RECHECK_MIN, Step, Wakeup

BATCH = 10
POLL = 1.0


@dataclass
class FakeListener:
    pid: int | None = None


def armed(pid: int = 42, at: float = 100.0) -> tuple[Wakeup, FakeListener]:
    listener = FakeListener(pid)
    w = Wakeup(listener, batch_size=BATCH, poll_interval=POLL)
    w.armed_pid, w.armed_at = pid, at
    return w, listener


def test_a_new_worker_fans_out_at_once_and_arms_after_an_empty_outbox() -> None:
    w = Wakeup(FakeListener(7), batch_size=BATCH, poll_interval=POLL)
    assert w.fanout_due(0.0)
    assert not w.fanout_due(0.01)  # just checked, and nothing notified it
    assert w.decide(taken=0) is Step.ARM


def test_no_listener_yet_means_no_arming() -> None:
    w = Wakeup(FakeListener(None), batch_size=BATCH, poll_interval=POLL)
    assert w.decide(taken=0) is Step.KEEP


def test_a_full_batch_disarms_and_a_partial_one_keeps_the_row() -> None:
    w, _ = armed()
    assert w.decide(taken=BATCH) is Step.DISARM
    assert w.decide(taken=BATCH + 5) is Step.DISARM
    assert w.decide(taken=3) is Step.KEEP  # a light, steady load stays armed
    assert w.decide(taken=0) is Step.KEEP  # armed already with this listener


def test_a_backlog_when_not_armed_changes_nothing() -> None:
    w = Wakeup(FakeListener(7), batch_size=BATCH, poll_interval=POLL)
    assert w.decide(taken=BATCH) is Step.KEEP


def test_a_reconnected_listener_is_armed_again() -> None:
    w, listener = armed(pid=42)
    listener.pid = 43
    assert w.decide(taken=0) is Step.ARM


def test_not_armed_or_armed_with_a_gone_listener_checks_every_recheck_min() -> None:
    w = Wakeup(FakeListener(7), batch_size=BATCH, poll_interval=POLL)
    assert w.interval(1000.0) == RECHECK_MIN
    w, listener = armed(pid=42, at=0.0)
    listener.pid = None  # reconnecting: no NOTIFY can come
    assert w.interval(1000.0) == RECHECK_MIN
    listener.pid = 99
    assert w.interval(1000.0) == RECHECK_MIN


@pytest.mark.parametrize(("since", "expected"), [
    (0.0, RECHECK_MIN), (0.01, RECHECK_MIN), (0.2, 0.2), (0.4, 0.4), (5.0, POLL),
])
def test_after_arming_rechecks_back_off_up_to_the_poll_interval(since: float,
                                                                expected: float) -> None:
    w, _ = armed(at=100.0)
    assert w.interval(100.0 + since) == pytest.approx(expected)


def test_a_notification_makes_the_outbox_due_and_a_failure_keeps_it_due() -> None:
    w, _ = armed(at=0.0)
    assert w.fanout_due(10.0)
    assert not w.fanout_due(10.1)
    w.notified()
    assert w.fanout_due(10.2)
    w.fanout_failed()
    assert w.fanout_due(10.2)
    assert not w.fanout_due(10.2)


def test_the_interval_passing_makes_the_outbox_due() -> None:
    w, _ = armed(at=0.0)  # armed long ago: the interval is the poll interval
    assert w.fanout_due(10.0)
    assert w.until_fanout(10.5) == pytest.approx(0.5)
    assert not w.fanout_due(10.5)
    assert w.fanout_due(11.0)


class FakeStore:
    """Records the statements the protocol runs, by query name."""

    def __init__(self, fail: bool = False) -> None:
        self.calls: list[tuple[str, dict[str, object]]] = []
        self.fail = fail

    async def _run(self, name: str, params: dict[str, object]) -> None:
        if self.fail:
            raise StoreUnavailable("down")
        self.calls.append((name, params))

    async def arm_wakeup(self, *, pid: int | None, old_pid: int | None) -> None:
        await self._run("wakeup_arm", {"pid": pid, "old_pid": old_pid})

    async def disarm_wakeup(self, *, pid: int) -> None:
        await self._run("wakeup_disarm", {"pid": pid})


async def test_arming_replaces_the_old_pid_and_asks_for_one_more_look() -> None:
    w, listener = armed(pid=42)
    listener.pid = 43
    fake = FakeStore()
    store = cast(Store, fake)
    w.fanout_due(200.0)
    assert await w.after_fanout(store, taken=0, now=200.0) is Step.ARM
    assert fake.calls == [("wakeup_arm", {"pid": 43, "old_pid": 42})]
    assert (w.armed_pid, w.armed_at) == (43, 200.0)
    assert w.fanout_due(200.0)  # a commit may have raced the arming


async def test_disarming_forgets_the_row_even_when_the_delete_fails() -> None:
    w, _ = armed(pid=42)
    store = cast(Store, FakeStore(fail=True))
    assert await w.after_fanout(store, taken=BATCH, now=1.0) is Step.DISARM
    assert w.armed_pid is None and w.armed_at is None
    await w.disarm(store)  # not armed: nothing to do


def test_a_worker_disarmed_by_a_backlog_arms_again_once_it_keeps_up() -> None:
    # A steady load leaves a few statements for every check: the outbox is never empty.
    w = Wakeup(FakeListener(7), batch_size=BATCH, poll_interval=POLL)
    assert w.decide(taken=BATCH // 2) is Step.ARM
    assert w.decide(taken=1) is Step.ARM
    # Between half and a full batch the state is kept either way: no flapping.
    assert w.decide(taken=BATCH // 2 + 1) is Step.KEEP
    w, _ = armed()
    assert w.decide(taken=BATCH - 1) is Step.KEEP


async def test_a_fan_out_that_took_something_starts_the_rechecks_again() -> None:
    # Writers that did not hold the wakeup's token did not notify: what they committed
    # after the notifying one's fan-out is looked for RECHECK_MIN later, not at the
    # backed-off interval.
    w, _ = armed(at=100.0)
    assert w.interval(100.9) == pytest.approx(0.9)
    assert await w.after_fanout(cast(Store, None), taken=2, now=100.9) is Step.KEEP
    assert w.interval(100.9) == RECHECK_MIN
    assert w.interval(101.2) == pytest.approx(0.3)
    # An empty fan-out keeps backing off.
    assert await w.after_fanout(cast(Store, None), taken=0, now=101.2) is Step.KEEP
    assert w.interval(101.5) == pytest.approx(0.6)
