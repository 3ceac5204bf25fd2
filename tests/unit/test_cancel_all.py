"""Shutdown ends every side task, even one whose cancellation was lost once."""

from __future__ import annotations

import asyncio

from service.worker.supervise import cancel_all


async def _loses_one_cancellation(swallowed: list[int]) -> None:
    """A loop that swallows the first cancellation, as a library race can (3.11's
    asyncio.wait_for returning a result that came with the cancellation), then goes on."""
    while True:
        try:
            await asyncio.sleep(0.05)
        except asyncio.CancelledError:
            if swallowed:
                raise
            swallowed.append(1)


async def test_a_task_that_lost_its_cancellation_is_cancelled_again() -> None:
    swallowed: list[int] = []
    lossy = asyncio.create_task(_loses_one_cancellation(swallowed))
    plain = asyncio.create_task(asyncio.sleep(3600))
    await asyncio.sleep(0)
    async with asyncio.timeout(10):  # a lost cancellation once meant waiting forever
        await cancel_all([lossy, plain], again_after=0.05)
    assert swallowed == [1]
    assert lossy.cancelled() and plain.cancelled()


async def test_nothing_to_cancel() -> None:
    await cancel_all([])
