"""Registry of rope types: ``RopeParams`` -> ``(inv_freq [rotary_dim/2] float32, attention_factor)``.

Each function reproduces transformers 5.24 (``modeling_rope_utils``) bit for bit in float32: the exponent
``2i/d`` is a float32 arange, ``θ ** e`` is torch's float32 ``pow`` on CPU, and scalar corrections are
Python floats (float64), exactly where transformers computes them. Adding a type is one function plus one
``@register`` line (its accepted keys live in ``ropeserve.config.schema``).

``seq_len`` is the length-dependent input of ``dynamic`` and ``longrope`` (``max(position)+1``); ``None``
means the values at model initialisation.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from ropeserve.config import RopeParams
from ropeserve.errors import InvalidInput

InvFreqFn = Callable[[RopeParams, "int | None"], "tuple[torch.Tensor, float]"]
ROPE_TYPES: dict[str, InvFreqFn] = {}


def register(name: str) -> Callable[[InvFreqFn], InvFreqFn]:
    """Add an inv_freq function to the registry under ``name``."""

    def add(fn: InvFreqFn) -> InvFreqFn:
        ROPE_TYPES[name] = fn
        return fn

    return add


def compute_inv_freq(params: RopeParams, seq_len: int | None = None) -> tuple[torch.Tensor, float]:
    """``(inv_freq [rotary_dim/2] float32 CPU, attention_factor)`` for ``params`` at ``seq_len``.

    The last guard behind ``validate_params``: parameters whose formula still overflows, divides by zero or
    leaves the real numbers are an InvalidInput (422), so no non-finite value reaches a table or a response.
    """
    try:
        inv_freq, attention_factor = ROPE_TYPES[params.rope_type](params, seq_len)
        finite = math.isfinite(attention_factor) and bool(torch.isfinite(inv_freq).all())
    except (ArithmeticError, ValueError, TypeError) as error:
        raise _outside_domain(params, str(error)) from None
    if not finite:
        raise _outside_domain(params, "a frequency or the attention factor is not finite")
    return inv_freq, attention_factor


def _outside_domain(params: RopeParams, why: str) -> InvalidInput:
    return InvalidInput(
        f"{params.rope_type} rope parameters {params.as_dict()} leave the formula's domain: {why}",
        field="rope_parameters",
    )


def base_inv_freq(theta: float | torch.Tensor, dim: int) -> torch.Tensor:
    """``1 / θ^(2i/dim)`` for ``i < dim/2``: float32 exponent, float32 pow, float32 reciprocal.  [dim/2]"""
    exponent = torch.arange(0, dim, 2, dtype=torch.int64).to(torch.float32) / dim
    return 1.0 / (theta**exponent)


@register("default")
def _default(params: RopeParams, seq_len: int | None) -> tuple[torch.Tensor, float]:
    return base_inv_freq(params.rope_theta, params.rotary_dim), 1.0


@register("linear")
def _linear(params: RopeParams, seq_len: int | None) -> tuple[torch.Tensor, float]:
    return base_inv_freq(params.rope_theta, params.rotary_dim) / params.factor, 1.0


@register("dynamic")
def _dynamic(params: RopeParams, seq_len: int | None) -> tuple[torch.Tensor, float]:
    """NTK-scaled base ``θ' = θ·(factor·L/M − (factor − 1))^(d/(d−2))`` with ``L = max(seq_len, M)``.

    transformers evaluates θ' in two precisions, and both are reproduced here: at init (``L = M``) in Python
    float64; at run time ``dynamic_rope_update`` passes ``seq_len = max(position_ids) + 1`` as an int64 tensor,
    so for ``L > M`` the whole expression is float32 tensor arithmetic (a float64 θ' differs by an ulp).
    """
    dim, factor, max_pos = params.rotary_dim, params.factor, params.max_position_embeddings
    length: int | torch.Tensor = max_pos
    if seq_len is not None and seq_len > max_pos:
        length = torch.tensor(seq_len, dtype=torch.int64)
    theta = params.rope_theta * ((factor * length / max_pos) - (factor - 1)) ** (dim / (dim - 2))
    return base_inv_freq(theta, dim), 1.0


def yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    """YaRN's magnitude correction ``0.1·m·ln(s) + 1`` (1.0 for ``s ≤ 1``)."""
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def yarn_correction_range(params: RopeParams, factor: float) -> tuple[float, float]:
    """``(low, high)`` frequency indices of YaRN's ramp, in Python float64 as transformers computes them."""
    dim, theta, omp = params.rotary_dim, params.rope_theta, params.original_max_position_embeddings
    beta_fast, beta_slow = params.beta_fast or 32, params.beta_slow or 1

    def index_of(rotations: float) -> float:
        return (dim * math.log(omp / (rotations * 2 * math.pi))) / (2 * math.log(theta))

    low, high = index_of(beta_fast), index_of(beta_slow)
    if params.truncate:
        low, high = math.floor(low), math.ceil(high)
    return max(low, 0), min(high, dim - 1)


def _yarn_factor(params: RopeParams) -> float:
    if params.factor is not None:
        return params.factor
    return params.max_position_embeddings / params.original_max_position_embeddings


def yarn_attention_factor(params: RopeParams) -> float:
    """Explicit ``attention_factor``, else the mscale ratio or ``0.1·ln(factor) + 1``."""
    if params.attention_factor is not None:
        return params.attention_factor
    factor = _yarn_factor(params)
    if params.mscale and params.mscale_all_dim:
        return yarn_mscale(factor, params.mscale) / yarn_mscale(factor, params.mscale_all_dim)
    return yarn_mscale(factor)


@register("yarn")
def _yarn(params: RopeParams, seq_len: int | None) -> tuple[torch.Tensor, float]:
    dim, factor = params.rotary_dim, _yarn_factor(params)
    pos_freqs = params.rope_theta ** (torch.arange(0, dim, 2).to(dtype=torch.float32) / dim)
    inv_extrapolation = 1.0 / pos_freqs
    inv_interpolation = 1.0 / (factor * pos_freqs)
    low, high = yarn_correction_range(params, factor)
    if low == high:
        high += 0.001
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    extrapolation_weight = 1 - ramp
    inv_freq = inv_interpolation * (1 - extrapolation_weight) + inv_extrapolation * extrapolation_weight
    return inv_freq, yarn_attention_factor(params)


def longrope_attention_factor(params: RopeParams) -> float:
    """Explicit ``attention_factor``, else ``sqrt(1 + ln(factor)/ln(original))`` (1.0 for factor ≤ 1)."""
    if params.attention_factor is not None:
        return params.attention_factor
    omp = params.original_max_position_embeddings
    factor = params.factor if params.factor is not None else params.max_position_embeddings / omp
    return 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(omp))


