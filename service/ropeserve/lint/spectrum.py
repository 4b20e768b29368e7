"""Pure-Python (float64) inverse frequencies per rope type, for the numerics check and ``ropeserve explain``.

This restates transformers 5.24's formulas (transformers-rope-spec.md §2) without torch; the reference
implementation with exact float32 parity is ``ropeserve.rope``. Each scaler maps the unscaled frequencies
``theta ** (-2i/d)`` to the scaled ones at a given sequence length and reports the attention factor and, for
yarn and llama3, where the blending ramp sits.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ropeserve.config import RopeParams

YARN_BETA_FAST = 32.0
YARN_BETA_SLOW = 1.0


@dataclass(frozen=True)
class Ramp:
    """Frequency indices where a scaling blends from "kept" (below ``low``) to "fully scaled" (above ``high``)."""

    kind: str
    low: float
    high: float
    detail: str


@dataclass(frozen=True)
class Spectrum:
    base: tuple[float, ...]
    scaled: tuple[float, ...]
    attention_factor: float = 1.0
    ramp: Ramp | None = None
    approximate: bool = False

    @property
    def scale(self) -> tuple[float, ...]:
        """Per-index ratio base/scaled (1 = unchanged, ``factor`` = fully interpolated; inf for zero bands)."""
        return tuple(b / s if s else math.inf for b, s in zip(self.base, self.scaled, strict=True))


def base_frequencies(theta: float, rotary_dim: int) -> list[float]:
    """``theta ** (-2i / rotary_dim)`` for ``i < rotary_dim // 2``."""
    return [theta ** (-(2 * i) / rotary_dim) for i in range(rotary_dim // 2)]


def exponent_denominator(params: RopeParams) -> int:
    """The ``d`` in ``theta ** (-2i/d)``: the rotary width, except ``proportional`` which uses head_dim."""
    return params.head_dim if params.rope_type == "proportional" else params.rotary_dim


def finite_positive(value: Any) -> float | None:
    """``value`` as a float when it is a finite number > 0 (bools excluded), else None."""
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value > 0:
        return float(value)
    return None


def effective_factor(params: RopeParams) -> float:
    """``factor``, or ``max_position_embeddings / original`` where transformers infers it (yarn, longrope).

    A factor that is not a finite positive number counts as 1 here; RS207 reports it.
    """
    if params.factor is not None:
        return finite_positive(params.factor) or 1.0
    limit = finite_positive(params.max_position_embeddings)
    original = finite_positive(params.original_max_position_embeddings)
    if params.rope_type in ("yarn", "longrope") and limit and original:
        return limit / original
    return 1.0


def spectrum(params: RopeParams, seq_len: int | None = None) -> Spectrum:
    """Frequencies of ``params`` at ``seq_len`` (dynamic and longrope depend on it; ``None`` = at init)."""
    base = base_frequencies(params.rope_theta, params.rotary_dim)
    scaler = SCALERS.get(params.rope_type)
    if scaler is None:
        return Spectrum(tuple(base), tuple(base), approximate=True)
    return scaler(params, base, seq_len)


Scaler = Callable[[RopeParams, list[float], int | None], Spectrum]


def _default(params: RopeParams, base: list[float], seq_len: int | None) -> Spectrum:
    return Spectrum(tuple(base), tuple(base))


def _linear(params: RopeParams, base: list[float], seq_len: int | None) -> Spectrum:
    factor = effective_factor(params) or 1.0
    return Spectrum(tuple(base), tuple(v / factor for v in base))


def _dynamic(params: RopeParams, base: list[float], seq_len: int | None) -> Spectrum:
    limit = params.max_position_embeddings or 0
    length = max(seq_len or limit, limit)
    factor, dim = effective_factor(params), params.rotary_dim
    if not limit or length <= limit or dim <= 2:
        return Spectrum(tuple(base), tuple(base))
    theta = params.rope_theta * ((factor * length / limit) - (factor - 1)) ** (dim / (dim - 2))
    return Spectrum(tuple(base), tuple(base_frequencies(theta, dim)))


def yarn_attention_factor(params: RopeParams) -> float:
    factor = effective_factor(params)

    def mscale(scale: float, weight: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * weight * math.log(scale) + 1.0

    if params.attention_factor is not None:
        return params.attention_factor
    if params.mscale and params.mscale_all_dim:
        return mscale(factor, params.mscale) / mscale(factor, params.mscale_all_dim)
    return mscale(factor)


def yarn_correction_range(params: RopeParams) -> tuple[float, float]:
    """The (low, high) frequency indices of the YaRN ramp, after truncation and clamping."""
    dim, theta = params.rotary_dim, params.rope_theta
    original = params.original_max_position_embeddings or params.max_position_embeddings or 1

    def correction(rotations: float) -> float:
        return dim * math.log(original / (2 * math.pi * rotations)) / (2 * math.log(theta))

    low = correction(params.beta_fast or YARN_BETA_FAST)
    high = correction(params.beta_slow or YARN_BETA_SLOW)
    if params.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    return low, high + 0.001 if low == high else high


def _yarn(params: RopeParams, base: list[float], seq_len: int | None) -> Spectrum:
    factor = effective_factor(params)
    low, high = yarn_correction_range(params)
    scaled = []
    for index, value in enumerate(base):
        ramp = min(max((index - low) / (high - low), 0.0), 1.0)
        scaled.append(value / factor * ramp + value * (1 - ramp))
    detail = f"indices <= {low:g} keep their frequency; >= {high:g} are divided by {factor:g}"
    return Spectrum(tuple(base), tuple(scaled), yarn_attention_factor(params), Ramp("yarn", low, high, detail))


def longrope_attention_factor(params: RopeParams) -> float:
    factor = effective_factor(params)
    if params.attention_factor is not None:
        return params.attention_factor
    original = params.original_max_position_embeddings or 0
    if factor <= 1 or original <= 1:
        return 1.0
    return math.sqrt(1 + math.log(factor) / math.log(original))


def _longrope(params: RopeParams, base: list[float], seq_len: int | None) -> Spectrum:
    original = params.original_max_position_embeddings or 0
    factors = params.long_factor if seq_len and seq_len > original else params.short_factor
    usable = factors is not None and len(factors) == len(base) and all(f > 0 for f in factors)
    scaled = [v / f for v, f in zip(base, factors, strict=True)] if usable else base
    return Spectrum(tuple(base), tuple(scaled), longrope_attention_factor(params), approximate=not usable)


def _llama3(params: RopeParams, base: list[float], seq_len: int | None) -> Spectrum:
    factor = params.factor or 1.0
    low, high = params.low_freq_factor or 1.0, params.high_freq_factor or 1.0
    original = params.original_max_position_embeddings or 1
    low_wavelength, high_wavelength = original / low, original / high
    scaled, blended = [], []
    for index, value in enumerate(base):
        wavelength = 2 * math.pi / value
        kept = value / factor if wavelength > low_wavelength else value
        if high_wavelength <= wavelength <= low_wavelength and high > low:
            smooth = (original / wavelength - low) / (high - low)
            kept = (1 - smooth) * kept / factor + smooth * kept
            blended.append(index)
        scaled.append(kept)
    ramp = None
    if blended:
        detail = (
            f"wavelengths < {high_wavelength:g} tokens keep their frequency, > {low_wavelength:g} are divided by "
            f"{factor:g}; indices {blended[0]}-{blended[-1]} are blended"
        )
        ramp = Ramp("llama3", blended[0], blended[-1], detail)
    return Spectrum(tuple(base), tuple(scaled), 1.0, ramp)


def _proportional(params: RopeParams, base: list[float], seq_len: int | None) -> Spectrum:
    half = params.head_dim // 2
    rotating = int(params.partial_rotary_factor * params.head_dim // 2)
    denominator = exponent_denominator(params)
    full = [params.rope_theta ** (-(2 * i) / denominator) if i < rotating else 0.0 for i in range(half)]
    factor = effective_factor(params) or 1.0
    return Spectrum(tuple(full), tuple(v / factor for v in full))


SCALERS: dict[str, Scaler] = {
    "default": _default,
    "linear": _linear,
    "dynamic": _dynamic,
    "yarn": _yarn,
    "deepseek_yarn": _yarn,
    "longrope": _longrope,
    "llama3": _llama3,
    "proportional": _proportional,
}
