"""Idle timeouts of request bodies without a timer per body piece.

``asyncio.timeout`` around each ``receive()`` arms a timer and cancels it again, about 3 us of a small request
that costs 60-80 us in all (``benchmarks/bench_small.py``). ``IdleWatch`` instead notes when each waiting task
must have its next piece, and one watchdog task per event loop, alive only while some task waits, wakes every
``timeout_s / WAKES_PER_TIMEOUT`` and cancels the tasks past their deadline; their ``receive`` raises
``TimeoutError``. A wait is thus cut between ``timeout_s`` and ``(1 + 1 / WAKES_PER_TIMEOUT) * timeout_s``. A
task cancelled by anyone else stays cancelled (``Task.uncancel`` counts the requests, as ``asyncio.timeout`` does).
"""

from __future__ import annotations

import asyncio
import weakref

from starlette.types import Message, Receive

WAKES_PER_TIMEOUT = 8
"""Watchdog wake-ups per timeout: the precision of the cut."""


class IdleWatch:
    """Deadlines of the tasks of one event loop that wait for a body piece."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.deadlines: dict[asyncio.Task[object], float] = {}
        self.expired: set[asyncio.Task[object]] = set()
        self.watchdog: asyncio.Task[None] | None = None

    async def receive(self, receive: Receive) -> Message:
        """``await receive()`` for the current task; ``TimeoutError`` once it waited longer than ``timeout_s``."""
        task = asyncio.current_task()
        assert task is not None  # called from a request's task
        loop = task.get_loop()
        self.deadlines[task] = loop.time() + self.timeout_s
        if self.watchdog is None:
            self.watchdog = loop.create_task(self._watch(loop))
        try:
            return await receive()
        except asyncio.CancelledError:
            if task in self.expired and task.uncancel() == 0:
                raise TimeoutError from None
            raise
        finally:
            del self.deadlines[task]
            self.expired.discard(task)

    async def _watch(self, loop: asyncio.AbstractEventLoop) -> None:
        try:
            while self.deadlines:
                await asyncio.sleep(self.timeout_s / WAKES_PER_TIMEOUT)
                now = loop.time()
                for task, deadline in list(self.deadlines.items()):
                    if deadline <= now and task not in self.expired:
                        self.expired.add(task)
                        task.cancel()
        finally:
            self.watchdog = None


class IdleWatches:
    """One ``IdleWatch`` per event loop (a test client runs each app in a loop of its own)."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.by_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, IdleWatch] = weakref.WeakKeyDictionary()

    def of_running_loop(self) -> IdleWatch:
        loop = asyncio.get_running_loop()
        watch = self.by_loop.get(loop)
        if watch is None:
            watch = self.by_loop[loop] = IdleWatch(self.timeout_s)
        return watch
