"""Hand-checked M-RoPE examples (spec §5.3, §5.4, §8 S3/S9) under both compat rules, decode and chunked prefill."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from positions_oracle import FAMILIES, SPLIT_FAMILIES, hf_get_rope_index, render_tokens

from ropeserve.positions import (
    DEFAULT_COMPAT,
    MROPE_FAMILIES,
    MRopeCompat,
    get_mrope_family,
    mrope_decode_positions,
    mrope_positions_from_segments,
    mrope_positions_from_tokens,
    slice_prefill_positions,
)
from ropeserve.positions._common import tensor_on

COMPATS = ["transformers5", "transformers4"]

# Example A: [t1 t2 <vs> IMG x6 <ve> t3], image grid (1, 4, 6) -> 2 x 3 merged.
EXAMPLE_A_TYPES = [0, 0, 0] + [1] * 6 + [0, 0]
EXAMPLE_A = [
    [0, 1, 2, 3, 3, 3, 3, 3, 3, 6, 7],
    [0, 1, 2, 3, 3, 3, 4, 4, 4, 6, 7],
    [0, 1, 2, 3, 4, 5, 3, 4, 5, 6, 7],
]
# Example C: [t <vs> V x16 <ve> t t], video grid (4, 4, 4).
EXAMPLE_C_TYPES = [0, 0] + [2] * 16 + [0, 0, 0]
VIDEO_HW = [2, 2, 3, 3] * 4, [2, 3, 2, 3] * 4
# Example D (Qwen3-VL): [t <vs> ts0 <vs> V x4 <ve> ts1 <vs> V x4 <ve> <ve> t], video grid (2, 4, 4).
EXAMPLE_D_TYPES = [0] * 4 + [2] * 4 + [0] * 3 + [2] * 4 + [0] * 3
EXAMPLE_D = [
    [0, 1, 2, 3, 4, 4, 4, 4, 6, 7, 8, 9, 9, 9, 9, 11, 12, 13],
    [0, 1, 2, 3, 4, 4, 5, 5, 6, 7, 8, 9, 9, 10, 10, 11, 12, 13],
    [0, 1, 2, 3, 4, 5, 4, 5, 6, 7, 8, 9, 10, 9, 10, 11, 12, 13],
]


def _video_axes(temporal: list[int], text_after: list[int]) -> list[list[int]]:
    heights, widths = VIDEO_HW
    t_axis = [0, 1, *[t for t in temporal for _ in range(4)], *text_after]
    return [t_axis, [0, 1, *heights, *text_after], [0, 1, *widths, *text_after]]


@pytest.mark.parametrize("compat", COMPATS)
@pytest.mark.parametrize("family", ["qwen2_vl", "qwen2_5_vl"])
def test_example_a_image(family: str, compat: str) -> None:
    result = mrope_positions_from_tokens(
        family=family, mm_token_type_ids=[EXAMPLE_A_TYPES], image_grid_thw=[[1, 4, 6]], compat=compat
    )
    assert result.position_ids[:, 0].tolist() == EXAMPLE_A
    assert result.mrope_position_deltas.tolist() == [[-3]]


def test_example_b_left_padding_and_pad_fill() -> None:
    types = [[0, 0, *EXAMPLE_A_TYPES], [0, 0, *EXAMPLE_A_TYPES]]
    mask = [[0, 0] + [1] * 11, [1] * 13]
    result = mrope_positions_from_tokens(
        family="qwen2_vl", mm_token_type_ids=types, attention_mask=mask, image_grid_thw=[[1, 4, 6]] * 2
    )
    assert result.position_ids[0, 0].tolist() == [0, 0, 0, 1, 2, 3, 3, 3, 3, 3, 3, 6, 7]
    assert result.position_ids[0, 1].tolist() == [0, 1, 2, 3, 4, 5, 5, 5, 5, 5, 5, 8, 9]
    assert result.mrope_position_deltas.tolist() == [[-3], [-3]]
    filled = mrope_positions_from_tokens(
        family="qwen2_vl",
        mm_token_type_ids=types,
        attention_mask=mask,
        image_grid_thw=[[1, 4, 6]] * 2,
        fill_value=-1,
    )
    assert filled.position_ids[:, 0, :2].eq(-1).all()


@pytest.mark.parametrize(
    ("family", "seconds", "compat", "temporal", "text_after", "delta"),
    [
        ("qwen2_vl", None, "transformers5", [2, 3, 4, 5], [4, 5, 6], -14),
        ("qwen2_vl", None, "transformers4", [2, 3, 4, 5], [6, 7, 8], -12),
        ("qwen2_5_vl", [1.0], "transformers5", [2, 4, 6, 8], [4, 5, 6], -12),
        ("qwen2_5_vl", [1.0], "transformers4", [2, 4, 6, 8], [9, 10, 11], -9),
        ("qwen2_5_vl", [0.5], "transformers5", [2, 3, 4, 5], [4, 5, 6], -14),
        ("qwen2_5_vl", [0.5], "transformers4", [2, 3, 4, 5], [6, 7, 8], -12),
    ],
)
def test_example_c_video_both_compat_rules(
    family: str, seconds: list[float] | None, compat: str, temporal: list[int], text_after: list[int], delta: int
) -> None:
    result = mrope_positions_from_tokens(
        family=family,
        mm_token_type_ids=[EXAMPLE_C_TYPES],
        video_grid_thw=[[4, 4, 4]],
        second_per_grid_ts=seconds,
        tokens_per_second=2,
        compat=compat,
    )
    assert result.position_ids[:, 0].tolist() == _video_axes(temporal, text_after)
    assert result.mrope_position_deltas.tolist() == [[delta]]


@pytest.mark.parametrize("compat", COMPATS)
@pytest.mark.parametrize("family", sorted(SPLIT_FAMILIES))
def test_example_d_frames_between_timestamps(family: str, compat: str) -> None:
    tokens = mrope_positions_from_tokens(
        family=family, mm_token_type_ids=[EXAMPLE_D_TYPES], video_grid_thw=[[2, 4, 4]], compat=compat
    )
    segments = mrope_positions_from_segments(
        [[{"text": 4}, {"video": [2, 4, 4], "frame_gaps": 3}, {"text": 3}]], family=family, compat=compat
    )
    for result in (tokens, segments):
        assert result.position_ids[:, 0].tolist() == EXAMPLE_D
        assert result.mrope_position_deltas.tolist() == [[-4]]


def test_issue_segment_example() -> None:
    rows = [[{"text": 12}, {"image": [1, 28, 28]}, {"video": [8, 16, 16], "second_per_grid_t": 0.5}, {"text": 5}]]
    result = mrope_positions_from_segments(rows, family="qwen2_5_vl", tokens_per_second=2)
    assert result.position_ids.shape == (3, 1, 12 + 196 + 512 + 5)
    # Image at 12 spans 14 x 14; the video starts at 26 with T step 2 * 0.5 = 1; text after at 26 + 8.
    assert result.position_ids[:, 0, 12].tolist() == [12, 12, 12]
    assert result.position_ids[:, 0, 12 + 196].tolist() == [26, 26, 26]
    assert result.position_ids[:, 0, -5:].tolist() == [[34, 35, 36, 37, 38]] * 3


def test_fractional_interval_float32_like_transformers() -> None:
    """fps 2.4 -> second_per_grid_t 0.8333 (float32); with tokens_per_second 2 the float32 product 3 * 1.6666666
    rounds to 5.0, where float64 gives 4.99999: transformers computes in float32 and so do we."""
    seconds = torch.tensor([2 / 2.4], dtype=torch.float32)
    batch = render_tokens([[{"text": 2}, {"video": [4, 2, 2], "second_per_grid_t": 2 / 2.4}]], "qwen2_5_vl", 2)
    expected, _ = hf_get_rope_index(
        "qwen2_5_vl",
        input_ids=batch.input_ids,
        mm_token_type_ids=batch.mm_token_type_ids,
        image_grid_thw=None,
        video_grid_thw=batch.video_grid_thw,
        attention_mask=None,
        second_per_grid_ts=seconds,
        tokens_per_second=2,
    )
    ours = mrope_positions_from_tokens(
        family="qwen2_5_vl",
        mm_token_type_ids=batch.mm_token_type_ids,
        video_grid_thw=batch.video_grid_thw,
        second_per_grid_ts=seconds,
        tokens_per_second=2,
    )
    assert ours.position_ids[0, 0, 2:].tolist() == [2, 3, 5, 7]  # floor(k * 1.6666666) = 0, 1, 3, 5 (+2)
    assert torch.equal(ours.position_ids, expected)
    segments = mrope_positions_from_segments(
        [[{"text": 2}, {"video": [4, 2, 2], "second_per_grid_t": 2 / 2.4}]], family="qwen2_5_vl"
    )
    assert torch.equal(segments.position_ids, expected)


def test_fps_above_two_is_not_truncated() -> None:
    """transformers 4.x cast second_per_grid_t to int first (0.5 -> 0, all frames collapsed); we never do."""
    result = mrope_positions_from_segments(
        [[{"video": [4, 2, 2], "second_per_grid_t": 0.25}]], family="qwen2_5_vl", tokens_per_second=2
    )
    assert result.position_ids[0, 0].tolist() == [0, 0, 1, 1]  # floor(k * 0.5)


@pytest.mark.parametrize("tokens_per_second", [2, 4, 25])
def test_images_never_scaled_by_tokens_per_second(tokens_per_second: int) -> None:
    rows = [[{"image": [2, 4, 4]}, {"text": 1}]]
    result = mrope_positions_from_segments(rows, family="qwen2_5_vl", tokens_per_second=tokens_per_second)
    assert result.position_ids[0, 0].tolist() == [0] * 4 + [1] * 4 + [2]


def test_default_compat_and_registry() -> None:
    assert DEFAULT_COMPAT is MRopeCompat.TRANSFORMERS5
    assert set(FAMILIES) <= set(MROPE_FAMILIES)
    assert get_mrope_family("qwen3_vl_moe") is MROPE_FAMILIES["qwen3_vl"]
    assert get_mrope_family("glm46v") is MROPE_FAMILIES["glm4v"]
    default = mrope_positions_from_tokens(
        family="qwen2_vl", mm_token_type_ids=[EXAMPLE_C_TYPES], video_grid_thw=[[4, 4, 4]]
    )
    assert default.position_ids[0, 0, -3:].tolist() == [4, 5, 6]


def test_empty_text_between_vision_blocks_and_empty_rows() -> None:
    rows = [[{"image": [1, 2, 4]}, {"text": 0}, {"video": [2, 2, 2]}], []]
    result = mrope_positions_from_segments(rows, family="qwen2_vl")
    assert result.position_ids[:, 0].tolist() == [[0, 0, 2, 3], [0, 0, 2, 2], [0, 1, 2, 2]]
    assert result.mrope_position_deltas.tolist() == [[0], [0]]
    assert result.attention_mask.tolist() == [[True] * 4, [False] * 4]


# ------------------------------------------------------------------------------------------------ decode
def test_decode_matches_generate_trace() -> None:
    """§8 S9: example A prompt decodes at 8 then 9 on all three axes; example C2 with cache 21 gives 9."""
    prefill = mrope_positions_from_tokens(
        family="qwen2_vl", mm_token_type_ids=[EXAMPLE_A_TYPES], image_grid_thw=[[1, 4, 6]]
    )
    assert mrope_decode_positions(prefill.mrope_position_deltas, [11], num_new=2).tolist() == [[[8, 9]]] * 3
    assert mrope_decode_positions([[-12]], 21).tolist() == [[[9]]] * 3


def test_decode_speculative_batch_shape() -> None:
    positions = mrope_decode_positions(torch.tensor([[-3], [5]]), torch.tensor([11, 2]), num_new=3)
    assert positions.shape == (3, 2, 3)
    assert positions[0].tolist() == [[8, 9, 10], [7, 8, 9]]
    assert torch.equal(positions[0], positions[1]) and torch.equal(positions[1], positions[2])


@pytest.mark.parametrize(
    ("family", "compat", "rows"),
    [
        ("qwen2_vl", "transformers4", [[{"text": 2}, {"video": [6, 4, 2]}, {"text": 1}]]),
        ("qwen2_5_vl", "transformers4", [[{"video": [3, 2, 2], "second_per_grid_t": 1.5}]]),
        ("qwen3_vl", "transformers5", [[{"text": 1}, {"video": [3, 4, 2], "frame_gaps": [2, 5]}]]),
        ("glm4v", "transformers4", [[{"image": [1, 2, 8]}, {"text": 3}, {"image": [1, 6, 2]}]]),
    ],
)
def test_decode_continues_a_prompt_extended_by_text(family: str, compat: str, rows: list) -> None:
    """Decoding k tokens gives what a prefill of the prompt plus k text tokens gives (always true under
    transformers4; under transformers5 whenever no video outruns its spatial extent)."""
    prompt = mrope_positions_from_segments(rows, family=family, compat=compat)
    extended = mrope_positions_from_segments([rows[0] + [{"text": 4}]], family=family, compat=compat)
    length = int(prompt.attention_mask.sum())
    decoded = mrope_decode_positions(prompt.mrope_position_deltas, [length], num_new=4)
    assert torch.equal(decoded[:, 0], extended.position_ids[:, 0, -4:])


def test_transformers5_decode_disagrees_for_long_videos() -> None:
    """§5.4: in 5.24 the delta comes from the video's T max, not the last text position."""
    prompt = mrope_positions_from_segments([[{"video": [6, 2, 2]}, {"text": 1}]], family="qwen2_vl")
    assert prompt.position_ids[0, 0, -1].item() == 1
    assert mrope_decode_positions(prompt.mrope_position_deltas, [7]).flatten().tolist() == [6, 6, 6]


