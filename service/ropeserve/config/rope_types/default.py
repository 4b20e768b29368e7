"""``default``: plain RoPE, ``inv_freq[i] = θ^(-2i/d)`` (transformers 5.24 ``compute_default_rope_parameters``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ropeserve.config.params import RopeParams
from ropeserve.config.rope_types.base import RopeType, Spectrum, Torch, base_inv_freq

if TYPE_CHECKING:
    from torch import Tensor


def inv_freq(torch: Torch, params: RopeParams, seq_len: int | None) -> tuple[Tensor, float]:
    return base_inv_freq(torch, params.rope_theta, params.rotary_dim), 1.0


def spectrum(params: RopeParams, base: list[float], seq_len: int | None) -> Spectrum:
    return Spectrum(tuple(base), tuple(base))


ROPE_TYPE = RopeType("default", inv_freq, spectrum, scales=False)
