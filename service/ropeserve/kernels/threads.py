"""Work sharing for the CPU kernels: the calling thread plus a small pool claim pieces from a shared counter.

Pieces are claimed (not assigned), so a thread that the OS deschedules (the cores are shared with the event
loop and other processes) only delays the piece it holds; the others finish the rest.
"""

from __future__ import annotations

import itertools
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
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
