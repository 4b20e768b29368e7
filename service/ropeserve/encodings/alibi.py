"""ALiBi (Press et al. 2022): per-head slopes and linear attention biases.

Slopes for ``H`` heads with maximum bias ``B`` (8 in the paper, BLOOM, MPT and Falcon): let ``n = 2^floor(log2 H)``.
The first ``n`` slopes are the geometric sequence ``2^(-B·k/n)``, ``k = 1..n``; when ``H`` is not a power of two
the remaining ``H - n`` slopes are the odd terms ``k = 1, 3, 5, ...`` of the ``2n`` sequence ``2^(-B·k/(2n))``,
i.e. they interleave between the first ones. Computed as BLOOM does: a float32 base ``2^(-B/n)`` raised to
integer powers (MPT's ``1 / 2^(k·B/2n)`` ordering gives the same values to float32 rounding).

Biases [H, Tq, Tk] for queries at positions ``i = offset + q`` (``offset`` = tokens already in the cache when
decoding) and keys at ``j = 0 .. Tk-1``, in float32 then cast:

* ``causal``: ``slope_h · (j - i)`` (non-positive where ``j <= i``; the caller's causal mask hides ``j > i``).
  Each row differs from BLOOM/Falcon's ``slope_h · j`` by a per-row constant, which softmax ignores, and equals
  MPT's ``slope_h · (j - (Tk-1))`` for the last query.
* ``symmetric``: ``-slope_h · |i - j|`` (encoders, bidirectional attention).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Literal

import torch

from ropeserve.encodings.relative import relative_positions
from ropeserve.errors import InvalidInput

AlibiMode = Literal["causal", "symmetric"]


def closest_power_of_two(num_heads: int) -> int:
    """The largest power of two ``<= num_heads``."""
    return int(2 ** math.floor(math.log2(num_heads)))


def _geometric_slopes(count: int, powers: torch.Tensor, max_bias: float) -> torch.Tensor:
    """``(2^(-max_bias/count))^k`` for integer ``powers`` k, float32.  [len(powers)]"""
    base = torch.full((), 2 ** (-max_bias / count), dtype=torch.float32)
    return torch.pow(base, powers)


def alibi_slopes(num_heads: int, *, max_bias: float = 8.0) -> torch.Tensor:
    """Per-head slopes, float32 [num_heads] (see the module docstring)."""
    if num_heads < 1:
        raise InvalidInput(f"num_heads must be >= 1 (got {num_heads})", field="num_heads")
    if max_bias <= 0:
        raise InvalidInput(f"max_bias must be > 0 (got {max_bias})", field="max_bias")
    power = closest_power_of_two(num_heads)
    slopes = _geometric_slopes(power, torch.arange(1, power + 1, dtype=torch.int32), max_bias)
    extra = num_heads - power
    if extra == 0:
        return slopes
    odd_powers = torch.arange(1, 2 * extra, 2, dtype=torch.int32)
    return torch.cat([slopes, _geometric_slopes(2 * power, odd_powers, max_bias)])


DISTANCES: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "causal": lambda relative: relative,
    "symmetric": lambda relative: -relative.abs(),
}
"""Signed key-minus-query distance ``j - i`` -> the distance the slope multiplies."""


def alibi_bias(
    slopes: torch.Tensor,
    query_len: int,
    key_len: int,
    *,
    mode: AlibiMode = "causal",
    offset: int = 0,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """The bias ``slope_h · distance(j - i)`` for float32 ``slopes`` [H]: [H, Tq, Tk] in ``dtype``."""
    distance = DISTANCES[mode](relative_positions(query_len, key_len, offset)).to(torch.float32)
    return (slopes.to(torch.float32)[:, None, None] * distance[None, :, :]).to(dtype)
