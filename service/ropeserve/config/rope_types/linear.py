"""``linear``: position interpolation, every frequency divided by ``factor`` (transformers 5.24)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ropeserve.config.params import RopeParams
from ropeserve.config.rope_types.base import RopeType, Spectrum, Torch, base_inv_freq, divided, effective_factor

if TYPE_CHECKING:
    from torch import Tensor


def inv_freq(torch: Torch, params: RopeParams, seq_len: int | None) -> tuple[Tensor, float]:
    assert params.factor is not None  # validated: required
    return base_inv_freq(torch, params.rope_theta, params.rotary_dim) / params.factor, 1.0


def spectrum(params: RopeParams, base: list[float], seq_len: int | None) -> Spectrum:
    return divided(base, effective_factor(params))


ROPE_TYPE = RopeType("linear", inv_freq, spectrum, required=frozenset({"factor"}), extended_length="max_x_factor")
