"""Per-grid index patterns (the T/H/W offsets of a vision block's tokens), cached read-only and bounded in bytes,
and the helpers that write them into a padded ``[C, B * L]`` batch.

The per-family position builders lay an image out as ``origin + pattern`` written straight into the output
(``np.add(pattern, origin, out=view)``): one numpy call per image instead of several. Grid shapes recur (the same
resolution across a batch and across requests), so the patterns are kept, up to a byte budget.

Isolation: a cached pattern is never handed to a caller; it is read-only (``writeable`` False), so an accidental
in-place write raises instead of corrupting later answers, and answers are always fresh arrays computed from it.
"""

from __future__ import annotations

import dataclasses
import sys
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable

import numpy as np
from numpy.lib.stride_tricks import as_strided

__all__ = [
    "ENTRY_OVERHEAD_BYTES",
    "PATTERN_CACHE_BYTES",
    "PATTERN_MAX_BYTES",
    "PatternCache",
    "add_blocks",
    "copy_blocks",
    "grid_pattern",
    "key_bytes",
    "pattern",
    "place_blocks",
    "real_runs",
]

PATTERN_CACHE_BYTES = 32 * 2**20
"""Bytes all cached patterns may hold together (the oldest are dropped first)."""
PATTERN_MAX_BYTES = 4 * 2**20
"""A pattern larger than this (a grid of more than ~170k tokens) is built for the call and not kept."""
ENTRY_OVERHEAD_BYTES = 256
"""Bytes charged to every entry besides its data and its key (the array object and the dict slot): an empty pattern
(a HunYuan-VL image of fewer rows than the merge size has none) still costs memory, so the entries are bounded too."""


def key_bytes(key: object) -> int:
    """Memory of ``key``: the object, and its parts for tuples and dataclasses (the keys that grow with the input:
    GLM-Image's generated grids, MiniCPM-V's slice layout)."""
    size = sys.getsizeof(key)
    if isinstance(key, tuple):
        return size + sum(key_bytes(part) for part in key)
    if dataclasses.is_dataclass(key) and not isinstance(key, type):
        return size + sum(key_bytes(getattr(key, field.name)) for field in dataclasses.fields(key))
    return size


class PatternCache:
    """Thread-safe cache of read-only int64 arrays, bounded in bytes (``max_bytes`` in all, oldest entries dropped
    first; ``max_entry_bytes`` each: a larger pattern is returned without being stored). An entry is charged its
    data, its key and ``ENTRY_OVERHEAD_BYTES``. A hit takes no lock (one dict read; a builder runs several times a
    call, so the look-up is kept to that)."""

    def __init__(self, max_bytes: int = PATTERN_CACHE_BYTES, max_entry_bytes: int = PATTERN_MAX_BYTES) -> None:
        self.max_bytes, self.max_entry_bytes = max_bytes, max_entry_bytes
        self._patterns: OrderedDict[Hashable, tuple[np.ndarray, int]] = OrderedDict()  # (pattern, bytes charged)
        self._held = 0
        self._lock = threading.Lock()

    def get(self, key: Hashable, build: Callable[[], np.ndarray]) -> np.ndarray:
        """The pattern stored under ``key``, built by ``build()`` (and stored, read-only) on a miss."""
        found = self._patterns.get(key)
        if found is not None:
            return found[0]
        built = build()
        built.flags.writeable = False
        charged = built.nbytes + key_bytes(key) + ENTRY_OVERHEAD_BYTES
        if charged > self.max_entry_bytes:
            return built
        with self._lock:
            if key not in self._patterns:
                self._patterns[key] = (built, charged)
                self._held += charged
                while self._held > self.max_bytes:
                    self._held -= self._patterns.popitem(last=False)[1][1]
        return built

    @property
    def nbytes(self) -> int:
        """Bytes charged to the cached patterns now (data, keys and ``ENTRY_OVERHEAD_BYTES`` each)."""
        with self._lock:
            return self._held

    def __len__(self) -> int:
        return len(self._patterns)


PATTERNS = PatternCache()


def pattern(key: Hashable, build: Callable[[], np.ndarray]) -> np.ndarray:
    """:meth:`PatternCache.get` on the module's cache (keys start with the building family's name)."""
    return PATTERNS.get(key, build)


def _grid(frames: int, rows: int, columns: int) -> np.ndarray:
    values = np.empty((3, frames, rows, columns), dtype=np.int64)
    values[0] = np.arange(frames)[:, None, None]
    values[1] = np.arange(rows)[None, :, None]
    values[2] = np.arange(columns)[None, None, :]
    return values.reshape(3, -1)


