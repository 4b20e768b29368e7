"""Torch-free estimate of the cos/sin error an engine's dtypes cause at the longest position.

Model (exact torch parity is not the goal; the magnitudes are):

1. ``inv_freq`` in float32 as torch builds it: exponent ``f32(2i) / f32(d)`` rounded to float32, the power
   ``f32(theta) ** e`` evaluated in float64 and rounded once to float32 (torch's float32 ``pow`` is within an
   ulp of that), the reciprocal rounded to float32; a rope type's scaling is applied to that value in float64
   and rounded to float32 again.
2. The angle ``p * inv`` in the phase dtype: both operands and the product rounded to it (float32 for every
   engine; bfloat16/float16 when phases are computed in low precision, e.g. under autocast).
3. ``cos``/``sin`` of that angle (float64, then times the attention factor) rounded to the table dtype: the
   model dtype for transformers, vLLM, SGLang and TGI (their cos/sin are cast to it), float32 for llama.cpp
   (ggml rotates in float32).

The error is the largest ``|emulated - exact|`` over all frequencies at position ``p``, where *exact* is the
float64 angle of the float64 frequency. bfloat16 rounds the float32 bit pattern to nearest-even on the upper
16 bits; float16 uses IEEE half precision (``struct`` format ``e``); overflow gives ``inf``.
"""

from __future__ import annotations

import functools
import math
import struct
from array import array
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from itertools import chain
from operator import sub

from ropeserve.config import RopeParams
from ropeserve.config.rope_types import Spectrum, rotated_width, spectrum

EXACT_INTEGER_LIMIT = {"float32": 2**24, "bfloat16": 2**8, "float16": 2**11}
"""Largest N such that every integer position 0..N is exact in the dtype."""


_EXPONENT_BITS = 0x7F800000
"""float32 bits of the exponent: all set for infinities and NaN."""


def float32_all(values: Iterable[float]) -> list[float]:
    """Each value rounded to float32, in one conversion: ``array('f')`` casts as ``struct``'s ``f`` does, and an
    out-of-range value becomes the infinity of its sign (NaN and infinities pass unchanged)."""
    return array("f", values).tolist()


def bfloat16_all(values: Iterable[float]) -> list[float]:
    """Each value rounded to float32, then to nearest-even on the upper 16 bits (non-finite values unchanged).

    The float32 bit patterns are the 32-bit lanes of one Python integer, so the rounding is a few big-integer
    operations instead of a Python loop (about 3x faster for a table's 2 x 64 values): per lane, add ``0x7FFF``
    plus the lowest kept bit (ties to even) and clear the lower 16 bits. A finite lane stays below ``2**32``
    (at most ``0xFF7FFFFF + 0x8000``), so no carry reaches its neighbour; a non-finite lane (exponent bits all
    set) gets nothing added and keeps its bits.
    """
    single = array("f", values)
    count = len(single)
    bits = int.from_bytes(single.tobytes(), "little")
    ones, exponents = _lanes(count, 1), _lanes(count, _EXPONENT_BITS)
    # (exponent bits XOR all-ones) is 0 for a non-finite lane and at least 2**23 otherwise: adding the exponent
    # bits sets bit 31 exactly for the finite lanes.
    finite = ((((bits & exponents) ^ exponents) + exponents) >> 31) & ones
    increment = (0x7FFF * ones + ((bits >> 16) & ones)) & (finite * 0xFFFF)
    kept = _lanes(count, 0xFFFF0000) | ((ones ^ finite) * 0xFFFF)
    return array("f", ((bits + increment) & kept).to_bytes(4 * count, "little")).tolist()


def _lanes(count: int, word: int) -> int:
    """``count`` 32-bit lanes each holding ``word``, as one integer (lane 0 lowest, as ``array`` bytes read)."""
    return int.from_bytes(word.to_bytes(4, "little") * count, "little")


def float16_all(values: Sequence[float]) -> list[float]:
    """Each value rounded to IEEE half precision; past its range, the infinity of its sign."""
    layout = f"<{len(values)}e"
    try:
        return list(struct.unpack(layout, struct.pack(layout, *values)))
    except (OverflowError, struct.error):
        return [round_float16(value) for value in values]


def round_float32(value: float) -> float:
    return float32_all([value])[0]


def round_bfloat16(value: float) -> float:
    return bfloat16_all([value])[0]


def round_float16(value: float) -> float:
    if not math.isfinite(value):
        return value
    try:
        return float(struct.unpack("<e", struct.pack("<e", value))[0])
    except (OverflowError, struct.error):
        return math.copysign(math.inf, value)


ROUNDERS: dict[str, Callable[[Sequence[float]], list[float]]] = {
    "float32": float32_all,
    "bfloat16": bfloat16_all,
    "float16": float16_all,
}
"""dtype -> the rounding of a list of values to it."""


@dataclass(frozen=True)
class TableError:
    """Max abs error of cos and sin at ``position`` for one (phase dtype, table dtype) pair."""

    position: int
    phase_dtype: str
    table_dtype: str
    cos: float
    sin: float

    @property
    def worst(self) -> float:
        return max(self.cos, self.sin)

    def as_dict(self) -> dict[str, float | int | str | None]:
        return {
            "position": self.position,
            "phase_dtype": self.phase_dtype,
            "table_dtype": self.table_dtype,
            "max_abs_error_cos": _finite_or_none(self.cos),
            "max_abs_error_sin": _finite_or_none(self.sin),
        }


