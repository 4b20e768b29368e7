"""Every transformers 5.24 module with a ``get_rope_index`` that ropeserve reproduces: parity with that module's own
``get_rope_index`` on randomized batches (left/right padding, several images and videos per row), in both input
forms, plus chunked-prefill slices and decode positions built from its deltas, and the family table's defaults
against the module's config class."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from positions_oracle import (
    FAMILIES,
    IMAGE_ID,
    MODULE_MODEL_CLASSES,
    VIDEO_ID,
    hf_get_rope_index,
    hf_model_class,
    render_tokens,
    segment_rows,
)

from ropeserve.positions import (
    get_mrope_family,
    mrope_decode_positions,
    mrope_positions_from_segments,
    mrope_positions_from_tokens,
    mrope_segments_from_tokens,
    slice_prefill_positions,
)

MODULES = tuple(module for module in MODULE_MODEL_CLASSES if module not in FAMILIES)
SETTINGS = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def cases(draw: st.DrawFn, module: str) -> dict[str, Any]:
    merge = draw(st.sampled_from([2, 2, 1]))
    rows = draw(segment_rows(module, merge))
    return {
        "rows": rows,
        "merge": merge,
        "pads": draw(st.lists(st.integers(0, 3), min_size=len(rows), max_size=len(rows))),
        "left": draw(st.booleans()),
    }


@pytest.mark.parametrize("module", MODULES)
@SETTINGS
@given(data=st.data())
def test_module_matches_its_own_get_rope_index(module: str, data: st.DataObject) -> None:
    case = data.draw(cases(module))
    batch = render_tokens(case["rows"], module, case["merge"], pads=case["pads"], left=case["left"])
    expected_ids, expected_deltas = hf_get_rope_index(
        module, input_ids=batch.input_ids, **batch.kwargs(), spatial_merge_size=case["merge"]
    )
    ours = mrope_positions_from_tokens(family=module, **batch.kwargs(), spatial_merge_size=case["merge"])
    assert torch.equal(ours.position_ids, expected_ids)
    assert torch.equal(ours.mrope_position_deltas, expected_deltas)

    from_ids = mrope_positions_from_tokens(
        family=module,
        input_ids=batch.input_ids,
        image_token_id=IMAGE_ID,
        video_token_id=VIDEO_ID,
        **{k: v for k, v in batch.kwargs().items() if k != "mm_token_type_ids"},
        spatial_merge_size=case["merge"],
    )
    assert torch.equal(from_ids.position_ids, expected_ids)

    segments = mrope_positions_from_segments(
        case["rows"], family=module, spatial_merge_size=case["merge"], padding_side="left" if case["left"] else "right"
    )
    real = batch.attention_mask.bool()
    assert torch.equal(segments.position_ids[:, segments.attention_mask], expected_ids[:, real])
    assert torch.equal(segments.mrope_position_deltas, expected_deltas)

    round_trip = mrope_segments_from_tokens(family=module, **batch.kwargs(), spatial_merge_size=case["merge"])
    again = mrope_positions_from_segments(round_trip, family=module, spatial_merge_size=case["merge"])
    assert torch.equal(again.position_ids[:, again.attention_mask], expected_ids[:, real])


@pytest.mark.parametrize("module", MODULES)
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_module_chunked_prefill_and_decode(module: str, data: st.DataObject) -> None:
    case = data.draw(cases(module))
    batch = render_tokens(case["rows"][:1], module, case["merge"])
    expected_ids, expected_deltas = hf_get_rope_index(
        module, input_ids=batch.input_ids, **batch.kwargs(), spatial_merge_size=case["merge"]
    )
    ours = mrope_positions_from_tokens(family=module, **batch.kwargs(), spatial_merge_size=case["merge"])
    length = ours.position_ids.shape[-1]
    start = data.draw(st.integers(0, length))
    end = data.draw(st.integers(start, length))
    assert torch.equal(slice_prefill_positions(ours.position_ids[:, 0], start, end), expected_ids[:, 0, start:end])
    new = data.draw(st.integers(1, 4))
    decode = mrope_decode_positions(ours.mrope_position_deltas, [length], new)
    # transformers' forward with a cache: arange(cache, cache + new) + delta on all three axes
    expected_decode = (torch.arange(length, length + new) + expected_deltas[0, 0]).expand(3, 1, -1)
    assert torch.equal(decode, expected_decode)


@pytest.mark.parametrize("module", [*FAMILIES, *MODULES])
def test_family_defaults_are_the_config_class_defaults(module: str) -> None:
    config = hf_model_class(module).config_class()
    family = get_mrope_family(module)
    assert family.image_token_id == config.image_token_id
    assert family.video_token_id == config.video_token_id
    vision = config.vision_config
    assert family.spatial_merge_size == vision.spatial_merge_size
    assert family.video_temporal_merge_size == getattr(vision, "temporal_merge_size", 1)