def grid_pattern(frames: int, rows: int, columns: int) -> np.ndarray:
    """``[3, frames*rows*columns]`` read-only (frame, row, column) of each token of a frame-major grid."""
    return pattern(("grid", frames, rows, columns), lambda: _grid(frames, rows, columns))


BATCHED_BLOCK_TOKENS = 512
"""Blocks up to this many tokens are written with one strided assignment per pattern (a Python loop of small adds
costs more); larger ones with one in-place add each (the assignment's gather costs more)."""


def add_blocks(out: np.ndarray, starts: np.ndarray, block: np.ndarray, offsets: np.ndarray) -> None:
    """``out[:, s_i : s_i + n] = block + offsets[:, i, None]`` for every ``i``.

    ``out`` ``[C, M]`` (a view whose last axis is contiguous), ``starts`` ``[I]`` int64 of disjoint ranges,
    ``block`` ``[C, n]``, ``offsets`` ``[C, I]`` or ``[1, I]``.
    """
    size = block.shape[1]
    if size > BATCHED_BLOCK_TOKENS or starts.size == 1:
        for start, offset in zip(starts.tolist(), offsets.T[:, :, None], strict=True):
            np.add(block, offset, out=out[:, start : start + size])
        return
    # every window of ``size`` consecutive slots, as a view (the ranges are disjoint: each slot is written once)
    windows = as_strided(
        out,
        (out.shape[0], out.shape[1] - size + 1, size),
        (out.strides[0], out.strides[1], out.strides[1]),
        writeable=True,
    )
    windows[:, starts] = block[:, None, :] + offsets[:, :, None]


def copy_blocks(out: np.ndarray, starts: list[int], block: np.ndarray) -> None:
    """``out[:, s : s + n] = block`` for every ``s`` of ``starts`` (disjoint ranges), with one assignment.

    ``out`` ``[C, M]`` C-contiguous, ``block`` ``[C, n]`` (``n <= M``).
    """
    size = block.shape[1]
    # every window of ``size`` consecutive slots, as a view (the ranges are disjoint: each slot is written once)
    windows = np.ndarray(
        (out.shape[0], out.shape[1] - size + 1, size),
        out.dtype,
        buffer=out,
        strides=(out.strides[0], out.strides[1], out.strides[1]),
    )
    windows[:, starts] = block[:, None, :]


def place_blocks(
    out: np.ndarray,
    starts: np.ndarray,
    dense: np.ndarray,
    shapes: list[tuple[int, ...]],
    block_of: Callable[[tuple[int, ...]], np.ndarray],
    offsets: np.ndarray,
    slots_of: Callable[[int], np.ndarray],
) -> None:
    """Write ``block_of(shapes[i]) + offsets[:, i]`` for every block ``i``, grouped by shape: at
    ``out[:, starts[i]:]`` when ``dense[i]`` (its tokens are consecutive slots), else at ``out[:, slots_of(i)]``.

    ``out`` ``[C, M]``, ``starts`` ``[I]`` int64, ``dense`` ``[I]`` bool, ``offsets`` ``[C or 1, I]``.
    """
    groups: dict[tuple[int, ...], list[int]] = {}
    for index, shape in enumerate(shapes):
        groups.setdefault(shape, []).append(index)
    for shape, members in groups.items():
        block, chosen = block_of(shape), np.array(members)
        one_run = chosen[dense[chosen]]
        add_blocks(out, starts[one_run], block, offsets[:, one_run])
        for index in chosen[~dense[chosen]].tolist():
            out[:, slots_of(index)] = block + offsets[:, index, None]


def real_runs(mask: np.ndarray, lengths: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``([B] slot of each row's first real token, [B] whether the row's real tokens are one run of slots)`` of a
    ``[B, L]`` mask with ``lengths`` real tokens per row (counted here when None, and only when some row is not one
    run; left or right padding: one run; an empty row: one run)."""
    rows, width = mask.shape
    if not width:
        return np.zeros(rows, dtype=np.int64), np.ones(rows, dtype=bool)
    first = mask.argmax(axis=1)
    # every row real from its first real slot to the last column (left padding): each row holds at most
    # ``width - first`` real slots, so the totals agree only when all do (an empty row holds 0 of ``width``)
    if np.count_nonzero(mask) == rows * width - int(first.sum()):
        return first, np.ones(rows, dtype=bool)
    runs = np.count_nonzero(mask[:, 1:] > mask[:, :-1]) + np.count_nonzero(mask[:, 0])  # runs of real slots
    if runs == np.count_nonzero(mask[np.arange(rows), first]):  # one per non-empty row (the usual batch)
        return first, np.ones(rows, dtype=bool)
    if lengths is None:
        lengths = mask.sum(axis=1)
    last = width - 1 - mask[:, ::-1].argmax(axis=1)
    return first, (last - first + 1 == lengths) | (lengths == 0)
