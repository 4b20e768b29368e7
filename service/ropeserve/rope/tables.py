"""cos/sin tables for 1-D positions, with a bounded cache shared across requests.

Exactness model (transformers 5.24, spec §4.1): ``angle = float32(p) · inv_freq`` (one float32 multiply),
``cos(angle) · attention_factor`` in float32, then a cast to the output dtype. A cached table row is the
same elementwise computation, so gathering rows is bit-identical to computing them directly.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from functools import partial

import torch

from ropeserve.config import ROPE_TYPES, RopeParams
from ropeserve.config.families import Pairing as Pairing  # re-exported: the rope modules import it from here
from ropeserve.rope.registry import compute_inv_freq

PAIRINGS: tuple[Pairing, ...] = ("neox", "gptj")
TABLE_ROW_CAP = 1 << 18
TABLE_BYTE_CAP = 64 * 2**20
"""A cached table holds at most TABLE_ROW_CAP rows and TABLE_BYTE_CAP bytes (cos + sin), and never more than its
cache's byte budget; positions beyond its ``row_cap`` are computed directly instead (same values, no caching)."""
TABLE_CACHE_BYTES = 256 * 2**20
"""Default byte budget of a ``TableCache``: the cos/sin rows of all its tables together (4 tables at TABLE_BYTE_CAP)."""
MAX_POSITION = 2**31 - 1
"""Largest position the service accepts (int32 range; float32 angles are inexact far below it anyway)."""


_WAIT_FOR_GROWTH: ContextVar[bool] = ContextVar("ropeserve_wait_for_growth", default=True)


class without_growth_wait:  # noqa: N801 - used as the context manager function it replaced
    """Within the block (work on the event loop), a table that another thread is growing is not waited for: the
    positions asked are computed directly instead (the same values). The growth may be large (up to the table's
    byte cap), and the event loop must not wait for it. (A class: cheaper to enter than a generator.)"""

    __slots__ = ("token",)

    def __enter__(self) -> None:
        self.token = _WAIT_FOR_GROWTH.set(False)

    def __exit__(self, *exc_info: object) -> None:
        _WAIT_FOR_GROWTH.reset(self.token)


def effective_length(params: RopeParams, max_position: int, seq_len_cached: int | None = None) -> int | None:
    """The ``seq_len`` a length-dependent rope type uses for positions up to ``max_position`` (its
    ``run_length``: dynamic's hysteresis, longrope's long/short switch); ``None`` for the other types."""
    run_length = ROPE_TYPES[params.rope_type].run_length
    return None if run_length is None else run_length(params, max_position, seq_len_cached)


def _length_key(params: RopeParams, seq_len: int | None) -> int | None:
    """Collapse lengths that give identical frequencies (the type's ``length_class``)."""
    length_class = ROPE_TYPES[params.rope_type].length_class
    if seq_len is None or length_class is None:
        return None
    return length_class(params, seq_len)


def _cache_key(params: RopeParams, seq_len: int | None, device: torch.device) -> tuple[object, ...]:
    return (params, _length_key(params, seq_len), str(device))


