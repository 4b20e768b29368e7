"""1-D positions: padded batches, packing, continuation and decode."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ropeserve.errors import InvalidInput, LimitExceeded
from ropeserve.positions import PAD_POSITION, decode_positions, packed_positions, positions_from_attention_mask
from ropeserve.positions.mrope import mrope_decode_positions


def test_left_right_and_interior_padding_with_default_fill() -> None:
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 0, 0], [1, 0, 1, 1, 0]])
    assert PAD_POSITION == 0
    assert positions_from_attention_mask(mask).tolist() == [[0, 0, 0, 1, 2], [0, 1, 2, 0, 0], [0, 0, 1, 2, 0]]


def test_fill_value_and_per_row_continuation() -> None:
    mask = [[0, 1, 1], [1, 1, 1]]
    positions = positions_from_attention_mask(mask, past_lengths=[10, 3], fill_value=-1)
    assert positions.tolist() == [[-1, 10, 11], [3, 4, 5]]
    assert positions_from_attention_mask(mask, past_lengths=5).tolist() == [[0, 5, 6], [5, 6, 7]]


@settings(max_examples=50, deadline=None)
@given(mask=st.lists(st.lists(st.integers(0, 1), min_size=6, max_size=6), min_size=1, max_size=4))
def test_matches_transformers_generate(mask: list[list[int]]) -> None:
    """``_prepare_position_ids_for_generation``: cumsum(mask) - 1 with pads set to 0."""
    tensor = torch.tensor(mask)
    expected = (tensor.cumsum(-1) - 1).masked_fill(tensor == 0, 0)
    assert torch.equal(positions_from_attention_mask(tensor), expected)
    assert torch.equal(positions_from_attention_mask(tensor.bool()), expected)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"attention_mask": [[1, 2]]}, "attention_mask[0][1]"),
        ({"attention_mask": [1, 1]}, "attention_mask"),
        ({"attention_mask": [[1, 1]], "past_lengths": [1, 2]}, "past_lengths"),
        ({"attention_mask": [[1, 1]], "past_lengths": [-1]}, "past_lengths[0]"),
        ({"attention_mask": torch.ones(1, 2)}, "attention_mask"),
    ],
)
def test_mask_errors(kwargs: dict, field: str) -> None:
    with pytest.raises(InvalidInput) as info:
        positions_from_attention_mask(**kwargs)
    assert info.value.field == field


def test_packed_restarts_at_boundaries_in_both_forms() -> None:
    expected = [0, 1, 2, 0, 0, 1, 2, 3]
    assert packed_positions(segment_lengths=[3, 1, 0, 4]).tolist() == expected
    assert packed_positions(cu_seqlens=[0, 3, 4, 4, 8]).tolist() == expected
    assert packed_positions(cu_seqlens=torch.tensor([0, 3, 4, 4, 8], dtype=torch.int32)).tolist() == expected


def test_packed_continuation_and_trailing_padding() -> None:
    positions = packed_positions(segment_lengths=[2, 3], past_lengths=[7, 0], total_length=7, fill_value=-1)
    assert positions.tolist() == [7, 8, 0, 1, 2, -1, -1]


@settings(max_examples=50, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 7), min_size=1, max_size=6),
    data=st.data(),
)
def test_packed_matches_concatenated_aranges(lengths: list[int], data: st.DataObject) -> None:
    past = data.draw(st.lists(st.integers(0, 50), min_size=len(lengths), max_size=len(lengths)))
    expected = [p + k for n, p in zip(lengths, past, strict=True) for k in range(n)]
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    assert packed_positions(segment_lengths=lengths, past_lengths=past).tolist() == expected
    assert packed_positions(cu_seqlens=cu, past_lengths=past).tolist() == expected


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({}, "segment_lengths"),
        ({"segment_lengths": [1], "cu_seqlens": [0, 1]}, "segment_lengths"),
        ({"segment_lengths": [2, -1]}, "segment_lengths[1]"),
        ({"cu_seqlens": [1, 3]}, "cu_seqlens[0]"),
        ({"cu_seqlens": []}, "cu_seqlens[0]"),
        ({"cu_seqlens": [0, 4, 2]}, "cu_seqlens[2]"),
        ({"segment_lengths": [3], "total_length": 2}, "total_length"),
        ({"segment_lengths": [3], "past_lengths": [1, 2]}, "past_lengths"),
        ({"segment_lengths": [[3]]}, "segment_lengths"),
    ],
)
def test_packed_errors(kwargs: dict, field: str) -> None:
    with pytest.raises(InvalidInput) as info:
        packed_positions(**kwargs)
    assert info.value.field == field


def test_packed_limit() -> None:
    with pytest.raises(LimitExceeded):
        packed_positions(segment_lengths=[10**6], max_tokens=1000)


@pytest.mark.parametrize(
    "lengths",
    [
        [2**62, 2**62],  # the int64 sum wraps to -2**63
        [2**62] * 4,  # ... to 0: numpy's repeat then crashed the process (segfault)
        [2**63 - 1, 2**63 - 1, 5],  # ... to 3
    ],
)
def test_packed_lengths_whose_sum_passes_int64_are_refused_by_their_exact_sum(lengths: list[int]) -> None:
    with pytest.raises(LimitExceeded) as info:
        packed_positions(segment_lengths=lengths, max_tokens=1000)
    assert info.value.field == "segment_lengths"
    with pytest.raises(InvalidInput, match=f"\\({sum(lengths)} tokens\\)") as shorter:
        packed_positions(segment_lengths=lengths, total_length=10)
    assert shorter.value.field == "total_length"


def test_decreasing_cu_seqlens_are_refused_even_where_their_difference_wraps() -> None:
    with pytest.raises(InvalidInput) as info:
        packed_positions(cu_seqlens=[0, 2**63 - 1, -(2**63)], max_tokens=1000)
    assert info.value.field == "cu_seqlens[2]"


def test_decode_next_k() -> None:
    assert decode_positions([5, 0], num_new=1).tolist() == [[5], [0]]
    assert decode_positions(torch.tensor([5, 9]), num_new=4).tolist() == [[5, 6, 7, 8], [9, 10, 11, 12]]
    assert decode_positions(3, num_new=2).tolist() == [[3, 4]]


@pytest.mark.parametrize("num_new", [2**40, 2**63])
def test_decode_of_no_rows_bounds_num_new_too(num_new: int) -> None:
    """``arange(num_new)`` is built even for zero rows: 2**40 asked numpy for 8 TiB, and 2**63 (past int64) gave
    an empty float64 tensor."""
    with pytest.raises(LimitExceeded) as info:
        decode_positions([], num_new=num_new)
    assert info.value.field == "num_new"
    with pytest.raises(LimitExceeded) as mrope:
        mrope_decode_positions([], [], num_new=num_new)
    assert mrope.value.field == "num_new"


def test_decode_continues_prefill_positions() -> None:
    mask = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])
    prefill = positions_from_attention_mask(mask)
    cache = mask.sum(dim=1)
    next_two = decode_positions(cache, num_new=2)
    extended = positions_from_attention_mask(torch.cat([mask, torch.ones(2, 2, dtype=torch.long)], dim=1))
    assert torch.equal(extended[:, -2:], next_two)
    assert torch.equal(extended[:, :4], prefill)


@pytest.mark.parametrize(
    ("cache", "num_new", "field"), [([-1], 1, "cache_lengths[0]"), ([1], 0, "num_new"), ([[1]], 1, "cache_lengths")]
)
def test_decode_errors(cache: list, num_new: int, field: str) -> None:
    with pytest.raises(InvalidInput) as info:
        decode_positions(cache, num_new=num_new)
    assert info.value.field == field
