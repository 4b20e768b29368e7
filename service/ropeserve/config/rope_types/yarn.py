"""``yarn``: YaRN, a ramp between extrapolated and interpolated frequencies plus an attention factor
(transformers 5.24 ``_compute_yarn_parameters``; DeepSeek's mscale ratio included)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import TYPE_CHECKING

from ropeserve.config.jsonsafe import FLOAT_MAX
from ropeserve.config.params import RopeParams
from ropeserve.config.rope_types.base import Problem, Ramp, RopeType, Spectrum, Torch, effective_factor, exponent

if TYPE_CHECKING:
    from torch import Tensor

BETA_FAST = 32.0
BETA_SLOW = 1.0
"""Defaults transformers substitutes for a missing (or 0: it reads them with ``or``) beta_fast / beta_slow."""


def factor(params: RopeParams) -> float:
    """``factor``, else ``max_position_embeddings / original_max_position_embeddings``."""
    return effective_factor(params, from_lengths=True)


def mscale(scale: float, weight: float = 1.0) -> float:
    """YaRN's magnitude correction ``0.1·m·ln(s) + 1`` (1.0 for ``s ≤ 1``)."""
    return 1.0 if scale <= 1 else 0.1 * weight * math.log(scale) + 1.0


def attention_factor(params: RopeParams) -> float:
    """Explicit ``attention_factor``, else the mscale ratio or ``0.1·ln(factor) + 1``."""
    if params.attention_factor is not None:
        return params.attention_factor
    scale = factor(params)
    if params.mscale and params.mscale_all_dim:
        return mscale(scale, params.mscale) / mscale(scale, params.mscale_all_dim)
    return mscale(scale)


def correction_range(params: RopeParams) -> tuple[float, float]:
    """``(low, high)`` frequency indices of the ramp, in float64 as transformers computes them: truncated
    (unless ``truncate`` is false), clamped to ``[0, dim-1]``, ``high`` nudged by 0.001 when they meet."""
    dim, theta = params.rotary_dim, params.rope_theta
    original = params.original_max_position_embeddings or params.max_position_embeddings or 1

    def index_of(rotations: float) -> float:
        return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(theta))

    low, high = index_of(params.beta_fast or BETA_FAST), index_of(params.beta_slow or BETA_SLOW)
    if params.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    return low, high + 0.001 if low == high else high


def inv_freq(torch: Torch, params: RopeParams, seq_len: int | None) -> tuple[Tensor, float]:
    dim, scale = params.rotary_dim, factor(params)
    pos_freqs = params.rope_theta ** exponent(torch, dim)
    inv_extrapolation = 1.0 / pos_freqs
    inv_interpolation = 1.0 / (scale * pos_freqs)
    low, high = correction_range(params)
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    extrapolation_weight = 1 - ramp
    inv = inv_interpolation * (1 - extrapolation_weight) + inv_extrapolation * extrapolation_weight
    return inv, attention_factor(params)


def spectrum(params: RopeParams, base: list[float], seq_len: int | None) -> Spectrum:
    scale = factor(params)
    low, high = correction_range(params)
    scaled = []
    for index, value in enumerate(base):
        ramp = min(max((index - low) / (high - low), 0.0), 1.0)
        scaled.append(value / scale * ramp + value * (1 - ramp))
    detail = f"indices <= {low:g} keep their frequency; >= {high:g} are divided by {scale:g}"
    return Spectrum(tuple(base), tuple(scaled), attention_factor(params), Ramp("yarn", low, high, detail))


def problems(params: RopeParams) -> Iterator[Problem]:
    original = params.original_max_position_embeddings or params.max_position_embeddings or 1
    for key in ("beta_fast", "beta_slow"):  # an explicit 0 means the default
        value = params.value(key)
        if value and not _finite_quotient(original, value * 2 * math.pi):
            message = f"yarn takes ln(original_max_position_embeddings / (2 pi {key})): {key} {value} overflows it"
            yield Problem(key, message, "formula")
    if params.rope_theta == 1:
        yield Problem("rope_theta", "yarn divides by ln(rope_theta): rope_theta must not be 1", "formula")
    if params.factor is None and not params.max_position_embeddings:
        yield Problem("factor", "yarn without factor needs max_position_embeddings", "formula")


def _finite_quotient(numerator: float, denominator: float) -> bool:
    """``numerator / denominator`` is a finite, non-zero float (its logarithm exists)."""
    return 0 < denominator <= FLOAT_MAX and 0 < numerator / denominator <= FLOAT_MAX


ROPE_TYPE = RopeType(
    "yarn",
    inv_freq,
    spectrum,
    required=frozenset({"factor", "original_max_position_embeddings"}),
    optional=frozenset({"attention_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim", "truncate"}),
    problems=problems,
    attention_factor=attention_factor,
    factor_from_lengths=True,
    original_from_config=True,
    null_factor_allowed=True,
    extended_length="original_x_factor",
)