def test_chunked_prefill_slices_concatenate() -> None:
    full = mrope_positions_from_segments(
        [[{"text": 3}, {"image": [1, 4, 6]}, {"text": 2}, {"video": [2, 2, 4]}, {"text": 3}]], family="qwen2_vl"
    )
    flat = full.position_ids[:, 0]
    chunks = [slice_prefill_positions(flat, start, min(start + 5, flat.shape[1])) for start in range(0, 18, 5)]
    assert all(chunk.shape[0] == 3 for chunk in chunks)
    assert torch.equal(torch.cat(chunks, dim=1), flat)
    assert slice_prefill_positions(full.position_ids, 2, 4).shape == (3, 1, 2)


@pytest.mark.parametrize(
    ("context_len", "seq_len", "field"), [(-1, 3, "context_len"), (4, 3, "seq_len"), (0, 99, "seq_len")]
)
def test_chunked_prefill_rejects_bad_ranges(context_len: int, seq_len: int, field: str) -> None:
    from ropeserve.errors import InvalidInput

    with pytest.raises(InvalidInput) as info:
        slice_prefill_positions(torch.zeros(3, 10, dtype=torch.long), context_len, seq_len)
    assert info.value.field == field


def test_interior_padding_inside_text_matches_transformers() -> None:
    types = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 1, 1, 0, 0, 0], [0] * 12])
    mask = torch.tensor([[1, 0, 1, 1, 1, 1, 1, 1, 1, 1, 0, 1], [0, 1, 1, 0, 0, 1, 1, 1, 1, 1, 1, 0]])
    for family in FAMILIES:
        expected, deltas = hf_get_rope_index(
            family,
            input_ids=torch.full_like(types, 7),
            mm_token_type_ids=types,
            image_grid_thw=torch.tensor([[1, 4, 6]]),
            video_grid_thw=None,
            attention_mask=mask,
        )
        ours = mrope_positions_from_tokens(
            family=family, mm_token_type_ids=types, attention_mask=mask, image_grid_thw=[[1, 4, 6]]
        )
        assert torch.equal(ours.position_ids, expected)
        assert torch.equal(ours.mrope_position_deltas, deltas)


