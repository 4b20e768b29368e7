"""Where a JSON route's work runs: on the event loop when small, in the threadpool when large.

A sync FastAPI route always pays a hop to a worker thread and back (on 2 cores about as long as computing a
small answer: ``benchmarks/bench_small.py``). Routes are ``async`` and hand their work here with an upper bound of
the positions (tokens, bytes for the linter) it touches: up to ``INLINE_MAX_POSITIONS`` it runs at once, beyond
that in the threadpool, so a large request never stalls probes and other requests on the loop.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TypeVar

from starlette.concurrency import run_in_threadpool

from ropeserve.kernels.threads import serial_torch
from ropeserve.rope.tables import without_growth_wait

T = TypeVar("T")
INLINE_MAX_POSITIONS = 4096
"""Largest work bound run on the event loop (cos/sin of 16 positions x 128: 0.014 ms of CPU; 4,096: 0.7 ms)."""
INLINE_MAX_BODY_BYTES = 64 * 1024
"""Bodies the linter checks on the event loop (one config.json is a few kB)."""
INLINE_BUILD_ELEMENTS = 1 << 16
"""Most cos/sin table elements a request may compute on the event loop (a cache miss, or a far position growing a
cached table); a larger build runs in the threadpool. (A rotation grows its table in the kernel thread anyway.)"""


async def run_sized(
    size: int, work: Callable[[], T], limit: int = INLINE_MAX_POSITIONS, *, uses_torch: bool = True
) -> T:
    """``work()`` inline when ``size <= limit`` (its torch ops serial: ``run_inline``; work that never calls torch,
    such as the linter, without those guards), else in the threadpool."""
    if size <= limit:
        return run_inline(work) if uses_torch else work()
    return await run_in_threadpool(work)


def run_inline(work: Callable[[], T]) -> T:
    """``work()`` on the event loop with torch's intra-op parallelism off for it (``kernels.threads.serial_torch``:
    a small op that opens an OpenMP region waits for every thread of the team, for milliseconds when one of them
    is descheduled on a loaded machine), and never waiting for a cos/sin table that another thread is growing
    (``rope.tables.without_growth_wait``: its few positions are computed directly)."""
    with serial_torch(), without_growth_wait():
        return work()


def total(values: Iterable[object]) -> int:
    """Sum of the int values (others count 0): a bound taken before validation, never trusted as a result."""
    return sum(value for value in values if isinstance(value, int))
