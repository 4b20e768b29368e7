"""The M-RoPE engine's cheap paths for small input (issue 15) give exactly what the general paths and transformers
give: the direct and running-sum expansions, the one-row layout, frame times computed in numpy instead of torch,
the blocks that skip frame times, and the layout's arrays (what the JSON route answers from)."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from positions_oracle import FAMILIES, hf_get_rope_index, render_tokens, segment_rows

from ropeserve.errors import InvalidInput
from ropeserve.positions import _blocks, mrope_positions_from_segments, mrope_positions_from_tokens, segment_layout
from ropeserve.positions.families import MRopeCompat

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _transformers(rows: list[list[dict[str, Any]]], family: str, pads: list[int] | None = None) -> Any:
    batch = render_tokens(rows, family, 2, pads=pads)
    expected = hf_get_rope_index(family, input_ids=batch.input_ids, **batch.kwargs())
    ours = mrope_positions_from_tokens(family=family, **batch.kwargs())
    return expected, ours


EXPANSIONS = {"running-sum": (0, 0), "direct": (10**9, 0), "patterns": (10**9, 10**9)}
"""Expansion -> (DIRECT_EXPANSION_TOKENS, PATTERN_EXPANSION_BLOCKS) that selects it for the small rows drawn."""


@pytest.mark.parametrize("expansion", list(EXPANSIONS))
@pytest.mark.parametrize("family", FAMILIES)
@SETTINGS
@given(data=st.data())
def test_every_expansion_matches_transformers(family: str, expansion: str, data: st.DataObject) -> None:
    rows = data.draw(segment_rows(family, 2))
    pads = data.draw(st.lists(st.integers(0, 3), min_size=len(rows), max_size=len(rows)))
    direct_up_to, pattern_blocks = EXPANSIONS[expansion]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_blocks, "DIRECT_EXPANSION_TOKENS", direct_up_to)
        patch.setattr(_blocks, "PATTERN_EXPANSION_BLOCKS", pattern_blocks)
        (expected_ids, expected_deltas), ours = _transformers(rows, family, pads)
    assert torch.equal(ours.position_ids, expected_ids)
    assert torch.equal(ours.mrope_position_deltas, expected_deltas)


@pytest.mark.parametrize("images", [2, 40], ids=["below-threshold", "above-threshold"])
def test_default_threshold_both_sides_match_transformers(images: int) -> None:
    row = [seg for _ in range(images) for seg in ({"text": 7}, {"image": [1, 8, 12]})] + [{"text": 3}]
    rows = [row, row[:-3]]
    (expected_ids, expected_deltas), ours = _transformers(rows, "qwen2_vl", pads=[0, 2])
    total = expected_ids[0].numel()
    assert (total <= _blocks.DIRECT_EXPANSION_TOKENS) == (images == 2)
    assert torch.equal(ours.position_ids, expected_ids)
    assert torch.equal(ours.mrope_position_deltas, expected_deltas)


@pytest.mark.parametrize("family", FAMILIES)
@SETTINGS
@given(data=st.data())
def test_a_row_alone_equals_that_row_in_a_batch(family: str, data: st.DataObject) -> None:
    """One row skips the per-row restart of the running start; in a batch the restart gives it the same start."""
    rows = data.draw(segment_rows(family, 2))
    batch = mrope_positions_from_segments(rows, family=family, padding_side="left")
    width = batch.position_ids.shape[-1]
    for b, row in enumerate(rows):
        alone = mrope_positions_from_segments([row], family=family)
        length = alone.position_ids.shape[-1]
        assert torch.equal(batch.position_ids[:, b, width - length :], alone.position_ids[:, 0])
        assert torch.equal(batch.mrope_position_deltas[b], alone.mrope_position_deltas[0])


def _torch_offsets(frames: int, seconds: float, tps: float, dtype: torch.dtype, seconds_first: bool) -> list[int]:
    """Frame times as transformers (``arange * (tps * s)``) or vLLM (``(arange * s) * tps``) write them, in torch."""
    frame = torch.arange(frames).to(dtype)
    second = torch.tensor(seconds, dtype=dtype)
    scaled = (frame * second) * tps if seconds_first else frame * (second * tps)
    return scaled.long().tolist()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("compat", [MRopeCompat.TRANSFORMERS5, MRopeCompat.VLLM])
def test_numpy_frame_times_equal_torch_bit_for_bit(dtype: type[np.floating], compat: MRopeCompat) -> None:
    rng = np.random.default_rng(15)
    seconds_choices = [-0.0, 0.0, 0.7, 1 / 3, 2 / 2.4, 1.5 + 2**-30, 1e-30]
    tps_choices = [2.0, 25.0, 0.7, 1.5 + 2**-30, 1e6]
    cases = [(s, tps) for s in seconds_choices for tps in tps_choices]
    cases += [(float(s), float(t)) for s, t in zip(rng.random(200) * 3, rng.random(200) * 30, strict=True)]
    frames = 3000
    for seconds, tps in cases:
        kind = np.array([_blocks.TEXT_TOKEN, _blocks.VIDEO_TOKEN])
        step, scale = _blocks.time_factors(kind, np.array([1.0, seconds]), dtype, tps, compat)
        assert step.dtype == dtype
        ours = _blocks._temporal_offsets(np.arange(frames), np.full(frames, step[1]), scale)
        torch_dtype = torch.float32 if dtype == np.float32 else torch.float64
        expected = _torch_offsets(frames, seconds, tps, torch_dtype, compat == MRopeCompat.VLLM)
        assert ours.tolist() == expected, (seconds, tps)


def test_negative_zero_seconds_give_frame_time_zero_as_transformers() -> None:
    rows = [[{"text": 2}, {"video": [4, 4, 4], "second_per_grid_t": -0.0}, {"text": 3}]]
    batch = render_tokens(rows, "qwen2_5_vl", 2)
    assert batch.second_per_grid_ts is not None and bool(torch.signbit(batch.second_per_grid_ts).all())
    expected_ids, expected_deltas = hf_get_rope_index("qwen2_5_vl", input_ids=batch.input_ids, **batch.kwargs())
    for ours in (
        mrope_positions_from_tokens(family="qwen2_5_vl", **batch.kwargs()),
        mrope_positions_from_segments(rows, family="qwen2_5_vl"),
    ):
        assert torch.equal(ours.position_ids, expected_ids)
        assert torch.equal(ours.mrope_position_deltas, expected_deltas)


@pytest.mark.parametrize("form", ["segments", "tokens"])
def test_one_frame_video_still_has_its_seconds_checked(form: str) -> None:
    """A video of one frame needs no frame time, but its step (here past float32: inf, then 0 * inf) is refused
    as before; no numpy warning escapes."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(InvalidInput) as info:
            if form == "segments":
                rows = [[{"text": 1}, {"video": [1, 4, 4], "second_per_grid_t": 1e300}]]
                mrope_positions_from_segments(rows, family="qwen2_5_vl")
            else:
                mrope_positions_from_tokens(
                    family="qwen2_5_vl",
                    mm_token_type_ids=[[0, 2, 2, 2, 2]],
                    video_grid_thw=[[1, 4, 4]],
                    second_per_grid_ts=torch.tensor([1e300], dtype=torch.float64),
                    tokens_per_second=1e12,
                )
    assert info.value.field == "second_per_grid_t"


