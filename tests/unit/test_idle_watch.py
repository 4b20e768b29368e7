"""The body idle timeout's watchdog (``api/idle_watch.py``): a stalled receive raises TimeoutError, and only it;
a cancellation from elsewhere stays a cancellation; nothing is left behind."""

from __future__ import annotations

import asyncio

import pytest

from ropeserve.api.idle_watch import IdleWatch, IdleWatches

TIMEOUT_S = 0.05
MESSAGE = {"type": "http.request", "body": b"{}", "more_body": False}


async def never() -> dict[str, object]:
    await asyncio.Event().wait()
    raise AssertionError("unreachable")


async def at_once() -> dict[str, object]:
    return MESSAGE


def test_a_stalled_receive_times_out_not_before_the_deadline() -> None:
    async def run() -> float:
        watch = IdleWatch(TIMEOUT_S)
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(TimeoutError):
            await watch.receive(never)
        assert not watch.deadlines and not watch.expired
        return loop.time() - started

    assert asyncio.run(run()) >= TIMEOUT_S


def test_a_piece_that_arrives_is_returned_and_the_watchdog_ends() -> None:
    async def run() -> None:
        watch = IdleWatch(TIMEOUT_S)
        assert await watch.receive(at_once) == MESSAGE
        assert not watch.deadlines
        assert watch.watchdog is not None
        await asyncio.wait_for(asyncio.shield(watch.watchdog), 10)
        assert watch.watchdog is None

    asyncio.run(run())


def test_only_the_stalled_one_of_concurrent_receives_times_out() -> None:
    """Two tasks wait at once; the second one's deadline is moved an hour ahead once it is registered, so the
    watchdog's wake-ups find one task past its deadline and one within it however slow the machine is."""

    async def run() -> None:
        watch = IdleWatch(TIMEOUT_S)
        arrived = asyncio.Event()

        async def late() -> dict[str, object]:
            await arrived.wait()
            return MESSAGE

        stalled = asyncio.create_task(watch.receive(never))
        waiting = asyncio.create_task(watch.receive(late))
        await asyncio.sleep(0)  # both registered
        watch.deadlines[waiting] += 3600
        with pytest.raises(TimeoutError):
            await stalled
        assert not waiting.done()
        arrived.set()
        assert await waiting == MESSAGE
        assert not watch.deadlines and not watch.expired

    asyncio.run(run())


def test_a_cancellation_from_elsewhere_stays_a_cancellation() -> None:
    async def run() -> None:
        watch = IdleWatch(3600)
        task = asyncio.create_task(watch.receive(never))
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert not watch.deadlines and not watch.expired

    asyncio.run(run())


def test_a_task_cancelled_by_its_caller_and_the_watchdog_is_cancelled() -> None:
    async def run() -> None:
        watch = IdleWatch(3600)
        task = asyncio.create_task(watch.receive(never))
        await asyncio.sleep(0)
        watch.expired.add(task)  # what the watchdog does at the deadline
        task.cancel()
        task.cancel()  # and the caller, before the task ran again
        with pytest.raises(asyncio.CancelledError):
            await task
        assert not watch.deadlines and not watch.expired

    asyncio.run(run())


def test_each_event_loop_has_its_own_watch() -> None:
    watches = IdleWatches(TIMEOUT_S)

    async def watch_of_this_loop() -> IdleWatch:
        return watches.of_running_loop()

    async def same_loop_twice() -> bool:
        return watches.of_running_loop() is watches.of_running_loop()

    assert asyncio.run(same_loop_twice())
    assert asyncio.run(watch_of_this_loop()) is not asyncio.run(watch_of_this_loop())
