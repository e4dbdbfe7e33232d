"""cancel_all ends tasks even when a cancellation is lost on the way (as Python 3.11's
asyncio.wait_for can lose one)."""

from __future__ import annotations

import asyncio

from lowtide.background import cancel_all


async def test_a_task_that_loses_its_first_cancellation_is_cancelled_again() -> None:
    swallowed = 0

    async def swallows_one() -> None:
        nonlocal swallowed
        while True:
            try:
                await asyncio.sleep(0.01)
            except asyncio.CancelledError:
                if swallowed:
                    raise
                swallowed += 1  # lost, as in the library; the loop goes on

    async def fails() -> None:
        raise RuntimeError("already broken")

    loop_task = asyncio.create_task(swallows_one())
    broken = asyncio.create_task(fails())
    await asyncio.sleep(0.05)
    await asyncio.wait_for(cancel_all([loop_task, broken], again_after=0.05), 2.0)
    assert loop_task.cancelled() and swallowed == 1
    assert isinstance(broken.exception(), RuntimeError)
