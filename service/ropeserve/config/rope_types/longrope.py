"""``longrope``: per-frequency rescale factors, short below the original length and long above it
(transformers 5.24 ``_compute_longrope_parameters``; Phi-3's legacy name ``su`` maps here)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import TYPE_CHECKING

from ropeserve.config.params import RopeParams
from ropeserve.config.rope_types.base import Problem, RopeType, Spectrum, Torch, effective_factor, exponent

if TYPE_CHECKING:
    from torch import Tensor

FACTOR_LISTS = ("short_factor", "long_factor")


def attention_factor(params: RopeParams) -> float:
    """Explicit ``attention_factor``, else ``sqrt(1 + ln(factor)/ln(original))`` (1.0 for factor ≤ 1)."""
    if params.attention_factor is not None:
        return params.attention_factor
    factor = effective_factor(params, from_lengths=True)
    original = params.original_max_position_embeddings or 0
    if factor <= 1 or original <= 1:
        return 1.0
    return math.sqrt(1 + math.log(factor) / math.log(original))


def uses_long(params: RopeParams, seq_len: int | None) -> bool:
    """The long factors apply to sequences longer than the original length."""
    return seq_len is not None and seq_len > (params.original_max_position_embeddings or 0)


def inv_freq(torch: Torch, params: RopeParams, seq_len: int | None) -> tuple[Tensor, float]:
    factors = params.long_factor if uses_long(params, seq_len) else params.short_factor
    ext_factors = torch.tensor(factors, dtype=torch.float32)
    return 1.0 / (ext_factors * params.rope_theta ** exponent(torch, params.rotary_dim)), attention_factor(params)


def spectrum(params: RopeParams, base: list[float], seq_len: int | None) -> Spectrum:
    factors = params.long_factor if uses_long(params, seq_len) else params.short_factor
    usable = factors is not None and len(factors) == len(base) and all(f > 0 for f in factors)
    scaled = [v / f for v, f in zip(base, factors or (), strict=True)] if usable else base
    return Spectrum(tuple(base), tuple(scaled), attention_factor(params), approximate=not usable)


def problems(params: RopeParams) -> Iterator[Problem]:
    half = params.rotary_dim // 2
    if params.attention_factor is None and params.original_max_position_embeddings == 1:
        message = "longrope divides by ln(original_max_position_embeddings): need > 1"
        yield Problem("original_max_position_embeddings", message, "formula")
    for key in FACTOR_LISTS:
        values = params.value(key)
        if values is None:
            continue
        if len(values) != half:
            yield Problem(
                key,
                f"{key} has {len(values)} entries but rotary_dim/2 = {half} (head_dim {params.head_dim} x "
                f"partial_rotary_factor {params.partial_rotary_factor:g} / 2)",
                "length",
            )
        if not (all(map(math.isfinite, values)) and min(values, default=1.0) > 0):
            message = f"{key} has entries that are not finite and > 0 (frequencies are divided by them)"
            yield Problem(key, message, "range")
    if params.factor is None and not params.max_position_embeddings:
        yield Problem("factor", "longrope without factor needs max_position_embeddings", "formula")


def run_length(params: RopeParams, max_position: int, seq_len_cached: int | None) -> int:
    """``max_position + 1``: it picks the long factors above the original length."""
    return max_position + 1


def length_class(params: RopeParams, seq_len: int) -> int:
    """Two frequency sets: 0 short, 1 long."""
    return int(uses_long(params, seq_len))


ROPE_TYPE = RopeType(
    "longrope",
    inv_freq,
    spectrum,
    required=frozenset({"short_factor", "long_factor", "original_max_position_embeddings"}),
    optional=frozenset({"attention_factor", "factor"}),
    problems=problems,
    attention_factor=attention_factor,
    factor_from_lengths=True,
    original_from_config=True,
    length_includes_extension=True,
    run_length=run_length,
    length_class=length_class,
)
