"""Vision-tower 2-D position ids against transformers.vision_utils.get_vision_position_ids (spec §6, §8 S8)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers.vision_utils import get_vision_position_ids

from ropeserve.errors import InvalidInput, LimitExceeded
from ropeserve.positions import vision_position_ids


def test_spec_examples() -> None:
    ids = vision_position_ids([[1, 4, 4]], 2)
    assert ids[:, 0].tolist() == [0, 0, 1, 1, 0, 0, 1, 1, 2, 2, 3, 3, 2, 2, 3, 3]
    assert ids[:, 1].tolist() == [0, 1, 0, 1, 2, 3, 2, 3, 0, 1, 0, 1, 2, 3, 2, 3]
    video = vision_position_ids(torch.tensor([[2, 2, 4]]), 2)
    assert video[:, 0].tolist() == [0, 0, 1, 1, 0, 0, 1, 1] * 2
    assert video[:, 1].tolist() == [0, 1, 0, 1, 2, 3, 2, 3] * 2
    assert video.shape == (16, 2) and video.dtype == torch.long


@st.composite
def grids(draw: st.DrawFn) -> tuple[list[list[int]], list[int]]:
    count = draw(st.integers(1, 5))
    merges = [draw(st.sampled_from([1, 2, 2, 3])) for _ in range(count)]
    rows = [[draw(st.integers(1, 3)), m * draw(st.integers(1, 5)), m * draw(st.integers(1, 5))] for m in merges]
    return rows, merges


@settings(max_examples=50, deadline=None)
@given(case=grids())
def test_matches_transformers(case: tuple[list[list[int]], list[int]]) -> None:
    rows, merges = case
    grid = torch.tensor(rows)
    expected = get_vision_position_ids(grid, torch.tensor(merges))
    assert torch.equal(vision_position_ids(grid, merges), expected)
    if len(set(merges)) == 1:
        assert torch.equal(vision_position_ids(rows, merges[0]), get_vision_position_ids(grid, merges[0]))


def test_empty_grid_list() -> None:
    assert vision_position_ids(torch.zeros((0, 3), dtype=torch.long), 2).shape == (0, 2)


@pytest.mark.parametrize(
    ("grid", "merge", "field"),
    [
        ([[1, 4, 6], [1, 3, 4]], 2, "grid_thw[1]"),
        ([[0, 4, 4]], 2, "grid_thw[0]"),
        ([[1, 4, 4]], [2, 2], "spatial_merge_size"),
        ([[1, 4, 4]], 0, "spatial_merge_size[0]"),
        ([1, 4, 4], 2, "grid_thw"),
        ([[1.0, 4.0, 4.0]], 2, "grid_thw"),
    ],
)
def test_errors(grid: list, merge: int | list[int], field: str) -> None:
    with pytest.raises(InvalidInput) as info:
        vision_position_ids(grid, merge)
    assert info.value.field == field


def test_limit() -> None:
    with pytest.raises(LimitExceeded):
        vision_position_ids([[100, 1024, 1024]], 2, max_tokens=1_000_000)
