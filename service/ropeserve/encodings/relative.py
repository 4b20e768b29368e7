"""Relative-position indices: T5 buckets and Shaw-style clipped distances.

Both map the signed distance ``r = j - i`` between key ``j < Tk`` and query ``i = offset + q`` (``q < Tq``) to an
index into a learned embedding table; results are int64 [Tq, Tk].

T5 (Raffel et al.; Mesh TensorFlow, transformers ``T5Attention._relative_position_bucket``), with ``N`` buckets
and ``max_distance`` M:

* bidirectional: ``N`` is halved; keys after the query (``r > 0``) use the upper half; ``n = |r|``.
  causal (decoder): ``n = max(-r, 0)`` (future keys share bucket 0).
* with ``E = N/2`` (after halving) exact buckets: ``n < E`` -> ``n``; otherwise
  ``min(E + floor(ln(n/E) / ln(M/E) · (N - E)), N - 1)``, computed in float32 exactly as transformers does.

Shaw et al. (2018) with clip ``k``: ``clip(r, -k, k) + k`` in ``[0, 2k]`` (table of ``2k + 1`` rows);
causal variant ``clip(r, -k, 0) + k`` in ``[0, k]``.
"""

from __future__ import annotations

import math

import torch

from ropeserve.config.jsonsafe import INT64_MAX
from ropeserve.errors import InvalidInput


def relative_positions(query_len: int, key_len: int, offset: int = 0) -> torch.Tensor:
    """``j - (offset + q)`` for queries q < query_len and keys j < key_len, int64 [Tq, Tk]."""
    queries = torch.arange(query_len, dtype=torch.int64) + offset
    keys = torch.arange(key_len, dtype=torch.int64)
    return keys[None, :] - queries[:, None]


def t5_bucket(
    relative: torch.Tensor, *, bidirectional: bool = True, num_buckets: int = 32, max_distance: int = 128
) -> torch.Tensor:
    """T5 bucket of each signed distance in ``relative`` (int64, any shape) -> int64, same shape."""
    buckets = num_buckets // 2 if bidirectional else num_buckets
    exact = buckets // 2
    if exact < 1:
        raise InvalidInput(
            f"num_buckets={num_buckets} leaves no exact bucket (needs >= {4 if bidirectional else 2})",
            field="num_buckets",
        )
    if max_distance <= exact:
        raise InvalidInput(f"max_distance must exceed the {exact} exact buckets", field="max_distance")
    if bidirectional:
        upper_half = (relative > 0).to(torch.int64) * buckets
        distance = relative.abs()
    else:
        upper_half = torch.zeros_like(relative)
        distance = (-relative).clamp(min=0)
    log_ratio = torch.log(distance.clamp(min=1).float() / exact) / math.log(max_distance / exact)
    logarithmic = (exact + (log_ratio * (buckets - exact)).to(torch.int64)).clamp(max=buckets - 1)
    return upper_half + torch.where(distance < exact, distance, logarithmic)


def t5_relative_buckets(
    query_len: int,
    key_len: int,
    *,
    bidirectional: bool = True,
    num_buckets: int = 32,
    max_distance: int = 128,
    offset: int = 0,
) -> torch.Tensor:
    """T5 buckets for queries at ``offset + q`` and keys ``j``: int64 [Tq, Tk] in ``[0, num_buckets)``."""
    relative = relative_positions(query_len, key_len, offset)
    return t5_bucket(relative, bidirectional=bidirectional, num_buckets=num_buckets, max_distance=max_distance)


def shaw_relative_indices(
    query_len: int, key_len: int, *, clip: int, bidirectional: bool = True, offset: int = 0
) -> torch.Tensor:
    """Shaw-style ``clip(j - i, -clip, clip or 0) + clip``: int64 [Tq, Tk] in ``[0, 2·clip]``."""
    check_shaw_clip(clip, bidirectional)
    upper = clip if bidirectional else 0
    return relative_positions(query_len, key_len, offset).clamp(-clip, upper) + clip


def shaw_table_rows(clip: int, bidirectional: bool = True) -> int:
    """Rows of the embedding table Shaw indices address: ``2·clip + 1`` (``clip + 1`` when causal)."""
    check_shaw_clip(clip, bidirectional)
    return 2 * clip + 1 if bidirectional else clip + 1


def check_shaw_clip(clip: int, bidirectional: bool) -> None:
    """Raise InvalidInput unless ``clip`` >= 0 and the table rows (``2·clip + 1``, causal ``clip + 1``), and so
    every index, fit int64: a larger clip wrapped the indices (2**63 - 1 gave -2**63 and 2**64 - 1)."""
    largest = (INT64_MAX - 1) // 2 if bidirectional else INT64_MAX - 1
    if not 0 <= clip <= largest:
        raise InvalidInput(
            f"clip must be in [0, {largest}] ({'2·clip' if bidirectional else 'clip'} + 1 table rows in int64; "
            f"got {clip})",
            field="clip",
        )
