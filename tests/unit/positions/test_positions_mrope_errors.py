"""Inconsistent M-RoPE input raises InvalidInput (422) naming the row and segment (or the argument)."""

from __future__ import annotations

import tracemalloc
from typing import Any

import pytest

from ropeserve.errors import InvalidInput, LimitExceeded
from ropeserve.positions import mrope_positions_from_segments, mrope_positions_from_tokens
from ropeserve.positions.families import MRopeCompat, parse_compat

ROW_A = [0, 0, 0] + [1] * 6 + [0, 0]  # image grid (1, 4, 6) at columns 3..8


def _token_error(**kwargs: Any) -> InvalidInput:
    kwargs.setdefault("family", "qwen2_vl")
    with pytest.raises(InvalidInput) as info:
        mrope_positions_from_tokens(**kwargs)
    assert info.value.status == 422
    return info.value


def _segment_error(rows: list, family: str = "qwen2_vl", **kwargs: Any) -> InvalidInput:
    with pytest.raises(InvalidInput) as info:
        mrope_positions_from_segments(rows, family=family, **kwargs)
    return info.value


def test_token_count_does_not_match_grid_names_padded_row_and_columns() -> None:
    short_row = [0, 0, 0, 0, 0] + [1] * 4 + [0, 0]
    error = _token_error(
        mm_token_type_ids=[ROW_A, short_row],
        attention_mask=[[1] * 11, [0, 0] + [1] * 9],
        image_grid_thw=[[1, 4, 6], [1, 4, 6]],
    )
    assert error.field == "rows[1].segments[1]"
    assert "columns 5..8" in error.detail and "4 tokens" in error.detail and "needs 6" in error.detail


def test_more_vision_blocks_than_grids() -> None:
    error = _token_error(mm_token_type_ids=[ROW_A + [1] * 2], image_grid_thw=[[1, 4, 6]])
    assert error.field == "rows[0].segments[3]"
    assert "no grid" in error.detail


def test_qwen3_frames_count_against_split_grids() -> None:
    frames = [0] + [2] * 4 + [0] + [2] * 4 + [0] + [2] * 4
    error = _token_error(family="qwen3_vl", mm_token_type_ids=[frames], video_grid_thw=[[2, 4, 4]])
    assert error.field == "rows[0].segments[5]"
    assert "has frames (2)" in error.detail


def test_unused_grid_names_the_grid() -> None:
    error = _token_error(mm_token_type_ids=[ROW_A], image_grid_thw=[[1, 4, 6], [1, 2, 2]])
    assert error.field == "image_grid_thw[1]"


@pytest.mark.parametrize(
    ("frames", "unused"),
    [
        ([2, 2], 1),  # 3 blocks: the second video's second frame has none
        ([4], 0),
        ([2**62] * 4, 0),  # the int64 frame count wraps to 0: numpy's repeat crashed the process (segfault)
        ([10**8], 0),  # 10**8 frames (an 800 MB index, then 2.4 GB of grids) made before this refusal
    ],
)
def test_split_video_frames_past_the_video_blocks_are_refused_before_they_are_made(
    frames: list[int], unused: int
) -> None:
    blocks = [0, 2, 2, 2, 2, 0, 2, 2, 2, 2, 0, 2, 2, 2, 2]  # three one-frame blocks of (1, 4, 4)
    tracemalloc.start()  # numpy reports its allocations to tracemalloc
    try:
        error = _token_error(family="qwen3_vl", mm_token_type_ids=[blocks], video_grid_thw=[[t, 4, 4] for t in frames])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 * 2**20
    assert error.field == f"video_grid_thw[{unused}]"
    assert "the tokens hold only 3 video blocks" in error.detail


def test_grid_not_divisible_by_merge() -> None:
    error = _token_error(mm_token_type_ids=[ROW_A], image_grid_thw=[[1, 3, 8]])
    assert error.field == "rows[0].segments[1]"
    assert "multiples of spatial_merge_size 2" in error.detail