@dataclass
class RopeTable:
    """Frequencies and a lazily grown half-width table for one (params, length, device).

    ``rows``: (cos, sin), each [rows, n_freq] float32, already multiplied by ``attention_factor``. Growth is
    serialised and monotonic: the pair is replaced as one tuple, only by a longer one, so a reader that took a
    snapshot covering its positions (``rows_covering``) may gather from it whatever other threads do.
    ``byte_cap`` bounds the rows' bytes (cos + sin); ``on_grow`` runs after each growth (the cache's accounting).
    """

    inv_freq: torch.Tensor
    attention_factor: float
    rows: tuple[torch.Tensor, torch.Tensor]
    byte_cap: int = TABLE_BYTE_CAP
    on_grow: Callable[[RopeTable], None] | None = field(default=None, repr=False, compare=False)
    _growth_lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    @classmethod
    def build(
        cls,
        params: RopeParams,
        seq_len: int | None,
        device: torch.device,
        byte_cap: int = TABLE_BYTE_CAP,
        on_grow: Callable[[RopeTable], None] | None = None,
    ) -> RopeTable:
        inv_freq, attention_factor = compute_inv_freq(params, seq_len)
        inv_freq = inv_freq.to(device)
        empty = torch.empty(0, inv_freq.numel(), dtype=torch.float32, device=device)
        return cls(inv_freq, float(attention_factor), (empty, empty), min(byte_cap, TABLE_BYTE_CAP), on_grow)

    def half_angles(self, positions: torch.Tensor) -> torch.Tensor:
        """``float32(p) · inv_freq``: [*positions.shape, n_freq] float32."""
        return positions.to(device=self.inv_freq.device, dtype=torch.float32)[..., None] * self.inv_freq

    def compute_half(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Scaled cos/sin for ``positions`` straight from the formula: 2 × [*positions.shape, n_freq]."""
        angles = self.half_angles(positions)
        return angles.cos() * self.attention_factor, angles.sin() * self.attention_factor

    @property
    def row_cap(self) -> int:
        """Most rows this table may grow to: TABLE_ROW_CAP, fewer for wide heads or a small ``byte_cap``."""
        return min(TABLE_ROW_CAP, self.byte_cap // (8 * max(self.inv_freq.numel(), 1)))

    @property
    def nbytes(self) -> int:
        """Bytes of the cached rows (cos + sin)."""
        cos_rows, sin_rows = self.rows
        return cos_rows.nbytes + sin_rows.nbytes

    def rows_to_cover(self, max_position: int) -> int:
        """Rows the table grows to for ``0..max_position`` (a power of two, at most ``row_cap``)."""
        return min(self.row_cap, 1 << max(max_position, 1).bit_length())

    def growth_elements(self, max_position: int) -> int:
        """Elements (cos + sin) that covering ``0..max_position`` computes now: the grown table's, or 0 when its
        rows already cover it or it lies past ``row_cap`` (such positions are computed one by one)."""
        if max_position < self.rows[0].shape[0] or max_position >= self.row_cap:
            return 0
        return 2 * self.rows_to_cover(max_position) * self.inv_freq.numel()

    def rows_covering(self, max_position: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """A snapshot of the rows (cos, sin) covering ``0..max_position``, grown to a power of two as needed;
        None beyond ``row_cap``, or while another thread grows the table within ``without_growth_wait``. Each
        [rows, n_freq] float32 with rows > ``max_position``."""
        if max_position >= self.row_cap:
            return None
        snapshot = self.rows
        if max_position < snapshot[0].shape[0]:
            return snapshot
        if not self._growth_lock.acquire(blocking=_WAIT_FOR_GROWTH.get()):
            return None
        try:
            snapshot = self.rows
            if max_position < snapshot[0].shape[0]:  # another thread grew it meanwhile
                return snapshot
            snapshot = self.compute_half(torch.arange(self.rows_to_cover(max_position), device=self.inv_freq.device))
            self.rows = snapshot
        finally:
            self._growth_lock.release()
        if self.on_grow is not None:
            self.on_grow(self)
        return snapshot

    def gather_half(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Scaled cos/sin for ``positions`` via the cached table (grown as needed), else computed directly."""
        positions = positions.to(self.inv_freq.device)
        rows = None
        if positions.numel() and int(positions.min()) >= 0:
            rows = self.rows_covering(int(positions.max()))
        if rows is None:
            return self.compute_half(positions)
        cos_rows, sin_rows = rows
        return cos_rows[positions], sin_rows[positions]


class TableCache:
    """Thread-safe LRU of ``RopeTable`` keyed by (params, length key, device), bounded in entries and in bytes.

    ``max_bytes`` bounds the cached rows of all tables together: no table grows past it (positions beyond are
    computed directly, not cached), and after a table grows the least recently used tables are dropped until the
    total fits. A dropped table stays alive only while requests still hold it.
    """

    def __init__(self, max_entries: int = 64, max_bytes: int = TABLE_CACHE_BYTES) -> None:
        self.max_entries, self.max_bytes = max_entries, max_bytes
        self._tables: OrderedDict[tuple[object, ...], RopeTable] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, params: RopeParams, seq_len: int | None, device: torch.device) -> RopeTable:
        key = _cache_key(params, seq_len, device)
        with self._lock:
            table = self._tables.get(key)
            if table is not None:
                self._tables.move_to_end(key)
                self.hits += 1
                return table
            self.misses += 1
        built = RopeTable.build(params, seq_len, device, self.max_bytes, partial(self._grew, key))
        with self._lock:
            table = self._tables.setdefault(key, built)  # a concurrent miss may have stored one first: share it
            self._evict()
        return table

    def build_elements(self, params: RopeParams, seq_len: int | None, device: torch.device, max_position: int) -> int:
        """Elements (cos + sin) a lookup of ``params`` covering ``0..max_position`` would compute: the growth of
        the cached table, or on a miss the whole new one. Touches neither the order nor the hit/miss counts."""
        with self._lock:
            table = self._tables.get(_cache_key(params, seq_len, device))
        if table is None:  # frequencies only (a few elements): what get() would build
            table = RopeTable.build(params, seq_len, device, self.max_bytes)
        return table.growth_elements(max_position)

    def _grew(self, key: tuple[object, ...], table: RopeTable) -> None:
        with self._lock:
            if self._tables.get(key) is table:
                self._evict()

    def _evict(self) -> None:
        """Drop least recently used tables until both bounds hold (the caller holds the lock)."""
        held = sum(table.nbytes for table in self._tables.values())
        while self._tables and (len(self._tables) > self.max_entries or held > self.max_bytes):
            held -= self._tables.popitem(last=False)[1].nbytes

    @property
    def nbytes(self) -> int:
        """Bytes of the cos/sin rows the cache holds now."""
        with self._lock:
            return sum(table.nbytes for table in self._tables.values())

    def __len__(self) -> int:
        return len(self._tables)


