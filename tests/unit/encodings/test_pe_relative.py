"""T5 buckets against ``T5Attention._relative_position_bucket``; Shaw clipped indices against the formula."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers.models.t5.modeling_t5 import T5Attention

from ropeserve.encodings import relative_positions, shaw_relative_indices, shaw_table_rows, t5_relative_buckets
from ropeserve.errors import InvalidInput


def t5_reference(query_len: int, key_len: int, offset: int, **options: object) -> torch.Tensor:
    """What ``T5Attention.compute_bias`` indexes the bias embedding with (``past_seen_tokens = offset``)."""
    context = torch.arange(query_len)[:, None] + offset
    memory = torch.arange(key_len)[None, :]
    return T5Attention._relative_position_bucket(memory - context, **options)


T5_CASES = [
    (bidirectional, num_buckets, max_distance)
    for bidirectional in (True, False)
    for num_buckets, max_distance in [(32, 128), (64, 256), (8, 20), (4, 3), (2, 5), (33, 128)]
    if num_buckets >= (4 if bidirectional else 2)
]


@pytest.mark.parametrize(("bidirectional", "num_buckets", "max_distance"), T5_CASES)
def test_t5_buckets_equal_transformers(bidirectional: bool, num_buckets: int, max_distance: int) -> None:
    options = {"bidirectional": bidirectional, "num_buckets": num_buckets, "max_distance": max_distance}
    ours = t5_relative_buckets(300, 400, **options)
    assert ours.dtype == torch.int64
    assert torch.equal(ours, t5_reference(300, 400, 0, **options))
    assert int(ours.min()) >= 0 and int(ours.max()) < num_buckets


@settings(max_examples=50, deadline=None)
@given(
    query_len=st.integers(1, 40),
    key_len=st.integers(1, 300),
    offset=st.integers(0, 2000),
    bidirectional=st.booleans(),
    num_buckets=st.integers(4, 128),
    max_distance=st.integers(65, 1024),
)
def test_t5_buckets_equal_transformers_random(
    query_len: int, key_len: int, offset: int, bidirectional: bool, num_buckets: int, max_distance: int
) -> None:
    options = {"bidirectional": bidirectional, "num_buckets": num_buckets, "max_distance": max_distance}
    ours = t5_relative_buckets(query_len, key_len, offset=offset, **options)
    assert torch.equal(ours, t5_reference(query_len, key_len, offset, **options))


@settings(max_examples=50, deadline=None)
@given(
    query_len=st.integers(1, 30),
    key_len=st.integers(1, 30),
    offset=st.integers(0, 40),
    clip=st.integers(0, 12),
    bidirectional=st.booleans(),
)
def test_shaw_indices_formula(query_len: int, key_len: int, offset: int, clip: int, bidirectional: bool) -> None:
    ours = shaw_relative_indices(query_len, key_len, clip=clip, bidirectional=bidirectional, offset=offset)
    upper = clip if bidirectional else 0
    for q in range(query_len):
        for k in range(key_len):
            assert ours[q, k].item() == max(-clip, min(upper, k - (q + offset))) + clip
    assert int(ours.max()) < shaw_table_rows(clip, bidirectional)


def test_relative_positions_are_key_minus_query() -> None:
    assert relative_positions(2, 3, offset=1).tolist() == [[-1, 0, 1], [-2, -1, 0]]


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"num_buckets": 2, "bidirectional": True}, "num_buckets"),
        ({"num_buckets": 1, "bidirectional": False}, "num_buckets"),
        ({"num_buckets": 32, "max_distance": 8}, "max_distance"),
    ],
)
def test_invalid_t5_parameters_name_the_field(options: dict, field: str) -> None:
    with pytest.raises(InvalidInput) as raised:
        t5_relative_buckets(4, 4, **options)
    assert raised.value.field == field


def test_negative_clip_is_rejected() -> None:
    with pytest.raises(InvalidInput) as raised:
        shaw_relative_indices(2, 2, clip=-1)
    assert raised.value.field == "clip"


@pytest.mark.parametrize(("bidirectional", "largest"), [(True, 2**62 - 1), (False, 2**63 - 2)])
def test_clip_stays_where_every_index_and_the_table_rows_fit_int64(bidirectional: bool, largest: int) -> None:
    """A clip of 2**63 - 1 once wrapped the indices to -2**63 (and the row count to 2**64 - 1)."""
    indices = shaw_relative_indices(2, 3, clip=largest, bidirectional=bidirectional)
    assert indices.min() >= 0 and shaw_table_rows(largest, bidirectional) <= 2**63 - 1
    upper = 3 if bidirectional else 0  # distances here are within [-1, 2]: only the causal bound clips
    assert indices.tolist() == [[min(j - i, upper) + largest for j in range(3)] for i in range(2)]
    for make in (
        lambda: shaw_relative_indices(2, 3, clip=largest + 1, bidirectional=bidirectional),
        lambda: shaw_table_rows(largest + 1, bidirectional),
    ):
        with pytest.raises(InvalidInput) as raised:
            make()
        assert raised.value.field == "clip"
