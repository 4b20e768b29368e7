"""``packed_position_array`` and ``decode_position_array`` (what ``/v1/positions`` answers from, no tensor) against
plain-int references of the packing and decode rules; the tensor functions give the same values; an answer is new
memory, never a view of the caller's input."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ropeserve.errors import InvalidInput
from ropeserve.positions import decode_position_array, decode_positions, packed_position_array, packed_positions

LENGTHS = st.lists(st.integers(0, 40), max_size=6)


@settings(max_examples=200, deadline=None)
@given(
    lengths=LENGTHS,
    past_seed=st.integers(0, 10**6),
    pad=st.integers(0, 5),
    fill=st.integers(-3, 3),
    as_cu_seqlens=st.booleans(),
)
def test_packed_positions_restart_at_every_boundary(
    lengths: list[int], past_seed: int, pad: int, fill: int, as_cu_seqlens: bool
) -> None:
    past = [(past_seed * (k + 1)) % 5000 for k in range(len(lengths))]
    expected = [start + k for length, start in zip(lengths, past, strict=True) for k in range(length)] + [fill] * pad
    boundaries = {"cu_seqlens": [0, *itertools.accumulate(lengths)]} if as_cu_seqlens else {"segment_lengths": lengths}
    arguments = {**boundaries, "past_lengths": past, "total_length": sum(lengths) + pad, "fill_value": fill}
    array = packed_position_array(**arguments)
    assert array.dtype == np.int64 and array.flags.writeable and array.tolist() == expected
    assert packed_positions(**arguments).tolist() == expected


@settings(max_examples=200, deadline=None)
@given(cache=st.lists(st.integers(0, 10**12), max_size=6), num_new=st.integers(1, 5))
def test_decode_positions_continue_each_row(cache: list[int], num_new: int) -> None:
    expected = [[length + k for k in range(num_new)] for length in cache]
    array = decode_position_array(cache, num_new)
    assert array.dtype == np.int64 and array.shape == (len(cache), num_new) and array.tolist() == expected
    assert decode_positions(cache, num_new).tolist() == expected


def test_an_answer_is_new_memory_not_a_view_of_the_input() -> None:
    cache, lengths = np.array([3, 7], dtype=np.int64), np.array([4], dtype=np.int64)
    assert not np.shares_memory(decode_position_array(cache, 1), cache)
    assert not np.shares_memory(packed_position_array(segment_lengths=lengths), lengths)


@pytest.mark.parametrize(
    ("arguments", "field"),
    [
        ({"segment_lengths": [3, -1]}, "segment_lengths[1]"),
        ({"cu_seqlens": [0, 4, 2]}, "cu_seqlens[2]"),
        ({"segment_lengths": [3], "total_length": 2}, "total_length"),
        ({"segment_lengths": [3], "past_lengths": [2**63 - 2]}, "past_lengths"),
    ],
)
def test_packed_refusals_name_their_field(arguments: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidInput) as refused:
        packed_position_array(**arguments)  # type: ignore[arg-type]
    assert (refused.value.field or "").startswith(field)