DEFAULT_CACHE = TableCache()


def expand_pairing(half: torch.Tensor, pairing: Pairing) -> torch.Tensor:
    """Half-width [..., n] -> full width [..., 2n]: NeoX duplicates halves, GPT-J repeats each entry."""
    if pairing == "neox":
        return torch.cat((half, half), dim=-1)
    return torch.repeat_interleave(half, 2, dim=-1)


@dataclass(frozen=True)
class CosSin:
    """cos/sin for a set of positions. ``cos``/``sin``: [*positions.shape, width] in the requested dtype."""

    cos: torch.Tensor
    sin: torch.Tensor
    attention_factor: float
    inv_freq: torch.Tensor
    max_abs_error: float | None
    """Max |cast − float32| over cos and sin when a low-precision dtype was asked; else None."""


def cast_with_error(
    cos: torch.Tensor, sin: torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor, float | None]:
    """Cast float32 cos/sin to ``dtype`` and measure the max abs error the cast introduced."""
    if dtype == torch.float32:
        return cos, sin, None
    cos_low, sin_low = cos.to(dtype), sin.to(dtype)
    error = 0.0
    if cos.numel():
        error = max(
            float((cos_low.float() - cos).abs().max()),
            float((sin_low.float() - sin).abs().max()),
        )
    return cos_low, sin_low, error


def rope_cos_sin(
    params: RopeParams,
    positions: torch.Tensor,
    *,
    pairing: Pairing = "neox",
    dtype: torch.dtype = torch.float32,
    seq_len_cached: int | None = None,
    cache: TableCache | None = DEFAULT_CACHE,
    device: torch.device | str = "cpu",
) -> CosSin:
    """cos/sin of ``params`` at integer ``positions`` (any shape): [*positions.shape, width].

    ``width`` is ``rotary_dim`` (``head_dim`` for ``proportional``). Length-dependent types use
    ``max(positions) + 1`` (see ``effective_length``). With ``cache=None`` nothing is kept: the rows are
    computed for ``positions`` only (bit-identical to the cached rows, which are the same float32 products).
    """
    device = torch.device(device)
    max_position = int(positions.max()) if positions.numel() else 0
    seq_len = effective_length(params, max_position, seq_len_cached)
    if cache is None:
        table = RopeTable.build(params, seq_len, device)
        cos_half, sin_half = table.compute_half(positions.to(device))
    else:
        table = cache.get(params, seq_len, device)
        cos_half, sin_half = table.gather_half(positions)
    cos, sin, error = cast_with_error(expand_pairing(cos_half, pairing), expand_pairing(sin_half, pairing), dtype)
    return CosSin(cos, sin, table.attention_factor, table.inv_freq, error)
