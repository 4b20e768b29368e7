"""``ntk``: vLLM's fixed NTK scaling, and its mixed variant with ``mixed_b`` (https://kexue.fm/archives/9706).

Reference: vLLM ``NTKScalingRotaryEmbedding`` (vllm/model_executor/layers/rotary_embedding/ntk_scaling_rope.py,
read at commit 03587f553db4139402cc19f424c488c8e2fe25d1), built by ``get_rope`` for ``rope_type: "ntk"`` from
``factor`` and the optional ``mixed_b``. transformers has no such type; the service computes what vLLM does.

- without ``mixed_b``: base ``θ·factor``, then every frequency divided by ``factor^(2/d)``;
- with ``mixed_b = b``: base ``θ``, frequency ``i`` divided by ``λ_i = exp(a·(i+1)^b)`` with
  ``a = ln(factor) / (d/2)^b`` (so the last frequency is divided by ``factor``, the first by almost nothing).

Float32 exactly as vLLM: ``ln(factor)`` is taken of a float32 tensor, ``λ`` is float32 tensor arithmetic, the
scalar ``factor^(2/d)`` is a Python float. The attention factor is 1; the frequencies do not depend on length.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import TYPE_CHECKING

from ropeserve.config.params import RopeParams
from ropeserve.config.rope_types.base import (
    Problem,
    RopeType,
    Spectrum,
    Torch,
    base_frequencies,
    base_inv_freq,
    effective_factor,
)

if TYPE_CHECKING:
    from torch import Tensor

MAX_MIXED_B = 8.0
"""Largest ``mixed_b`` accepted: ``(rotary_dim/2)^b`` stays a normal float32 for heads up to 16,384 (real
values are below 1; vLLM itself checks nothing)."""


def inv_freq(torch: Torch, params: RopeParams, seq_len: int | None) -> tuple[Tensor, float]:
    dim, factor, mixed_b = params.rotary_dim, params.factor, params.value("mixed_b")
    assert factor is not None  # validated: required
    if mixed_b is None:
        return base_inv_freq(torch, params.rope_theta * factor, dim) / factor ** (2 / dim), 1.0
    a = torch.tensor(factor).log() / (dim / 2) ** mixed_b
    lambdas = (a * torch.arange(1, dim // 2 + 1).float() ** mixed_b).exp()
    return base_inv_freq(torch, params.rope_theta, dim) / lambdas, 1.0


def spectrum(params: RopeParams, base: list[float], seq_len: int | None) -> Spectrum:
    dim, factor, mixed_b = params.rotary_dim, effective_factor(params), params.value("mixed_b")
    if mixed_b is None:
        shrink = factor ** (2 / dim)
        scaled = [v / shrink for v in base_frequencies(params.rope_theta * factor, dim)]
    else:
        a = math.log(factor) / (dim / 2) ** mixed_b
        scaled = [v / math.exp(a * (i + 1) ** mixed_b) for i, v in enumerate(base)]
    return Spectrum(tuple(base), tuple(scaled))


def problems(params: RopeParams) -> Iterator[Problem]:
    mixed_b, factor = params.value("mixed_b"), params.factor
    if mixed_b is not None and not (math.isfinite(mixed_b) and 0 < mixed_b <= MAX_MIXED_B):
        yield Problem("mixed_b", f"mixed_b = {mixed_b!r} must be finite and in (0, {MAX_MIXED_B}]", "range")
    if mixed_b is None and factor is not None and not math.isfinite(params.rope_theta * factor):
        scaled = f"rope_theta x factor = {params.rope_theta} x {factor}"
        yield Problem("factor", f"the scaled base {scaled} overflows", "range")


ROPE_TYPE = RopeType(
    "ntk",
    inv_freq,
    spectrum,
    required=frozenset({"factor"}),
    optional=frozenset({"mixed_b"}),
    problems=problems,
    reference="vLLM NTKScalingRotaryEmbedding @03587f55",
)