@pytest.mark.parametrize(("compat", "frame_times"), [("transformers5", [0, 1, 2]), ("vllm", [0, 0, 0])])
def test_image_of_several_frames_keeps_its_frame_times(compat: str, frame_times: list[int]) -> None:
    """No video, but a 3-frame image: frame times are still applied (transformers steps 1 per frame, vLLM 0)."""
    rows = [[{"text": 2}, {"image": [3, 2, 2]}]]
    ours = mrope_positions_from_segments(rows, family="qwen2_5_vl", compat=compat)
    assert ours.position_ids[0, 0, 2:].tolist() == [2 + t for t in frame_times]
    tokens = mrope_positions_from_tokens(
        family="qwen2_5_vl", mm_token_type_ids=[[0, 0, 1, 1, 1]], image_grid_thw=[[3, 2, 2]], compat=compat
    )
    assert torch.equal(tokens.position_ids, ours.position_ids)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("tokens_per_second", [25, 2.3])
@pytest.mark.parametrize("compute", ["direct", "one-per-token-line"])
def test_narrow_float_seconds_match_transformers(dtype: torch.dtype, tokens_per_second: float, compute: str) -> None:
    """A float16 / bfloat16 seconds tensor (what ``BatchFeature.to(dtype)`` makes of the processor's) is computed
    in its dtype, as transformers does: bfloat16 0.7 * 25 is 17.5 (17.48 in float32: frame 2 at 35, not 34), and
    the frame times of long videos round to the dtype's spacing. Left padding, two videos, frames up to 300."""
    rows = [
        [{"text": 3}, {"video": [300, 2, 2], "second_per_grid_t": 0.7}, {"text": 2}],
        [{"text": 1}, {"video": [40, 2, 4], "second_per_grid_t": 1 / 3}, {"text": 4}],
    ]
    batch = render_tokens(rows, "qwen2_5_vl", 2, pads=[0, 5])
    seconds = batch.second_per_grid_ts.to(dtype)
    kwargs = batch.kwargs() | {"second_per_grid_ts": seconds}
    expected, deltas = hf_get_rope_index(
        "qwen2_5_vl", input_ids=batch.input_ids, **kwargs, tokens_per_second=tokens_per_second
    )
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_blocks, "DIRECT_EXPANSION_TOKENS", 10**9 if compute == "direct" else 0)
        ours = mrope_positions_from_tokens(family="qwen2_5_vl", tokens_per_second=tokens_per_second, **kwargs)
    real = batch.attention_mask.bool()
    assert torch.equal(ours.position_ids[:, real], expected[:, real])
    assert torch.equal(ours.mrope_position_deltas, deltas)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("compat", [MRopeCompat.VLLM, MRopeCompat.SGLANG])
