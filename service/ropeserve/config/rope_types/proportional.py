"""``proportional`` (Gemma-4 style): the first ``rotary_dim/2`` frequencies of the full head, zero-padded to
``head_dim/2`` and divided by ``factor`` (transformers 5.24).

Unlike the other types its frequencies have ``head_dim/2`` entries (the zero tail leaves channels unrotated),
and the exponent divides by ``head_dim``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ropeserve.config.params import RopeParams
from ropeserve.config.rope_types.base import RopeType, Spectrum, Torch, divided, effective_factor, exponent

if TYPE_CHECKING:
    from torch import Tensor


def rotating(params: RopeParams) -> int:
    """How many leading frequencies rotate: ``int(partial_rotary_factor * head_dim // 2)``."""
    return int(params.partial_rotary_factor * params.head_dim // 2)


def inv_freq(torch: Torch, params: RopeParams, seq_len: int | None) -> tuple[Tensor, float]:
    head_dim, count = params.head_dim, rotating(params)
    inv = torch.zeros(head_dim // 2, dtype=torch.float32)
    inv[:count] = 1.0 / (params.rope_theta ** exponent(torch, head_dim, count))
    return inv / (params.factor or 1.0), 1.0


def spectrum(params: RopeParams, base: list[float], seq_len: int | None) -> Spectrum:
    count, head_dim = rotating(params), params.head_dim
    full = [params.rope_theta ** (-(2 * i) / head_dim) if i < count else 0.0 for i in range(head_dim // 2)]
    return divided(full, effective_factor(params))


ROPE_TYPE = RopeType("proportional", inv_freq, spectrum, optional=frozenset({"factor"}), full_width=True)
