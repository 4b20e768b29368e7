"""MiniCPM-V 4.7 canvas M-RoPE: parity with transformers 5.24 ``MiniCPMV4_7Model.get_rope_index`` on randomized
batches (images with and without slice grids, video frames grouped by markers or split by text, padding, both
downsample modes)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from positions_oracle import MINICPM_MARKERS, hf_minicpmv, padded_with_holes

from ropeserve.errors import InvalidInput
from ropeserve.positions.minicpm_v import MiniCpmMarkers, minicpmv_positions

MARKERS = MiniCpmMarkers(**MINICPM_MARKERS)
TEXT, CONTENT = 7, 8


@st.composite
def frames(draw: st.DrawFn, modality: int, merge: int, sizes: dict[int, list]) -> tuple[list[int], list[int]]:
    """One frame: <image> thumbnail </image>, optionally a grid of <slice> crops </slice> with newlines."""

    def crop() -> tuple[list[int], list[int]]:
        h, w = draw(st.integers(1, 4)), draw(st.integers(1, 4))
        sizes[modality].append([h * merge + draw(st.integers(0, merge - 1)), w * merge])
        return [CONTENT] * (h * w), [modality] * (h * w)

    ids, kinds = crop()
    ids, kinds = [MARKERS.image_start, *ids, MARKERS.image_end], [0, *kinds, 0]
    if draw(st.booleans()):
        rows, columns = draw(st.integers(1, 3)), draw(st.integers(1, 3))
        for r in range(rows):
            for _ in range(columns):
                slice_ids, slice_kinds = crop()
                ids += [MARKERS.slice_start, *slice_ids, MARKERS.slice_end]
                kinds += [0, *slice_kinds, 0]
            if r < rows - 1 or draw(st.booleans()):
                ids.append(MARKERS.newline)
                kinds.append(0)
    return ids, kinds


@st.composite
def cases(draw: st.DrawFn) -> dict[str, Any]:
    mode = draw(st.sampled_from(["16x", "4x"]))
    merge = 4 if mode == "16x" else 2
    sizes: dict[int, list] = {1: [], 2: []}
    id_rows, kind_rows = [], []
    for _ in range(draw(st.integers(1, 3))):
        ids = [TEXT] * draw(st.integers(0, 3))
        kinds = [0] * len(ids)
        for _ in range(draw(st.integers(0, 3))):
            modality = draw(st.sampled_from([1, 2]))
            for frame in range(draw(st.integers(1, 3)) if modality == 2 else 1):
                if frame and draw(st.booleans()):  # a timestamp between two frames of a clip
                    gap = draw(st.integers(1, 3))
                    ids, kinds = ids + [TEXT] * gap, kinds + [0] * gap
                frame_ids, frame_kinds = draw(frames(modality, merge, sizes))
                ids, kinds = ids + frame_ids, kinds + frame_kinds
            gap = draw(st.integers(1, 3))
            ids, kinds = ids + [TEXT] * gap, kinds + [0] * gap
        if not ids:
            ids, kinds = [TEXT], [0]
        id_rows.append(ids)
        kind_rows.append(kinds)
    pads = [draw(st.integers(0, 2)) for _ in id_rows]
    left = draw(st.booleans())
    rows = [list(zip(ids, kinds, strict=True)) for ids, kinds in zip(id_rows, kind_rows, strict=True)]
    fillers = [(TEXT, 0), (CONTENT, 1), (CONTENT, 2), (MARKERS.image_start, 0), (MARKERS.slice_start, 0)]
    (ids_t, types_t), mask = padded_with_holes(draw, rows, pads, left, fillers)
    as_tensor = {m: torch.tensor(v) if v else None for m, v in sizes.items()}
    return {"ids": ids_t, "types": types_t, "mask": mask, "sizes": as_tensor, "mode": mode}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases())
def test_minicpmv_matches_transformers(case: dict[str, Any]) -> None:
    expected_ids, expected_deltas = hf_minicpmv(case)
    ours = minicpmv_positions(
        input_ids=case["ids"],
        mm_token_type_ids=case["types"],
        markers=MARKERS,
        target_sizes=case["sizes"][1],
        target_sizes_videos=case["sizes"][2],
        downsample_mode=case["mode"],
        attention_mask=case["mask"],
    )
    assert torch.equal(ours.position_ids, expected_ids)
    assert torch.equal(ours.mrope_position_deltas, expected_deltas)


def test_minicpmv_errors() -> None:
    ids = torch.tensor([[TEXT, MARKERS.image_start, CONTENT, CONTENT, MARKERS.image_end]])
    kinds = torch.tensor([[0, 0, 1, 1, 0]])
    for sizes, mode in (([[4, 4]], "16x"), ([[4, 8]], "2x"), (None, "16x"), ([[2**40, 4]], "16x")):
        with pytest.raises(InvalidInput):
            minicpmv_positions(
                input_ids=ids, mm_token_type_ids=kinds, markers=MARKERS, target_sizes=sizes, downsample_mode=mode
            )
    with pytest.raises(InvalidInput):
        minicpmv_positions(input_ids=ids, mm_token_type_ids=kinds * 3, markers=MARKERS, target_sizes=[[4, 8]])


OPENING_CROPS = [
    ([CONTENT] * 4 + [MARKERS.image_end, TEXT, TEXT], [1] * 4 + [0] * 3, [[8, 8]]),
    (
        [CONTENT] * 4 + [MARKERS.image_end, MARKERS.slice_start, *[CONTENT] * 4, MARKERS.slice_end, TEXT],
        [1] * 4 + [0, 0] + [1] * 4 + [0, 0],
        [[8, 8], [8, 8]],
    ),
    ([CONTENT] * 4, [1] * 4, [[8, 8]]),
]


@pytest.mark.parametrize(("ids", "kinds", "sizes"), OPENING_CROPS)
def test_minicpmv_row_opening_with_a_crop_matches_transformers(ids: list[int], kinds: list[int], sizes: list) -> None:
    """A row whose first token is a crop (no ``<image>`` before it): transformers' frame starts at index -1, so its
    base coat is empty and the halo lands on the row's last token; the slice markers keep their 1-D T."""
    case = {
        "ids": torch.tensor([ids]),
        "types": torch.tensor([kinds]),
        "mask": None,
        "sizes": {1: torch.tensor(sizes), 2: None},
        "mode": "16x",
    }
    expected_ids, expected_deltas = hf_minicpmv(case)
    ours = minicpmv_positions(
        input_ids=case["ids"], mm_token_type_ids=case["types"], markers=MARKERS, target_sizes=case["sizes"][1]
    )
    assert torch.equal(ours.position_ids, expected_ids)
    assert torch.equal(ours.mrope_position_deltas, expected_deltas)
