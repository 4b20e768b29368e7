"""Qwen2.5-Omni: parity with transformers 5.24 ``get_rope_index`` (audio, images, videos, audio interleaved with its
video by time chunks), in both input forms, with left/right padding; and its input errors."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from omni_oracle import (
    TEXT_ID,
    OmniBatch,
    as_segments,
    audio_tokens,
    audio_tokens_qwen3,
    hf_omni_get_rope_index,
    hf_qwen3_omni_get_rope_index,
    omni_rows,
    render_omni,
)

from ropeserve.errors import InvalidInput, LimitExceeded
from ropeserve.positions.omni import omni_audio_tokens, omni_positions_from_segments, omni_positions_from_tokens

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def cases(draw: st.DrawFn) -> dict[str, Any]:
    merge = draw(st.sampled_from([2, 2, 1]))
    use_audio_in_video = draw(st.booleans())
    rows = draw(omni_rows(merge, use_audio_in_video))
    return {
        "rows": rows,
        "merge": merge,
        "use_audio_in_video": use_audio_in_video,
        "pps": draw(st.sampled_from([25, 25, 13, 2])),
        "seconds_per_chunk": draw(st.sampled_from([2, 2, 1, 3])),
        "pads": draw(st.lists(st.integers(0, 3), min_size=len(rows), max_size=len(rows))),
        "left": draw(st.booleans()),
    }


@SETTINGS
@given(case=cases())
def test_omni_matches_transformers_get_rope_index(case: dict[str, Any]) -> None:
    batch = render_omni(
        case["rows"], case["merge"], use_audio_in_video=case["use_audio_in_video"], pads=case["pads"], left=case["left"]
    )
    options = {"pps": case["pps"], "seconds_per_chunk": case["seconds_per_chunk"]}
    expected_ids, expected_deltas = hf_omni_get_rope_index(batch, merge=case["merge"], **options)
    ours = omni_positions_from_tokens(
        input_ids=batch.input_ids,
        image_grid_thw=batch.image_grid_thw,
        video_grid_thw=batch.video_grid_thw,
        second_per_grid_ts=batch.second_per_grid_ts,
        audio_seqlens=batch.audio_seqlens,
        attention_mask=batch.attention_mask,
        use_audio_in_video=case["use_audio_in_video"],
        spatial_merge_size=case["merge"],
        position_id_per_seconds=case["pps"],
        seconds_per_chunk=case["seconds_per_chunk"],
    )
    assert torch.equal(ours.position_ids, expected_ids)
    assert torch.equal(ours.mrope_position_deltas, expected_deltas)

    segments = omni_positions_from_segments(
        as_segments(case["rows"], case["merge"]),
        spatial_merge_size=case["merge"],
        position_id_per_seconds=case["pps"],
        seconds_per_chunk=case["seconds_per_chunk"],
        padding_side="left" if case["left"] else "right",
    )
    real = batch.attention_mask.bool()
    assert torch.equal(segments.position_ids[:, segments.attention_mask], expected_ids[:, real])
    assert torch.equal(segments.mrope_position_deltas, expected_deltas)


def test_audio_in_video_interleaves_two_second_chunks() -> None:
    """A 4-frame video at 1 s per grid (T 0, 25, 50, 75) with 60 audio tokens: chunks of 50 positions give video
    frames 0-1, audio 0-49, video frames 2-3, audio 50-59."""
    rows = [[{"text": 2}, {"video": [4, 2, 2], "second_per_grid_t": 1.0, "audio": 60}, {"text": 1}]]
    ids = omni_positions_from_segments(rows).position_ids[0, 0]
    body = ids[4:-3].tolist()
    assert ids[:4].tolist() == [0, 1, 2, 2]  # text, then both opening markers at one position
    assert body[:2] == [3, 28] and body[2:52] == list(range(3, 53)) and body[52:54] == [53, 78]
    assert body[54:] == list(range(53, 63))
    assert ids[-3:].tolist() == [63, 63, 64]  # closing markers after the last (audio) chunk, then text


def test_audio_token_formula() -> None:
    assert [omni_audio_tokens(n) for n in (3, 5, 7, 11, 101)] == [1, 1, 2, 3, 25]


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"rows": [[{"audio": 0}]]}, "rows[0].segments[0]"),
        ({"rows": [[{"video": [1, 2, 2], "second_per_grid_t": float("nan")}]]}, "rows[0].segments[0]"),
        ({"rows": [[{"video": [1, 2, 2], "second_per_grid_t": 1e308}]]}, None),
        ({"rows": [[{"image": [2**63, 2, 2]}]]}, "rows[0].segments[0]"),
        ({"rows": [[{"image": [1, 3, 2]}]]}, "rows[0].segments[0]"),
        ({"rows": [[{"text": 1}]], "position_id_per_seconds": float("inf")}, "position_id_per_seconds"),
        ({"rows": [[{"text": 1}]], "seconds_per_chunk": 0}, "seconds_per_chunk"),
        ({"rows": [[{"text": 1}]], "seconds_per_chunk": -1}, "seconds_per_chunk"),
        ({"rows": [[{"text": 1}]], "family": "qwen9_omni"}, "family"),
    ],
)
def test_omni_bad_input_is_invalid_input(kwargs: dict[str, Any], field: str | None) -> None:
    rows = kwargs.pop("rows")
    with pytest.raises(InvalidInput) as raised:
        omni_positions_from_segments(rows, **kwargs)
    if field is not None:
        assert raised.value.field == field


def test_omni_token_form_errors_name_the_row() -> None:
    ids = torch.tensor([[100, 151652, 151655, 151655, 151653]])
    with pytest.raises(InvalidInput) as raised:
        omni_positions_from_tokens(input_ids=ids, image_grid_thw=[[1, 2, 2]])
    assert raised.value.field == "rows[0].segments[1]"
    with pytest.raises(InvalidInput) as raised:
        omni_positions_from_tokens(input_ids=ids, image_grid_thw=[[1, 2, 4], [1, 2, 2]])
    assert raised.value.field == "image_grid_thw"
    with pytest.raises(InvalidInput):
        omni_positions_from_tokens(input_ids=ids, image_grid_thw=[[1, 2, 4]], audio_seqlens=[10**30])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases())
def test_qwen3_omni_matches_transformers_get_rope_index(case: dict[str, Any]) -> None:
    """Float32 positions: fractional video times, blocks after fractional maxima, audio merged by position."""
    batch = render_omni(
        case["rows"],
        case["merge"],
        use_audio_in_video=case["use_audio_in_video"],
        pads=case["pads"],
        left=case["left"],
        tokens_of=audio_tokens_qwen3,
    )
    expected_ids, expected_deltas = hf_qwen3_omni_get_rope_index(batch, merge=case["merge"], pps=case["pps"])
    ours = omni_positions_from_tokens(
        family="qwen3_omni_moe",
        input_ids=batch.input_ids,
        image_grid_thw=batch.image_grid_thw,
        video_grid_thw=batch.video_grid_thw,
        second_per_grid_ts=batch.second_per_grid_ts,
        audio_seqlens=batch.audio_seqlens,
        attention_mask=batch.attention_mask,
        use_audio_in_video=case["use_audio_in_video"],
        spatial_merge_size=case["merge"],
        position_id_per_seconds=case["pps"],
    )
    assert ours.position_ids.dtype == expected_ids.dtype == torch.float32
    assert torch.equal(ours.position_ids, expected_ids)
    assert torch.equal(ours.mrope_position_deltas, expected_deltas)
    segments = omni_positions_from_segments(
        as_segments(case["rows"], case["merge"], audio_tokens_qwen3),
        family="qwen3_omni_moe",
        spatial_merge_size=case["merge"],
        position_id_per_seconds=case["pps"],
        padding_side="left" if case["left"] else "right",
    )
    real = batch.attention_mask.bool()
    assert torch.equal(segments.position_ids[:, segments.attention_mask], expected_ids[:, real])


@pytest.mark.parametrize("family", ["qwen2_5_omni", "qwen3_omni_moe"])
def test_batch_without_grids_takes_transformers_text_branch(family: str) -> None:
    """No image or video grid: transformers numbers real tokens 0.., puts 1 in padded slots and counts them in the
    row maximum (a one-token row gets delta 1)."""
    qwen3 = family == "qwen3_omni_moe"
    rows = [[{"text": 1}, {"audio_seqlen": 9}, {"text": 1}], [{"text": 1}]]
    tokens_of = audio_tokens_qwen3 if qwen3 else audio_tokens
    batch = render_omni(rows, 2, use_audio_in_video=False, pads=[0, 0], left=True, tokens_of=tokens_of)
    if qwen3:
        expected_ids, expected_deltas = hf_qwen3_omni_get_rope_index(batch, merge=2, pps=25)
    else:
        expected_ids, expected_deltas = hf_omni_get_rope_index(batch, merge=2, pps=25, seconds_per_chunk=2)
    ours = omni_positions_from_tokens(
        family=family, input_ids=batch.input_ids, audio_seqlens=batch.audio_seqlens, attention_mask=batch.attention_mask
    )
    assert torch.equal(ours.position_ids, expected_ids)
    assert torch.equal(ours.mrope_position_deltas, expected_deltas)
    assert int(ours.mrope_position_deltas[1, 0]) == 1


def _with_padding_inside(batch: OmniBatch, columns: list[int]) -> OmniBatch:
    """``batch`` with a padding slot (id TEXT_ID, mask 0) inserted before each of ``columns`` (taken modulo the width):
    rows whose real tokens are no longer one run of slots."""
    ids, mask = batch.input_ids, batch.attention_mask
    for column in columns:
        at = column % (ids.shape[1] + 1)
        ids = torch.cat([ids[:, :at], torch.full((ids.shape[0], 1), TEXT_ID), ids[:, at:]], dim=1)
        mask = torch.cat([mask[:, :at], torch.zeros((mask.shape[0], 1), dtype=mask.dtype), mask[:, at:]], dim=1)
    return dataclasses.replace(batch, input_ids=ids, attention_mask=mask)


@pytest.mark.parametrize("family", ["qwen2_5_omni", "qwen3_omni_moe"])
@SETTINGS
@given(
    case=cases(),
    pps=st.sampled_from([2**20 + 3, 2**24 + 1]),
    columns=st.lists(st.integers(0, 10**4), min_size=1, max_size=3),
)
def test_omni_matches_transformers_with_padding_inside_rows_and_large_frame_times(
    family: str, case: dict[str, Any], pps: int, columns: list[int]
) -> None:
    """Padding slots inside rows (each row written apart, then scattered to its real slots) and frame times past
    2**24, where float32 rounds: Qwen2.5-Omni's image times exact in int64 and its video times truncated from
    float32, Qwen3-Omni's float32 positions (each operation in transformers' dtype and order)."""
    qwen3 = family == "qwen3_omni_moe"
    layout = {key: case[key] for key in ("use_audio_in_video", "pads", "left")}
    batch = render_omni(case["rows"], case["merge"], tokens_of=audio_tokens_qwen3 if qwen3 else audio_tokens, **layout)
    batch = _with_padding_inside(batch, columns)
    if qwen3:
        expected_ids, expected_deltas = hf_qwen3_omni_get_rope_index(batch, merge=case["merge"], pps=pps)
    else:
        expected_ids, expected_deltas = hf_omni_get_rope_index(batch, merge=case["merge"], pps=pps, seconds_per_chunk=2)
    # a rendered batch's fields are the token form's arguments
    ours = omni_positions_from_tokens(
        **vars(batch), family=family, spatial_merge_size=case["merge"], position_id_per_seconds=pps
    )
    assert ours.position_ids.dtype == expected_ids.dtype
    assert torch.equal(ours.position_ids, expected_ids)
    assert torch.equal(ours.mrope_position_deltas, expected_deltas)


def test_image_frame_times_stay_exact_past_float32_integers() -> None:
    """transformers keeps an image's frame times ``k * position_id_per_seconds`` in int64 (``torch.Tensor`` of an int64
    tensor is that tensor): at 2**24 + 1 positions per second frame 1 sits 16777217 after the image's start. They were
    rounded through float32 here (16777216 after it), in both input forms."""
    pps = 2**24 + 1
    rows = [[{"text": 2}, {"image": [2, 2, 2]}, {"text": 2}]]
    batch = render_omni(rows, 2, use_audio_in_video=False, pads=[0], left=True)
    expected_ids, expected_deltas = hf_omni_get_rope_index(batch, merge=2, pps=pps, seconds_per_chunk=2)
    ours = omni_positions_from_tokens(
        input_ids=batch.input_ids, image_grid_thw=batch.image_grid_thw, position_id_per_seconds=pps
    )
    segments = omni_positions_from_segments(as_segments(rows, 2), position_id_per_seconds=pps)
    assert ours.position_ids[0, 0, 3] == 2 + pps  # frame 1 of the image starting at position 2
    for result in (ours, segments):
        assert torch.equal(result.position_ids, expected_ids)
        assert torch.equal(result.mrope_position_deltas, expected_deltas)


@pytest.mark.parametrize("family", ["qwen2_5_omni", "qwen3_omni_moe"])
def test_a_video_past_the_token_limit_is_refused_before_its_frames_are_timed(family: str) -> None:
    """A video of 2**40 frames: Qwen3-Omni computed every frame's time before counting the video's tokens (an 8 TiB
    allocation: a RuntimeError, a 500 over HTTP; a frame count just small enough to allocate ran the machine out of
    memory). It is refused as over the row's token limit first, as Qwen2.5-Omni refuses it."""
    rows = [[{"text": 1}, {"video": [2**40, 2, 2], "second_per_grid_t": 0.5}, {"text": 1}]]
    with pytest.raises(LimitExceeded) as raised:
        omni_positions_from_segments(rows, family=family, max_tokens=10_000)
    assert raised.value.field == "rows[0].segments[1]"


