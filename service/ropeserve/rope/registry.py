"""Exact float32 frequencies: ``RopeParams`` -> ``(inv_freq [n] float32, attention_factor)``.

Each rope type's formula lives in its module under ``ropeserve.config.rope_types`` (how to add one: that
package's docstring); this module hands it the ``torch`` module and guards the result. Every transformers type
reproduces transformers 5.24 (``modeling_rope_utils``) bit for bit in float32: the exponent ``2i/d`` is a
float32 arange, ``θ ** e`` is torch's float32 ``pow`` on CPU, and scalar corrections are Python floats
(float64), exactly where transformers computes them. ``n`` is ``rotary_dim/2`` (``head_dim/2`` for a
full-width type).

``seq_len`` is the length-dependent input of ``dynamic`` and ``longrope`` (``max(position)+1``); ``None``
means the values at model initialisation.
"""

from __future__ import annotations

import math

import torch

from ropeserve.config import RopeParams
from ropeserve.config.rope_types import ROPE_TYPES, rotated_width
from ropeserve.config.rope_types import base as _base
from ropeserve.errors import InvalidInput

__all__ = ["ROPE_TYPES", "base_inv_freq", "compute_inv_freq", "rotated_width"]


def compute_inv_freq(params: RopeParams, seq_len: int | None = None) -> tuple[torch.Tensor, float]:
    """``(inv_freq [n] float32 CPU, attention_factor)`` for ``params`` at ``seq_len``.

    The last guard behind ``validate_params``: parameters whose formula still overflows, divides by zero or
    leaves the real numbers are an InvalidInput (422), so no non-finite value reaches a table or a response.
    """
    try:
        inv_freq, attention_factor = ROPE_TYPES[params.rope_type].inv_freq(torch, params, seq_len)
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
    result: torch.Tensor = _base.base_inv_freq(torch, theta, dim)
    return result
