"""GLM-Image: parity with transformers 5.24 ``GlmImageModel.get_rope_index`` (prefill positions, zero deltas and
the cached decode positions of generated images), randomized batches with padding and ``images_per_sample``."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from positions_oracle import hf_glm_image, padded_with_holes

from ropeserve.errors import InvalidInput, LimitExceeded
from ropeserve.positions.glm_image import glm_image_positions, glm_image_positions_from_segments

START, END, IMAGE, TEXT = 16384, 16385, 167855, 7


@st.composite
def batches(draw: st.DrawFn) -> dict[str, Any]:
    rows, grids, counts, segment_rows = [], [], [], []
    for _ in range(draw(st.integers(1, 3))):
        lead = draw(st.integers(1, 4))
        tokens, segments = [TEXT] * lead, [{"text": lead}]
        row_grids = []
        for _ in range(draw(st.integers(0, 3))):  # prompt images
            grid = [draw(st.integers(1, 2)), draw(st.integers(1, 5)), draw(st.integers(1, 5))]
            gap = draw(st.integers(0, 3))
            tokens += [START, *[IMAGE] * (grid[0] * grid[1] * grid[2]), END, *[TEXT] * gap]
            segments += [{"image": grid}, {"text": gap}]
            row_grids.append(grid)
        generated = [[1, draw(st.integers(1, 6)), draw(st.integers(1, 6))] for _ in range(draw(st.integers(0, 2)))]
        row_grids += generated
        segments += [{"generate": grid} for grid in generated]
        if draw(st.booleans()):
            tokens.append(START)  # the prompt opens the image to generate (to positions, one more token)
            segments.insert(len(segments) - len(generated), {"text": 1})
        if not generated and draw(st.integers(0, 5)) == 0:  # a marker pair beyond the row's grids: text
            tokens += [START, IMAGE, END, TEXT]
            segments = []
        rows.append(tokens)
        segment_rows.append(segments)
        grids += row_grids
        counts.append(len(row_grids))
    pads = draw(st.lists(st.integers(0, 3), min_size=len(rows), max_size=len(rows)))
    left = draw(st.booleans())
    (ids,), mask = padded_with_holes(
        draw, [[(token,) for token in row] for row in rows], pads, left, [(TEXT,), (START,), (END,), (IMAGE,)]
    )
    shared = draw(st.booleans()) and len(rows) == 1
    return {
        "ids": ids,
        "mask": mask,
        "grids": torch.tensor(grids) if grids else None,
        "per_sample": None if shared or not grids else torch.tensor(counts),
        "segments": segment_rows,
        "left": left,
    }


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=batches())
def test_glm_image_matches_transformers(case: dict[str, Any]) -> None:
    expected_ids, expected_deltas, expected_decode = hf_glm_image(
        case["ids"], case["grids"], case["per_sample"], case["mask"]
    )
    ours = glm_image_positions(
        input_ids=case["ids"],
        image_grid_thw=case["grids"],
        images_per_sample=case["per_sample"],
        attention_mask=case["mask"],
    )
    assert torch.equal(ours.position_ids, expected_ids)
    assert torch.equal(ours.mrope_position_deltas, expected_deltas)
    if expected_decode is None:
        assert ours.decode_position_ids is None
    else:
        assert torch.equal(ours.decode_position_ids, expected_decode)
    if not all(case["segments"]):
        return  # a row the segment form cannot express (a marker pair without a grid)
    segments = glm_image_positions_from_segments(case["segments"], padding_side="left" if case["left"] else "right")
    real = case["mask"].bool()
    lengths = real.sum(dim=1)
    columns = torch.arange(int(lengths.max()))[None, :]
    own = columns >= lengths.max() - lengths[:, None] if case["left"] else columns < lengths[:, None]
    assert torch.equal(segments.position_ids[:, own], expected_ids[:, real])
    if expected_decode is not None:
        assert torch.equal(segments.decode_position_ids, expected_decode)


def test_glm_image_errors() -> None:
    ids = torch.tensor([[TEXT, START, IMAGE, IMAGE, END]])
    with pytest.raises(InvalidInput) as raised:
        glm_image_positions(input_ids=ids, image_grid_thw=[[1, 1, 3]])
    assert raised.value.field == "rows[0]"
    for grids, counts in (([[1, 1, 2]], [2]), ([[0, 1, 2]], None), ([[1, 2**62, 2]], None)):
        with pytest.raises(InvalidInput):
            glm_image_positions(input_ids=ids, image_grid_thw=grids, images_per_sample=counts)


def test_glm_image_counts_whose_sum_wraps_int64_are_invalid_input() -> None:
    """2 * (2**63 - 1) + 3 wraps to the one grid in int64: the rows then read grids that are not there (an
    IndexError, a 500 over HTTP); the counts are summed exactly."""
    ids = [[TEXT, TEXT, TEXT], [START, IMAGE, END], [TEXT, TEXT, TEXT]]
    with pytest.raises(InvalidInput) as raised:
        glm_image_positions(input_ids=ids, image_grid_thw=[[1, 1, 1]], images_per_sample=[2**63 - 1, 2**63 - 1, 3])
    assert raised.value.field == "images_per_sample"


@pytest.mark.parametrize("grid", [[1024, 2**27, 2**27], [2**27, 2**27, 1024]])
def test_glm_image_grid_whose_token_count_wraps_int64_is_invalid_input(grid: list[int]) -> None:
    """t*h*w = 2**64 wraps to 0 in int64: an empty marker pair matched it and the layout failed with a ValueError
    (a 500 over HTTP); the count is compared exactly now."""
    ids = torch.tensor([[TEXT, START, END, TEXT]])
    with pytest.raises(InvalidInput, match="needs 18446744073709551616") as raised:
        glm_image_positions(input_ids=ids, image_grid_thw=[grid])
    assert raised.value.field == "rows[0]"


@pytest.mark.parametrize("hole", [False, True], ids=["consecutive", "padding-between"])
def test_glm_image_image_starting_on_the_previous_end_marker_matches_transformers(hole: bool) -> None:
    """The second ``<image_start>`` is the last token of the first image, so the second image's first token is the
    first ``<image_end>``: its origin is the position after the first image (origin + max(h, w)), not the text
    position after its start marker (which counted the first image's t*h*w tokens). Was off by t*h*w - max(h, w)."""
    row = [TEXT, START, IMAGE, IMAGE, IMAGE, START, *([IMAGE] if hole else []), END, IMAGE, IMAGE, IMAGE, END, TEXT]
    ids = torch.tensor([row])
    mask = torch.ones_like(ids)
    if hole:
        mask[0, 6] = 0  # padding between the second start marker and the first end marker
    grids = torch.tensor([[1, 2, 2], [1, 2, 2]])
    expected, _, expected_decode = hf_glm_image(ids, grids, None, mask)
    ours = glm_image_positions(input_ids=ids, image_grid_thw=grids, attention_mask=mask)
    assert torch.equal(ours.position_ids, expected)
    assert expected_decode is None or torch.equal(ours.decode_position_ids, expected_decode)


def test_decode_positions_count_against_the_limit_before_they_are_built() -> None:
    """A few grid numbers ask for billions of decode positions (4 one-token rows reading a 3000x3000 grid: 4 x 9M,
    864 MB; one 11000x11000 grid: a MemoryError, a 500 over HTTP): rows with grids x the longest row's decode
    positions is checked against ``max_tokens`` first, in both forms, naming what the caller sent."""
    with pytest.raises(LimitExceeded) as raised:
        glm_image_positions(input_ids=[[TEXT]] * 4, image_grid_thw=[[1, 3000, 3000]], max_tokens=10**6)
    assert raised.value.field == "image_grid_thw"
    with pytest.raises(LimitExceeded) as raised:
        glm_image_positions_from_segments([[{"text": 1}, {"generate": [1, 11000, 11000]}]], max_tokens=10**6)
    assert raised.value.field == "rows"
    # at the limit: 2 rows x (3*3 + 4*4 + 1) decode positions
    rows = [[{"text": 1}, {"generate": [1, 3, 3]}, {"generate": [1, 4, 4]}]] * 2
    decode = glm_image_positions_from_segments(rows, max_tokens=52).decode_position_ids
    assert decode is not None and decode.shape == (2, 3, 26)
    with pytest.raises(LimitExceeded):
        glm_image_positions_from_segments(rows, max_tokens=51)