@pytest.mark.parametrize("grid", [[0, 4, 6], [1, 0, 6], [1, 4, -2]])
def test_zero_size_grid(grid: list[int]) -> None:
    error = _token_error(mm_token_type_ids=[ROW_A], image_grid_thw=[grid])
    assert error.field == "rows[0].segments[1]"


def test_zero_frame_video_in_split_family() -> None:
    error = _token_error(family="glm4v", mm_token_type_ids=[[0] + [2] * 4], video_grid_thw=[[0, 4, 4], [1, 4, 4]])
    assert error.field == "rows[0].segments[1]"
    assert "no frames" in error.detail


def test_fewer_tokens_than_the_grid_needs_at_sequence_end() -> None:
    error = _token_error(mm_token_type_ids=[[0, 0] + [2] * 10], video_grid_thw=[[4, 4, 4]])
    assert error.field == "rows[0].segments[1]"
    assert "10 tokens" in error.detail and "needs 16" in error.detail


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"mm_token_type_ids": [[0, 3, 0]]}, "mm_token_type_ids[0][1]"),
        ({"mm_token_type_ids": [[0, 0]], "attention_mask": [[1, 2]]}, "attention_mask[0][1]"),
        ({"mm_token_type_ids": [[0, 0]], "attention_mask": [[1, 1, 1]]}, "attention_mask"),
        ({"mm_token_type_ids": [0, 0]}, "mm_token_type_ids"),
        ({}, "mm_token_type_ids"),
        ({"mm_token_type_ids": [[0]], "image_grid_thw": [[1, 2]]}, "image_grid_thw"),
        ({"mm_token_type_ids": [[0]], "family": "llava"}, "family"),
        ({"mm_token_type_ids": [[0]], "compat": "vllm0"}, "compat"),
        ({"mm_token_type_ids": [[0]], "spatial_merge_size": 0}, "spatial_merge_size"),
    ],
)
def test_malformed_arguments(kwargs: dict[str, Any], field: str) -> None:
    assert _token_error(**kwargs).field == field


@pytest.mark.parametrize(
    ("seconds", "field"),
    [
        ([1.0, 2.0], "second_per_grid_ts"),
        ([-0.5], "second_per_grid_ts[0]"),
        ([float("nan")], "second_per_grid_ts[0]"),
        ([10**400], "second_per_grid_ts"),  # was an OverflowError from torch.as_tensor
    ],
)
def test_bad_second_per_grid_ts(seconds: list[float], field: str) -> None:
    error = _token_error(
        family="qwen2_5_vl",
        mm_token_type_ids=[[0] + [2] * 4],
        video_grid_thw=[[1, 4, 4]],
        second_per_grid_ts=seconds,
    )
    assert error.field == field


def test_second_per_grid_ts_is_ignored_by_frame_index_family() -> None:
    result = mrope_positions_from_tokens(
        family="qwen2_vl", mm_token_type_ids=[[2] * 8], video_grid_thw=[[2, 4, 4]], second_per_grid_ts=[7.0]
    )
    assert result.position_ids[0, 0].tolist() == [0] * 4 + [1] * 4