@pytest.mark.parametrize("family", ["qwen2_5_omni", "qwen3_omni_moe"])
def test_rows_without_tokens_answer_empty_positions_and_delta_zero(family: str) -> None:
    """transformers raises on a batch of width 0 (the maximum of no positions); ropeserve answers as its block
    engine does for every other family (this was an IndexError, a 500 over HTTP)."""
    result = omni_positions_from_tokens(input_ids=[[], []], family=family)
    assert result.position_ids.shape == (3, 2, 0)
    assert result.mrope_position_deltas.tolist() == [[0], [0]]


@pytest.mark.parametrize("family", ["qwen2_5_omni", "qwen3_omni_moe"])
def test_an_all_padded_row_equals_transformers(family: str) -> None:
    batch = OmniBatch(torch.tensor([[5, 5], [5, 5]]), torch.tensor([[0, 0], [1, 1]]), None, None, None, None, False)
    if family == "qwen2_5_omni":
        expected, deltas = hf_omni_get_rope_index(batch, merge=2, pps=25, seconds_per_chunk=2)
    else:
        expected, deltas = hf_qwen3_omni_get_rope_index(batch, merge=2, pps=25)
    result = omni_positions_from_tokens(input_ids=batch.input_ids, attention_mask=batch.attention_mask, family=family)
    assert torch.equal(result.position_ids, expected)
    assert torch.equal(result.mrope_position_deltas, deltas)