@register("longrope")
def _longrope(params: RopeParams, seq_len: int | None) -> tuple[torch.Tensor, float]:
    dim = params.rotary_dim
    use_long = seq_len is not None and seq_len > params.original_max_position_embeddings
    ext_factors = torch.tensor(params.long_factor if use_long else params.short_factor, dtype=torch.float32)
    exponent = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim
    return 1.0 / (ext_factors * params.rope_theta**exponent), longrope_attention_factor(params)


@register("llama3")
def _llama3(params: RopeParams, seq_len: int | None) -> tuple[torch.Tensor, float]:
    inv_freq = base_inv_freq(params.rope_theta, params.rotary_dim)
    factor, omp = params.factor, params.original_max_position_embeddings
    low, high = params.low_freq_factor, params.high_freq_factor
    low_freq_wavelen, high_freq_wavelen = omp / low, omp / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (omp / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled), 1.0


@register("proportional")
def _proportional(params: RopeParams, seq_len: int | None) -> tuple[torch.Tensor, float]:
    """Gemma-4 style: the first ``rotary_dim/2`` frequencies of the full head, zero-padded to ``head_dim/2``.

    Unlike the other types its output has ``head_dim/2`` entries (the zero tail leaves channels unrotated).
    """
    head_dim = params.head_dim
    rope_angles = int(params.partial_rotary_factor * head_dim // 2)
    exponent = torch.arange(0, 2 * rope_angles, 2, dtype=torch.int64).to(torch.float32) / head_dim
    inv_freq = torch.zeros(head_dim // 2, dtype=torch.float32)
    inv_freq[:rope_angles] = 1.0 / (params.rope_theta**exponent)
    return inv_freq / (params.factor or 1.0), 1.0


def rotated_width(params: RopeParams) -> int:
    """Channels covered by cos/sin: ``head_dim`` for ``proportional`` (zero tail), else ``rotary_dim``."""
    return params.head_dim if params.rope_type == "proportional" else params.rotary_dim
