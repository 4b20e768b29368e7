"""1-D position ids: padded batches, packed sequences, cache continuation and decode steps.

All functions return int64 tensors and never loop over tokens in Python. Padded slots receive ``fill_value``
(default :data:`PAD_POSITION` = 0, as transformers 5 does). Packed and decode positions are computed with numpy
and handed over as a tensor sharing its memory (on the input tensor's device, if one was given): their inputs
are a few numbers per row, where each torch op costs several times a numpy one.
"""

from __future__ import annotations

import numpy as np
import torch

from ropeserve.errors import InvalidInput
from ropeserve.positions._common import (
    PAD_POSITION,
    IntsLike,
    as_long_array,
    as_mask_and_lengths,
    check_element_limit,
    device_of,
    first_true,
    per_row_array,
    per_row_values,
    require_at_least,
    require_int,
    require_sum_fits,
    tensor_on,
)

__all__ = [
    "decode_position_array",
    "decode_positions",
    "packed_position_array",
    "packed_positions",
    "positions_from_attention_mask",
]


def positions_from_attention_mask(
    attention_mask: IntsLike,
    *,
    past_lengths: IntsLike | int | None = None,
    fill_value: int = PAD_POSITION,
) -> torch.Tensor:
    """Positions of a padded batch: ``[B, T]`` 0/1 mask -> ``[B, T]`` int64 positions.

    A real token's position is ``past_lengths[b]`` plus the number of real tokens before it in its row, so left,
    right and interior padding all work (this is ``cumsum(mask) - 1``, as ``generate()`` builds it). Padded slots
    hold ``fill_value``.

    Args:
        attention_mask: ``[B, T]``, 1 for real tokens and 0 for padding (bool accepted).
        past_lengths: real tokens already in each row's KV cache (``[B]`` or one int for all rows); default 0.
        fill_value: value for padded slots.
    """
    mask, ones = as_mask_and_lengths(attention_mask, "attention_mask")
    past = per_row_values(past_lengths, mask.shape[0], "past_lengths", device=mask.device)
    require_sum_fits(past, ones - 1, "past_lengths")
    positions = mask.long().cumsum(dim=-1) - 1 + past[:, None]
    return positions.masked_fill(~mask, fill_value)


def packed_positions(
    *,
    segment_lengths: IntsLike | None = None,
    cu_seqlens: IntsLike | None = None,
    past_lengths: IntsLike | int | None = None,
    total_length: int | None = None,
    fill_value: int = PAD_POSITION,
    max_tokens: int | None = None,
) -> torch.Tensor:
    """Positions of sequences packed back to back in one buffer -> ``[N]`` int64.

    Positions restart at every boundary; give the boundaries either as ``segment_lengths`` ``[S]`` or as
    flash-attention style ``cu_seqlens`` ``[S + 1]`` (starts at 0, non-decreasing). Segment ``s`` continues from
    ``past_lengths[s]`` (its cached tokens; default 0), as in a varlen chunked-prefill batch.

    Args:
        total_length: buffer length ``N`` (default: the sum of the lengths); trailing slots hold ``fill_value``.
        max_tokens: optional limit on ``N`` (raises ``LimitExceeded`` before allocating).
    """
    positions = packed_position_array(
        segment_lengths=segment_lengths,
        cu_seqlens=cu_seqlens,
        past_lengths=past_lengths,
        total_length=total_length,
        fill_value=fill_value,
        max_tokens=max_tokens,
    )
    return tensor_on(positions, device_of(segment_lengths, cu_seqlens))


def packed_position_array(
    *,
    segment_lengths: IntsLike | None = None,
    cu_seqlens: IntsLike | None = None,
    past_lengths: IntsLike | int | None = None,
    total_length: int | None = None,
    fill_value: int = PAD_POSITION,
    max_tokens: int | None = None,
) -> np.ndarray:
    """:func:`packed_positions` as a new ``[N]`` int64 numpy array (a JSON answer needs no tensor), with the same
    checks in the same order."""
    lengths, field = _segment_lengths(segment_lengths, cu_seqlens)
    past = per_row_array(past_lengths, lengths.size, "past_lengths")
    require_sum_fits(past, lengths - 1, "past_lengths")
    used = sum(lengths.tolist())  # exact: an int64 sum of huge lengths wraps (and np.repeat crashes on it)
    length = used if total_length is None else require_int(total_length, "total_length", minimum=0)
    if length < used:
        raise InvalidInput(
            f"total_length {length} is shorter than the packed segments ({used} tokens)", field="total_length"
        )
    check_element_limit(length, max_tokens, "packed positions", field=field)
    segment_of_token = np.repeat(np.arange(lengths.size), lengths)
    starts = np.cumsum(lengths) - lengths
    positions = np.full(length, fill_value, dtype=np.int64)
    positions[:used] = np.arange(used) - starts[segment_of_token] + past[segment_of_token]
    return positions


def decode_positions(cache_lengths: IntsLike | int, num_new: int = 1) -> torch.Tensor:
    """Positions of the next ``num_new`` tokens of each row -> ``[B, num_new]`` int64.

    Row ``b`` gets ``cache_lengths[b] + arange(num_new)``; ``num_new > 1`` covers speculative decoding (the
    draft tokens verified in one step). ``cache_lengths`` counts the real tokens already in the cache.
    """
    return tensor_on(decode_position_array(cache_lengths, num_new), device_of(cache_lengths))


def decode_position_array(cache_lengths: IntsLike | int, num_new: int = 1) -> np.ndarray:
    """:func:`decode_positions` as a new ``[B, num_new]`` int64 numpy array, with the same checks in the same
    order."""
    count = require_int(num_new, "num_new", minimum=1)
    cache = as_long_array([cache_lengths] if isinstance(cache_lengths, int) else cache_lengths, "cache_lengths", ndim=1)
    require_at_least(cache, 0, "cache_lengths")
    check_element_limit(max(cache.size, 1) * count, None, "decode positions", field="num_new")  # arange(count)
    require_sum_fits(cache, 0, "cache_lengths", extra=count - 1)
    positions: np.ndarray = cache[:, None] + np.arange(count)  # numpy types this Any
    return positions


def _segment_lengths(segment_lengths: IntsLike | None, cu_seqlens: IntsLike | None) -> tuple[np.ndarray, str]:
    """``[S]`` lengths from exactly one of the two boundary forms, and the field name to blame."""
    if (segment_lengths is None) == (cu_seqlens is None):
        raise InvalidInput("give exactly one of segment_lengths and cu_seqlens", field="segment_lengths")
    if segment_lengths is not None:
        lengths = as_long_array(segment_lengths, "segment_lengths", ndim=1)
        require_at_least(lengths, 0, "segment_lengths")
        return lengths, "segment_lengths"
    assert cu_seqlens is not None
    cumulative = as_long_array(cu_seqlens, "cu_seqlens", ndim=1)
    if cumulative.size == 0 or int(cumulative[0]) != 0:
        raise InvalidInput("cu_seqlens must start with 0", field="cu_seqlens[0]")
    decreasing = first_true(cumulative[1:] < cumulative[:-1])  # compared, not diffed: a difference may wrap
    if decreasing is not None:
        index = decreasing + 1
        raise InvalidInput(
            f"cu_seqlens must be non-decreasing; cu_seqlens[{index}] = {int(cumulative[index])} is below "
            f"cu_seqlens[{index - 1}] = {int(cumulative[index - 1])} (segment {index - 1} has a negative length)",
            field=f"cu_seqlens[{index}]",
        )
    return np.diff(cumulative), "cu_seqlens"