@pytest.mark.parametrize(
    ("rows", "family", "field", "needle"),
    [
        (
            [[{"text": 1}], [{"text": 2}, {"image": [1, 4, 4]}, {"text": -1}]],
            "qwen2_vl",
            "rows[1].segments[2]",
            "negative",
        ),
        ([[{"image": [1, 0, 4]}]], "qwen2_vl", "rows[0].segments[0]", "zero or negative"),
        ([[{"text": 3}, {"video": [0, 4, 6]}]], "qwen2_vl", "rows[0].segments[1]", "zero or negative"),
        ([[{"image": [1, 3, 4]}]], "qwen2_vl", "rows[0].segments[0]", "multiples of spatial_merge_size"),
        ([[{"image": [1, 4]}]], "qwen2_vl", "rows[0].segments[0]", "[t, h, w]"),
        ([[{"image": [1, 4, 4.5]}]], "qwen2_vl", "rows[0].segments[0]", "integer"),
        ([[{"text": 2, "image": [1, 2, 2]}]], "qwen2_vl", "rows[0].segments[0]", "exactly one"),
        ([[{"audio": 3}]], "qwen2_vl", "rows[0].segments[0]", "exactly one"),
        ([[{"image": [1, 2, 2], "second_per_grid_t": 1.0}]], "qwen2_vl", "rows[0].segments[0]", "unexpected"),
        ([["text"]], "qwen2_vl", "rows[0].segments[0]", "object"),
        ([[{"text": True}]], "qwen2_vl", "rows[0].segments[0]", "integer"),
        ([[{"video": [2, 4, 4]}]], "qwen3_vl", "rows[0].segments[0]", "frame_gaps"),
        ([[{"video": [3, 4, 4], "frame_gaps": [1]}]], "glm4v", "rows[0].segments[0]", "list of 2"),
        ([[{"video": [2, 4, 4], "frame_gaps": -1}]], "glm4v", "rows[0].segments[0]", ">= 0"),
        ([[{"video": [2, 4, 4], "frame_gaps": 2}]], "qwen2_vl", "rows[0].segments[0]", "frame_gaps"),
        ([[{"video": [2, 4, 4], "second_per_grid_t": -1}]], "qwen2_5_vl", "rows[0].segments[0]", ">= 0"),
        ([[{"video": [2, 4, 4], "second_per_grid_t": float("inf")}]], "qwen2_5_vl", "rows[0].segments[0]", "finite"),
        ([{"text": 1}], "qwen2_vl", "rows[0]", "list of segments"),
    ],
)
def test_segment_errors_name_row_and_segment(rows: list, family: str, field: str, needle: str | None) -> None:
    error = _segment_error(rows, family)
    assert error.field == field
    assert field in error.detail
    if needle:
        assert needle in error.detail


def test_segment_limits_and_options() -> None:
    with pytest.raises(LimitExceeded):
        mrope_positions_from_segments([[{"video": [64, 256, 256]}]], family="qwen2_vl", max_tokens=100_000)
    assert _segment_error([[{"text": 1}]], padding_side="middle").field == "padding_side"
    assert _segment_error("abc").field == "rows"


def test_padding_inside_a_vision_run_splits_it() -> None:
    error = _token_error(
        mm_token_type_ids=[[0, 1, 1, 1, 1, 1, 1, 0]],
        attention_mask=[[1, 1, 1, 1, 0, 1, 1, 1]],
        image_grid_thw=[[1, 4, 6]],
    )
    assert error.field == "rows[0].segments[2]"
    assert "columns 5..6" in error.detail and "no grid" in error.detail


def test_absurd_sizes_fail_as_limit_exceeded_without_a_configured_limit() -> None:
    with pytest.raises(LimitExceeded):
        mrope_positions_from_segments([[{"video": [10**6, 10**6, 10**6]}]], family="qwen2_vl")


def test_frame_count_is_limited_before_the_per_frame_work() -> None:
    with pytest.raises(LimitExceeded) as info:
        mrope_positions_from_segments(
            [[{"text": 1}, {"video": [10**9, 2, 2], "frame_gaps": 3}]], family="qwen3_vl", max_tokens=10_000
        )
    assert info.value.field == "rows[0].segments[1]"


@pytest.mark.parametrize("compat", [*MRopeCompat, *(member.value for member in MRopeCompat)])
def test_parse_compat_takes_members_and_their_strings(compat: str) -> None:
    assert parse_compat(compat) is MRopeCompat(compat)


@pytest.mark.parametrize("compat", ["Transformers5", "", "vllm ", None, 5, ["vllm"], {"vllm": 1}])
def test_parse_compat_refuses_anything_else_naming_compat(compat: Any) -> None:
    with pytest.raises(InvalidInput, match="unknown compat") as error:
        parse_compat(compat)
    assert error.value.field == "compat"
