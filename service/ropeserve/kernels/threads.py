"""Threads of the CPU work: work sharing for the kernels, and serial torch ops on the event loop.

Kernels: the calling thread plus a small pool claim pieces from a shared counter. Pieces are claimed (not
assigned), so a thread that the OS deschedules (the cores are shared with the event loop and other processes)
only delays the piece it holds; the others finish the rest.

Event loop: small requests run their torch ops inline (``api.inline``). An op that opens an OpenMP parallel
region waits for every thread of the team, and on a loaded machine one of them is often descheduled: a 1,000-
element ``repeat_interleave`` took 1-5 ms instead of 5 us while two other processes kept the 2 cores busy.
``serial_torch`` makes the regions opened from the calling thread serial for the duration of a block (OpenMP keeps
the thread count per thread), so the loop never waits on a team while worker threads keep torch's default.
"""

from __future__ import annotations

import ctypes
import itertools
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

import torch

Piece = TypeVar("Piece")

_POOL: list[ThreadPoolExecutor] = []
_POOL_LOCK = threading.Lock()


def _pool() -> ThreadPoolExecutor:
    """The helper threads (one fewer than the cores), created on first use."""
    with _POOL_LOCK:
        if not _POOL:
            workers = max(1, (os.cpu_count() or 1) - 1)
            _POOL.append(ThreadPoolExecutor(max_workers=workers, thread_name_prefix="ropeserve-kernel"))
        return _POOL[0]


def run_on_all_threads(drain: Callable[[], None], tasks: int) -> None:
    """Run ``drain`` in the calling thread and in up to ``torch.get_num_threads() - 1`` helper threads."""
    helpers = [_pool().submit(drain) for _ in range(min(torch.get_num_threads(), tasks) - 1)]
    drain()
    for helper in helpers:
        helper.result()


def share_pieces(pieces: Sequence[Piece], work: Callable[[Piece], None]) -> None:
    """Call ``work`` once per piece, the pieces claimed in order by all threads (see ``run_on_all_threads``)."""
    claim = itertools.count().__next__

    def drain() -> None:
        while (index := claim()) < len(pieces):
            work(pieces[index])

    run_on_all_threads(drain, len(pieces))


def _openmp_runtime() -> ctypes.CDLL | None:
    """The OpenMP runtime torch runs on (its bundled libgomp, or one already loaded), or None."""
    bundled = sorted((Path(torch.__file__).parent / "lib").glob("libgomp*.so*"))
    candidates = [str(path) for path in bundled] + [None]
    for candidate in candidates:
        try:
            runtime = ctypes.CDLL(candidate, mode=os.RTLD_NOLOAD if candidate else os.RTLD_LOCAL)
        except OSError:
            continue
        if hasattr(runtime, "omp_set_num_threads"):
            return runtime
    return None


class serial_torch:  # noqa: N801 - used as the context manager function it replaced
    """Within the block, torch's intra-op parallel regions opened from the calling thread run on that thread
    alone (other threads keep their count); the count is restored after. For short synchronous work only: a
    block must not await (another task would run with the serial count). A no-op without OpenMP.

    A class, not a ``contextlib.contextmanager`` generator: every small request on the event loop enters it
    (``api.inline.run_inline``, with ``without_growth_wait``: 2.9 us per call as generators, 1.3 us as classes)."""

    __slots__ = ("threads",)

    def __enter__(self) -> None:
        self.threads = torch.get_num_threads()  # torch sets a thread's count on its first use: do it first
        if _OPENMP is not None and self.threads != 1:
            _OPENMP.omp_set_num_threads(1)

    def __exit__(self, *exc_info: object) -> None:
        if _OPENMP is not None and self.threads != 1:
            _OPENMP.omp_set_num_threads(self.threads)


_OPENMP = _openmp_runtime()
