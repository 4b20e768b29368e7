"""Randomized parity of the M-RoPE position engine with transformers 5.24 ``get_rope_index`` (compat
transformers5) and with an independent per-token reference (both compat rules)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from positions_oracle import (
    FAMILIES,
    hf_get_rope_index,
    reference_row,
    render_tokens,
    segment_rows,
)

from ropeserve.positions import (
    mrope_positions_from_segments,
    mrope_positions_from_tokens,
    mrope_segments_from_tokens,
)

SETTINGS = settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def batches(draw: st.DrawFn, family: str) -> dict[str, Any]:
    merge = draw(st.sampled_from([2, 2, 1, 3]))
    rows = draw(segment_rows(family, merge))
    return {
        "rows": rows,
        "merge": merge,
        "pads": draw(st.lists(st.integers(0, 3), min_size=len(rows), max_size=len(rows))),
        "left": draw(st.booleans()),
        "right_padding": draw(st.booleans()),
        "tps": draw(st.sampled_from([2, 2, 4, 1.5, 25])),
        "with_seconds": draw(st.booleans()) or family != "qwen2_5_vl",
    }


def _render(case: dict[str, Any], family: str):
    return render_tokens(
        case["rows"],
        family,
        case["merge"],
        pads=case["pads"],
        left=not case["right_padding"],
        with_seconds=case["with_seconds"],
    )


def _drop_seconds(rows: list[list[dict[str, Any]]]) -> list[list[dict[str, Any]]]:
    return [[{k: v for k, v in s.items() if k != "second_per_grid_t"} for s in row] for row in rows]


@pytest.mark.parametrize("family", FAMILIES)
@SETTINGS
@given(data=st.data())
def test_token_form_matches_transformers(family: str, data: st.DataObject) -> None:
    case = data.draw(batches(family))
    batch = _render(case, family)
    expected_ids, expected_deltas = hf_get_rope_index(
        family,
        input_ids=batch.input_ids,
        **batch.kwargs(),
        spatial_merge_size=case["merge"],
        tokens_per_second=case["tps"],
    )
    ours = mrope_positions_from_tokens(
        family=family,
        **batch.kwargs(),
        spatial_merge_size=case["merge"],
        tokens_per_second=case["tps"],
        compat="transformers5",
    )
    assert torch.equal(ours.position_ids, expected_ids)
    assert torch.equal(ours.mrope_position_deltas, expected_deltas)
    assert torch.equal(ours.attention_mask, batch.attention_mask.bool())

    from_ids = mrope_positions_from_tokens(
        family=family,
        input_ids=batch.input_ids,
        image_token_id=151655,
        video_token_id=151656,
        **{k: v for k, v in batch.kwargs().items() if k != "mm_token_type_ids"},
        spatial_merge_size=case["merge"],
        tokens_per_second=case["tps"],
    )
    assert torch.equal(from_ids.position_ids, expected_ids)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("compat", ["transformers5", "transformers4"])
@SETTINGS
@given(data=st.data())
def test_segment_form_matches_reference_and_token_form(family: str, compat: str, data: st.DataObject) -> None:
    case = data.draw(batches(family))
    rows = case["rows"] if case["with_seconds"] else _drop_seconds(case["rows"])
    ours = mrope_positions_from_segments(
        rows,
        family=family,
        spatial_merge_size=case["merge"],
        tokens_per_second=case["tps"],
        compat=compat,
        padding_side="left" if case["left"] else "right",
        fill_value=-7,
    )
    for b, segments in enumerate(rows):
        axes, delta = reference_row(segments, family, case["merge"], case["tps"], compat)
        row_mask = ours.attention_mask[b]
        assert ours.position_ids[:, b, row_mask].tolist() == axes
        assert (ours.position_ids[:, b, ~row_mask] == -7).all()
        assert int(ours.mrope_position_deltas[b, 0]) == delta

    batch = _render(case, family)
    tokens = mrope_positions_from_tokens(
        family=family,
        **batch.kwargs(),
        spatial_merge_size=case["merge"],
        tokens_per_second=case["tps"],
        compat=compat,
    )
    assert torch.equal(tokens.position_ids[:, tokens.attention_mask], ours.position_ids[:, ours.attention_mask])
    assert torch.equal(tokens.mrope_position_deltas, ours.mrope_position_deltas)

    round_trip = mrope_segments_from_tokens(family=family, **batch.kwargs(), spatial_merge_size=case["merge"])
    again = mrope_positions_from_segments(
        round_trip,
        family=family,
        spatial_merge_size=case["merge"],
        tokens_per_second=case["tps"],
        compat=compat,
        padding_side="left",
    )
    assert torch.equal(again.position_ids[:, again.attention_mask], ours.position_ids[:, ours.attention_mask])


@pytest.mark.parametrize("family", FAMILIES)
@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_reference_agrees_with_transformers(family: str, data: st.DataObject) -> None:
    """Guards the reference itself: under transformers5 it must reproduce the oracle row by row."""
    case = data.draw(batches(family))
    batch = render_tokens(case["rows"], family, case["merge"], with_seconds=True)
    expected_ids, expected_deltas = hf_get_rope_index(
        family,
        input_ids=batch.input_ids,
        **batch.kwargs(),
        spatial_merge_size=case["merge"],
        tokens_per_second=case["tps"],
    )
    for b, segments in enumerate(case["rows"]):
        axes, delta = reference_row(segments, family, case["merge"], case["tps"], "transformers5")
        mask = batch.attention_mask[b].bool()
        assert expected_ids[:, b, mask].tolist() == axes
        assert int(expected_deltas[b, 0]) == delta


def test_text_only_batch_without_grids_matches_transformers() -> None:
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    types = torch.zeros_like(mask)
    for family in FAMILIES:
        expected_ids, expected_deltas = hf_get_rope_index(
            family,
            input_ids=torch.full_like(mask, 5),
            mm_token_type_ids=types,
            image_grid_thw=None,
            video_grid_thw=None,
            attention_mask=mask,
        )
        ours = mrope_positions_from_tokens(family=family, mm_token_type_ids=types, attention_mask=mask)
        assert torch.equal(ours.position_ids, expected_ids)
        assert torch.equal(ours.mrope_position_deltas, expected_deltas)
