"""``compat="vllm"`` / ``"sglang"``: parity with ports of the engines' own M-RoPE functions (tests/support/
engine_oracles.py names the engine commits), on randomized batches in both input forms."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from engine_oracles import VISION_START_ID, sglang_get_rope_index, vllm_mrope_input_positions
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from positions_oracle import IMAGE_ID, TEXT_ID, VIDEO_ID, render_tokens, segment_rows

from ropeserve.errors import InvalidInput
from ropeserve.positions import mrope_positions_from_segments, mrope_positions_from_tokens

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
ENGINE_FAMILIES = ("qwen2_vl", "qwen2_5_vl")


def _with_vision_starts(rows: list[list[dict[str, Any]]]) -> list[list[dict[str, Any]]]:
    """Every vision segment preceded by at least one text token (its ``<vision_start>``), as prompts are."""
    out = []
    for segments in rows:
        row: list[dict[str, Any]] = []
        for segment in segments:
            if "text" not in segment and not (row and "text" in row[-1] and row[-1]["text"] > 0):
                row.append({"text": 1})
            row.append(segment)
        out.append(row)
    return out


def _mark_vision_starts(ids: torch.Tensor) -> torch.Tensor:
    """The text token right before each vision run becomes ``<vision_start>``."""
    ids = ids.clone()
    is_vision = (ids == IMAGE_ID) | (ids == VIDEO_ID)
    opens = is_vision[:, 1:] & (ids[:, :-1] == TEXT_ID)
    ids[:, :-1][opens] = VISION_START_ID
    return ids


@st.composite
def engine_cases(draw: st.DrawFn, family: str) -> dict[str, Any]:
    merge = draw(st.sampled_from([2, 2, 1]))
    rows = _with_vision_starts(draw(segment_rows(family, merge)))
    return {
        "rows": rows,
        "merge": merge,
        "tps": draw(st.sampled_from([2, 4, 25, 1.5])),
        "pads": draw(st.lists(st.integers(0, 3), min_size=len(rows), max_size=len(rows))),
        "left": draw(st.booleans()),
    }


def _ours(case: dict[str, Any], family: str, compat: str) -> Any:
    return mrope_positions_from_segments(
        case["rows"], family=family, spatial_merge_size=case["merge"], tokens_per_second=case["tps"], compat=compat
    )


@pytest.mark.parametrize("family", ENGINE_FAMILIES)
@SETTINGS
@given(data=st.data())
def test_vllm_compat_matches_vllm_get_mrope_input_positions(family: str, data: st.DataObject) -> None:
    case = data.draw(engine_cases(family))
    ours = _ours(case, family, "vllm")
    for b, segments in enumerate(case["rows"]):
        single = render_tokens([segments], family, case["merge"])
        tokens = _mark_vision_starts(single.input_ids)[0].tolist()
        videos = [s for s in segments if "video" in s]
        expected, delta = vllm_mrope_input_positions(
            tokens,
            [s["image"] for s in segments if "image" in s],
            [s["video"] for s in videos],
            [float(torch.tensor(s.get("second_per_grid_t", 1.0), dtype=torch.float32)) for s in videos],
            model=family,
            merge=case["merge"],
            tokens_per_second=case["tps"],
            ids=(IMAGE_ID, VIDEO_ID),
        )
        assert torch.equal(ours.position_ids[:, b, ours.attention_mask[b]], expected)
        assert int(ours.mrope_position_deltas[b, 0]) == delta


@pytest.mark.parametrize("family", ENGINE_FAMILIES)
@SETTINGS
@given(data=st.data())
def test_sglang_compat_matches_sglang_get_rope_index(family: str, data: st.DataObject) -> None:
    case = data.draw(engine_cases(family))
    batch = render_tokens(case["rows"], family, case["merge"], pads=case["pads"], left=case["left"])
    ours = mrope_positions_from_tokens(
        family=family,
        **batch.kwargs(),
        spatial_merge_size=case["merge"],
        tokens_per_second=case["tps"],
        compat="sglang",
    )
    segments_form = _ours(case, family, "sglang")
    for b in range(len(case["rows"])):
        row_ids = _mark_vision_starts(batch.input_ids[b : b + 1, batch.attention_mask[b].bool()])
        first_image = sum(1 for r in case["rows"][:b] for s in r if "image" in s)
        first_video = sum(1 for r in case["rows"][:b] for s in r if "video" in s)
        expected, deltas = sglang_get_rope_index(
            row_ids,
            None if batch.image_grid_thw is None else batch.image_grid_thw[first_image:],
            None if batch.video_grid_thw is None else batch.video_grid_thw[first_video:],
            None if batch.second_per_grid_ts is None else batch.second_per_grid_ts[first_video:],
            model_type=family,
            merge=case["merge"],
            tokens_per_second=case["tps"],
            ids=(IMAGE_ID, VIDEO_ID),
        )
        real = batch.attention_mask[b].bool()
        assert torch.equal(ours.position_ids[:, b, real], expected[:, 0])
        assert torch.equal(segments_form.position_ids[:, b, segments_form.attention_mask[b]], expected[:, 0])
        assert int(ours.mrope_position_deltas[b, 0]) == int(deltas[0, 0])


@pytest.mark.parametrize("family", ENGINE_FAMILIES)
@settings(max_examples=20, deadline=None)
@given(data=st.data())
def test_sglang_port_over_whole_batch_equals_row_by_row(family: str, data: st.DataObject) -> None:
    """Guards the port: grids are consumed globally over the batch, as SGLang does."""
    case = data.draw(engine_cases(family))
    batch = render_tokens(case["rows"], family, case["merge"])
    if not bool(batch.attention_mask.all()):
        return  # SGLang's get_rope_index takes no mask: only equal-length rows form one call
    ids = _mark_vision_starts(batch.input_ids)
    expected, deltas = sglang_get_rope_index(
        ids,
        batch.image_grid_thw,
        batch.video_grid_thw,
        batch.second_per_grid_ts,
        model_type=family,
        merge=case["merge"],
        tokens_per_second=case["tps"],
        ids=(IMAGE_ID, VIDEO_ID),
    )
    ours = _ours(case, family, "sglang")
    assert torch.equal(ours.position_ids, expected)
    assert torch.equal(ours.mrope_position_deltas, deltas)


def test_issue_example_vllm_timing_differs_from_transformers_at_frames_6_12_24_26() -> None:
    rows = [[{"text": 1}, {"video": [30, 2, 2], "second_per_grid_t": 0.7}]]
    kwargs: dict[str, Any] = {"family": "qwen2_5_vl", "spatial_merge_size": 2, "tokens_per_second": 25}
    frames_t5 = mrope_positions_from_segments(rows, compat="transformers5", **kwargs).position_ids[0, 0, 1:]
    for compat in ("vllm", "sglang"):
        frames_engine = mrope_positions_from_segments(rows, compat=compat, **kwargs).position_ids[0, 0, 1:]
        differing = (frames_t5 != frames_engine).nonzero().flatten().tolist()
        assert differing == [6, 12, 24, 26]  # one token per frame (1x1 merged grid)
        assert torch.equal(frames_t5 - frames_engine, (frames_t5 != frames_engine).long())


def test_engines_keep_an_image_with_several_frames_at_its_start_time() -> None:
    rows = [[{"text": 1}, {"image": [3, 2, 2]}, {"text": 2}]]
    kwargs: dict[str, Any] = {"family": "qwen2_5_vl", "spatial_merge_size": 2, "tokens_per_second": 2}
    transformers = mrope_positions_from_segments(rows, compat="transformers4", **kwargs).position_ids[0, 0]
    engine = mrope_positions_from_segments(rows, compat="vllm", **kwargs).position_ids[0, 0]
    assert transformers.tolist() == [0, 1, 2, 3, 4, 5]
    assert engine.tolist() == [0, 1, 1, 1, 2, 3]


@pytest.mark.parametrize("compat", ["transformers5", "transformers4", "vllm", "sglang"])
@pytest.mark.parametrize(
    ("tps", "seconds", "culprit"),
    [
        (1e308, 1.0, "tokens_per_second"),
        (3e38, 1e10, "tokens_per_second"),
        (2.0, 1e30, "second_per_grid_t"),
        (1e308, 0.0, "tokens_per_second"),
        (1e6, 1e13, "second_per_grid_t"),
    ],
)
def test_overflowing_video_time_is_invalid_input_not_a_wrapped_number(
    compat: str, tps: float, seconds: float, culprit: str
) -> None:
    """A float32 time of inf / NaN / beyond 2**53 used to come back as a wrapped int64 position; the problem names
    the value that made it overflow."""
    rows = [[{"text": 1}, {"video": [3, 2, 2], "second_per_grid_t": seconds}]]
    with pytest.raises(InvalidInput) as raised:
        mrope_positions_from_segments(rows, family="qwen2_5_vl", tokens_per_second=tps, compat=compat)
    assert raised.value.field == culprit
    with pytest.raises(InvalidInput):
        mrope_positions_from_tokens(
            family="qwen2_5_vl",
            mm_token_type_ids=[[0] + [2] * 3],
            video_grid_thw=[[3, 2, 2]],
            second_per_grid_ts=[seconds],
            tokens_per_second=tps,
            compat=compat,
        )