def float32_frequencies(params: RopeParams, seq_len: int | None) -> tuple[Spectrum, list[float]]:
    """The float64 spectrum and its float32 emulation (step 1 of the model; each step rounds the whole list)."""
    exact = spectrum(params, seq_len)
    dim, theta = round_float32(float(rotated_width(params))), round_float32(params.rope_theta)
    inverse32 = float32_inverse_frequencies(theta, dim, min(len(exact.base), len(exact.scaled)))
    scaled32 = [
        b32 * (scaled / base) if base else 0.0
        for b32, base, scaled in zip(inverse32, exact.base, exact.scaled, strict=False)
    ]
    return exact, float32_all(scaled32)


@functools.lru_cache(maxsize=64)
def float32_inverse_frequencies(theta: float, dim: float, count: int) -> tuple[float, ...]:
    """The unscaled float32 ``inv_freq`` for ``i < count``: ``f32(1 / f32(theta ** f32(f32(2i) / dim)))``
    (``theta`` and ``dim`` already float32).

    Two thirds of ``float32_frequencies``, and the same for every length and rope type of one theta and width
    (a request varying only ``max_position_embeddings`` or the scaling finds it here): cached on those three
    numbers, tuples only. A zero band of the spectrum (scaled to 0.0 by the caller) gets its power too."""
    exponents = float32_all([two_i / dim for two_i in float32_all([2.0 * index for index in range(count)])])
    return tuple(float32_all([1.0 / power for power in float32_all([theta**e for e in exponents])]))


WAVES: tuple[Callable[[float], float], ...] = (math.cos, math.sin)


@dataclass(frozen=True)
class PhaseWaves:
    """cos and sin at ``position`` with phases in ``phase_dtype``, times the attention factor, before any table
    rounding (``emulated``; None when an angle overflows the phase dtype) next to the exact ones: what the errors
    of every table dtype at that position share (steps 1-2 of the model and the waves of step 3).

    Each holds the cos values of the frequencies followed by their sin values, so that a table dtype's
    rounding converts one list."""

    position: int
    phase_dtype: str
    emulated: tuple[float, ...] | None
    exact: tuple[float, ...]
    """The exact cos and sin (empty when ``emulated`` is None)."""

    def error(self, table_dtype: str) -> TableError:
        """The max abs cos/sin error of tables in ``table_dtype`` (step 3)."""
        if self.emulated is None:
            return TableError(self.position, self.phase_dtype, table_dtype, math.inf, math.inf)
        table, exact, half = ROUNDERS[table_dtype](self.emulated), self.exact, len(self.exact) // 2
        cos, sin = _max_error(table[:half], exact[:half]), _max_error(table[half:], exact[half:])
        return TableError(self.position, self.phase_dtype, table_dtype, cos, sin)


@functools.lru_cache(maxsize=16)
def phase_waves(params: RopeParams, position: int, phase_dtype: str) -> PhaseWaves:
    """The ``PhaseWaves`` of ``params`` at ``position`` (frequencies as at sequence length ``position + 1``).

    Cached (few entries, each about 8 KB for 64 frequencies) only so that the table dtypes of one lint run,
    computed one by one by ``table_error``, share the frequencies and angles (about two thirds of the work)."""
    exact, emulated = float32_frequencies(params, position + 1)
    to_phase = ROUNDERS[phase_dtype]
    count = min(len(exact.scaled), len(emulated))
    start = to_phase([float(position)])[0]
    rounded = to_phase([start * inv32 for inv32 in to_phase(emulated[:count])])
    if not all(map(math.isfinite, rounded)):
        return PhaseWaves(position, phase_dtype, None, ())
    angles = [position * inv64 for inv64 in exact.scaled[:count]]
    scale = exact.attention_factor
    return PhaseWaves(position, phase_dtype, _waves(rounded, scale), _waves(angles, scale))


def _waves(angles: list[float], scale: float) -> tuple[float, ...]:
    """``scale`` times the cos of every angle, then times the sin of every angle (``WAVES``' order); at scale
    1.0 (most rope types) the product is the value itself, so the pass is skipped."""
    waves = list(chain.from_iterable(map(wave, angles) for wave in WAVES))
    return tuple(waves if scale == 1.0 else [value * scale for value in waves])


@functools.lru_cache(maxsize=1024)
def table_error(params: RopeParams, position: int, phase_dtype: str, table_dtype: str) -> TableError:
    """Max abs cos/sin error at ``position`` of ``table_dtype`` tables with ``phase_dtype`` phases.

    Pure and about 70 us in Python for the frequencies and angles (``phase_waves``, shared by the table dtypes
    of one position), plus about 15 us per table dtype, computed only for the dtypes asked for: a lint asks for
    two (the model's and llama.cpp's float32) at one position. Cached (bounded), so a pipeline that lints the
    same model again pays nothing."""
    return phase_waves(params, position, phase_dtype).error(table_dtype)


def forget_results() -> None:
    """Empty every cross-request cache of this module (``benchmarks/bench_lint_request.py`` times a model linted
    for the first time after this)."""
    for cached in (table_error, phase_waves, float32_inverse_frequencies):
        cached.cache_clear()


def _max_error(table: list[float], exact: tuple[float, ...]) -> float:
    """``max |table - exact|`` over the frequencies (0.0 for none; starting from 0.0, a NaN difference never wins)."""
    largest: float = max(chain((0.0,), map(abs, map(sub, table, exact))))
    return largest


def _finite_or_none(value: float) -> float | None:
    return value if math.isfinite(value) else None