def test_narrow_float_seconds_are_float32_under_the_engine_rules(dtype: torch.dtype, compat: MRopeCompat) -> None:
    """The engines' rules multiply in float32 whatever the tensor's dtype (vLLM reads Python floats): a float16 /
    bfloat16 tensor gives what its values give as float32 (300 frames of 0.7 s: rounded per product in the narrow
    dtype, many frames would differ)."""
    kwargs: dict[str, Any] = {
        "family": "qwen2_5_vl",
        "mm_token_type_ids": [[0] + [2] * 300],
        "video_grid_thw": [[300, 2, 2]],
        "tokens_per_second": 25,
        "compat": compat,
    }
    seconds = torch.tensor([0.7], dtype=dtype)
    narrow = mrope_positions_from_tokens(**kwargs, second_per_grid_ts=seconds)
    widened = mrope_positions_from_tokens(**kwargs, second_per_grid_ts=seconds.float())
    assert torch.equal(narrow.position_ids, widened.position_ids)


def test_seconds_tensor_that_requires_grad_is_read() -> None:
    """The seconds are read into numpy: a tensor that requires grad must still be accepted."""
    kwargs: dict[str, Any] = {
        "family": "qwen2_5_vl",
        "mm_token_type_ids": [[0] + [2] * 12],
        "video_grid_thw": [[3, 4, 4]],
    }
    seconds = torch.tensor([0.5], requires_grad=True)
    expected = mrope_positions_from_tokens(**kwargs, second_per_grid_ts=[0.5])
    assert torch.equal(
        mrope_positions_from_tokens(**kwargs, second_per_grid_ts=seconds).position_ids, expected.position_ids
    )


