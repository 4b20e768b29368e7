"""HunYuan-VL (XD-RoPE): parity with transformers 5.24 ``HunYuanVLModel.get_rope_index`` on randomized batches
(padding, several images per row with and without their markers, 3 or 4 axes)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from positions_oracle import hf_hunyuan, padded_with_holes

from ropeserve.errors import InvalidInput
from ropeserve.positions.hunyuan_vl import hunyuan_vl_positions, hunyuan_vl_positions_from_segments


@st.composite
def cases(draw: st.DrawFn) -> dict[str, Any]:
    merge = draw(st.sampled_from([2, 1]))
    rows, grids, segment_rows = [], [], []
    for _ in range(draw(st.integers(1, 3))):
        lead = draw(st.integers(0, 4))  # a row may open and close with an image (runs stop at rows)
        row, segments = [0] * lead, [{"text": lead}]
        for _ in range(draw(st.integers(0, 3))):
            h, w = draw(st.integers(1, 4)), draw(st.integers(1, 4))
            markers = draw(st.booleans())
            gap = draw(st.integers(1, 3))
            row += [1] * (h * (w + 1) + 2 * markers) + [0] * gap
            grids.append([1, h * merge, w * merge])
            segments += [{"image": grids[-1], "markers": markers}, {"text": gap}]
        if draw(st.booleans()) and row and row[-2:-1] == [1]:
            row.pop()
            segments[-1]["text"] -= 1
        if not row:
            row, segments = [0], [{"text": 1}]
        rows.append(row)
        segment_rows.append(segments)
    pads = draw(st.lists(st.integers(0, 3), min_size=len(rows), max_size=len(rows)))
    left = draw(st.booleans())
    (types_t,), mask = padded_with_holes(draw, [[(kind,) for kind in row] for row in rows], pads, left, [(0,), (1,)])
    return {
        "types": types_t,
        "mask": mask,
        "grids": torch.tensor(grids) if grids else None,
        "merge": merge,
        "axes": draw(st.sampled_from([3, 4])),
        "segments": segment_rows,
        "left": left,
    }


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases())
def test_hunyuan_vl_matches_transformers(case: dict[str, Any]) -> None:
    expected_ids, expected_deltas = hf_hunyuan(case)
    ours = hunyuan_vl_positions(
        mm_token_type_ids=case["types"],
        image_grid_thw=case["grids"],
        attention_mask=case["mask"],
        spatial_merge_size=case["merge"],
        num_axes=case["axes"],
    )
    assert torch.equal(ours.position_ids, expected_ids)
    assert torch.equal(ours.mrope_position_deltas, expected_deltas)
    segments = hunyuan_vl_positions_from_segments(
        case["segments"],
        spatial_merge_size=case["merge"],
        num_axes=case["axes"],
        padding_side="left" if case["left"] else "right",
    )
    real = case["mask"].bool()
    mine = segments.position_ids[:, torch.from_numpy(np.asarray(segments_mask(case)))]
    assert torch.equal(mine, expected_ids[:, real])
    assert torch.equal(segments.mrope_position_deltas, expected_deltas)


def segments_mask(case: dict[str, Any]) -> Any:
    lengths = [int(row.sum()) for row in case["mask"]]
    width = max(lengths)
    columns = np.arange(width)[None, :]
    lengths_a = np.array(lengths)[:, None]
    return columns >= width - lengths_a if case["left"] else columns < lengths_a


def test_hunyuan_vl_errors() -> None:
    types_t = torch.tensor([[0, 1, 1, 1, 0]])
    with pytest.raises(InvalidInput):
        hunyuan_vl_positions(mm_token_type_ids=types_t, image_grid_thw=[[1, 2, 6]])  # needs 1*(3+1) = 4 or 6
    for grids, axes in (([[1, 2, 2], [1, 2, 2]], 4), ([[1, 2, 2]], 2), ([[1, 2**40, 2]], 4)):
        with pytest.raises(InvalidInput):
            hunyuan_vl_positions(mm_token_type_ids=types_t, image_grid_thw=grids, num_axes=axes)
