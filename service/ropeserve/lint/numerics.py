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
from collections.abc import Callable
from dataclasses import dataclass

from ropeserve.config import RopeParams
from ropeserve.config.rope_types import Spectrum, rotated_width, spectrum

EXACT_INTEGER_LIMIT = {"float32": 2**24, "bfloat16": 2**8, "float16": 2**11}
"""Largest N such that every integer position 0..N is exact in the dtype."""


def round_float32(value: float) -> float:
    if not math.isfinite(value):
        return value
    try:
        return float(struct.unpack("<f", struct.pack("<f", value))[0])
    except OverflowError:
        return math.copysign(math.inf, value)


def round_bfloat16(value: float) -> float:
    single = round_float32(value)
    if not math.isfinite(single):
        return single
    bits = struct.unpack("<I", struct.pack("<f", single))[0]
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return float(struct.unpack("<f", struct.pack("<I", bits))[0])


def round_float16(value: float) -> float:
    if not math.isfinite(value):
        return value
    try:
        return float(struct.unpack("<e", struct.pack("<e", value))[0])
    except (OverflowError, struct.error):
        return math.copysign(math.inf, value)


ROUNDERS: dict[str, Callable[[float], float]] = {
    "float32": round_float32,
    "bfloat16": round_bfloat16,
    "float16": round_float16,
}


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
    """The float64 spectrum and its float32 emulation (step 1 of the model)."""
    exact = spectrum(params, seq_len)
    dim, theta = rotated_width(params), round_float32(params.rope_theta)
    emulated = []
    for index, (base, scaled) in enumerate(zip(exact.base, exact.scaled, strict=False)):
        exponent = round_float32(round_float32(2.0 * index) / round_float32(float(dim)))
        base32 = round_float32(1.0 / round_float32(theta**exponent)) if base else 0.0
        emulated.append(round_float32(base32 * (scaled / base)) if base else 0.0)
    return exact, emulated


@functools.lru_cache(maxsize=1024)
def table_error(params: RopeParams, position: int, phase_dtype: str, table_dtype: str) -> TableError:
    """Max abs cos/sin error at ``position`` (frequencies as at sequence length ``position + 1``).

    Pure and about 0.2 ms in Python, asked for up to three times per lint: cached (bounded), so a pipeline
    that lints the same model again pays nothing."""
    exact, emulated = float32_frequencies(params, position + 1)
    to_phase, to_table = ROUNDERS[phase_dtype], ROUNDERS[table_dtype]
    scale = exact.attention_factor
    cos_error = sin_error = 0.0
    for inv64, inv32 in zip(exact.scaled, emulated, strict=False):
        angle = position * inv64
        rounded = to_phase(to_phase(float(position)) * to_phase(inv32))
        if not math.isfinite(rounded):
            return TableError(position, phase_dtype, table_dtype, math.inf, math.inf)
        cos_error = max(cos_error, abs(to_table(math.cos(rounded) * scale) - math.cos(angle) * scale))
        sin_error = max(sin_error, abs(to_table(math.sin(rounded) * scale) - math.sin(angle) * scale))
    return TableError(position, phase_dtype, table_dtype, cos_error, sin_error)


def _finite_or_none(value: float) -> float | None:
    return value if math.isfinite(value) else None