@pytest.mark.parametrize("padding_side", ["left", "right"])
@pytest.mark.parametrize("family", FAMILIES)
@SETTINGS
@given(data=st.data())
def test_layout_arrays_are_the_tensors_and_the_mask_marks_real_tokens(
    family: str, padding_side: str, data: st.DataObject
) -> None:
    rows = data.draw(segment_rows(family, 2))
    options: dict[str, Any] = {"family": family, "padding_side": padding_side, "fill_value": -7}
    position_ids, deltas = segment_layout(rows, **options).arrays()
    tensors = mrope_positions_from_segments(rows, **options)
    assert isinstance(position_ids, np.ndarray) and position_ids.dtype == deltas.dtype == np.int64
    assert torch.equal(torch.from_numpy(position_ids), tensors.position_ids)
    assert torch.equal(torch.from_numpy(deltas), tensors.mrope_position_deltas)
    mask = tensors.attention_mask
    assert mask.dtype == torch.bool and mask.shape == position_ids.shape[1:]
    assert bool((tensors.position_ids[:, ~mask] == -7).all())
    real = mask.sum(dim=1)
    ends = mask.flip(1) if padding_side == "left" else mask
    assert all(bool(ends[row, : int(count)].all()) for row, count in enumerate(real))


ISSUE_15_ROWS: list[list[dict[str, Any]]] = [[{"text": 12}, {"image": [1, 8, 8]}, {"text": 20}]]


def test_small_layout_is_written_from_block_patterns_equal_to_the_lines() -> None:
    """The issue-15 request takes the pattern expansion, which gives what the lines give, for any fill value."""
    layout = segment_layout([*ISSUE_15_ROWS, [{"text": 3}]], family="qwen2_5_vl", fill_value=-5)
    calls: list[int] = []
    expand = _blocks._expand_blocks
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_blocks, "_expand_blocks", lambda *args: calls.append(1) or expand(*args))
        position_ids, _ = layout.arrays()
        patch.setattr(_blocks, "PATTERN_EXPANSION_BLOCKS", 0)
        from_lines, _ = layout.arrays()
    assert calls == [1]
    assert np.array_equal(position_ids, from_lines)
    assert (position_ids[:, 1, 3:] == -5).all()


@pytest.mark.parametrize("grid", [[1, 8, 8], [2, 4, 6], [1, 2, 10]])
def test_block_patterns_stay_read_only_and_answers_fresh(grid: list[int]) -> None:
    """An answer written in place leaves the cached patterns, and so the next answer, unchanged."""
    rows = [[{"text": 2}, {"image": grid}, {"text": 1}]]
    first, _ = segment_layout(rows, family="qwen2_vl").arrays()
    expected = first.copy()
    first += 1000
    again, _ = segment_layout(rows, family="qwen2_vl").arrays()
    assert np.array_equal(again, expected)
    frames, rows_per_frame, columns = grid[0], grid[1] // 2, grid[2] // 2
    pattern = _blocks._block_pattern(_blocks.IMAGE_TOKEN, frames, rows_per_frame, columns)
    assert not pattern.flags.writeable
    with pytest.raises(ValueError, match="read-only"):
        pattern += 1


def test_many_blocks_or_frame_times_go_through_the_lines() -> None:
    """Past PATTERN_EXPANSION_BLOCKS blocks, and with Qwen2.5-VL frame times, the lines expand the blocks."""
    many = [
        [segment for _ in range(_blocks.PATTERN_EXPANSION_BLOCKS) for segment in ({"text": 1}, {"image": [1, 2, 2]})]
    ]
    video = [[{"text": 1}, {"video": [2, 4, 4], "second_per_grid_t": 0.5}]]
    for rows in (many, video):
        layout = segment_layout(rows, family="qwen2_5_vl")
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(_blocks, "_expand_blocks", None)  # calling it would fail
            position_ids, _ = layout.arrays()
        assert torch.equal(
            torch.from_numpy(position_ids), mrope_positions_from_segments(rows, family="qwen2_5_vl").position_ids
        )