@pytest.mark.parametrize("compat", COMPATS)
def test_positions_beyond_int32_and_huge_fill_values(compat: str) -> None:
    """Exercises the int64 fallback of the per-token pass (positions >= 2**30 or a huge fill value)."""
    from positions_oracle import reference_row

    rows = [[{"text": 2}, {"video": [3, 2, 2], "second_per_grid_t": 1.0}, {"text": 2}], [{"text": 1}]]
    fill = -(2**40)
    result = mrope_positions_from_segments(
        rows, family="qwen2_5_vl", tokens_per_second=1e9, compat=compat, fill_value=fill
    )
    for b, segments in enumerate(rows):
        axes, delta = reference_row(segments, "qwen2_5_vl", 2, 1e9, compat)
        assert result.position_ids[:, b, result.attention_mask[b]].tolist() == axes
        assert int(result.mrope_position_deltas[b, 0]) == delta
    assert result.position_ids[0, 0, 4] == 2 + 2 * 10**9
    assert (result.position_ids[:, 1, 1:] == fill).all()


def test_results_are_ordinary_tensors() -> None:
    """The layout runs under inference mode internally; callers must still get tensors they can modify."""
    tokens = mrope_positions_from_tokens(
        family="qwen2_vl", mm_token_type_ids=[EXAMPLE_A_TYPES], image_grid_thw=[[1, 4, 6]]
    )
    segments = mrope_positions_from_segments([[{"text": 2}, {"image": [1, 2, 2]}]], family="qwen2_vl")
    for result in (tokens, segments):
        for tensor in (result.position_ids, result.mrope_position_deltas, result.attention_mask):
            assert not tensor.is_inference()
        result.position_ids.add_(1)
        result.mrope_position_deltas.sub_(1)


def test_decode_positions_of_no_rows_are_a_writable_tensor() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch warns when it wraps a read-only array
        positions = mrope_decode_positions([], [], 3)
    assert positions.shape == (3, 0, 3)
    positions.add_(1)


def test_read_only_arrays_become_tensors_of_their_own() -> None:
    source = np.arange(6)
    source.flags.writeable = False
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tensor = tensor_on(source, None)
    tensor += 1
    assert source.tolist() == list(range(6)) and tensor.tolist() == list(range(1, 7))
