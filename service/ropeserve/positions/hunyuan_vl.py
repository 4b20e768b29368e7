"""HunYuan-VL (XD-RoPE) positions: ``A >= 3`` axes, 1-D except over image grids.

Reproduces transformers 5.24 ``HunYuanVLModel.get_rope_index`` (token form: ``mm_token_type_ids`` + grids). Every
axis starts as the token index among the row's real tokens; over each image's grid (``h' * (w' + 1)`` tokens: each
row of ``w'`` merged patches ends with a newline token), axis ``A - 3`` holds the column (0..w'), axis ``A - 2``
the row and axis ``A - 1`` the image's index in the batch; axes below ``A - 3`` stay 1-D. An image run of
``grid + 2`` tokens has its first and last token outside the grid (its markers). Padded slots hold 0; the delta is the
row's largest position + 1 - its real tokens.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from ropeserve.errors import InvalidInput, check_limit
from ropeserve.positions._common import (
    MAX_ELEMENTS,
    IntsLike,
    as_long_array,
    padded_mask,
    require_int,
    require_padding_side,
    segment_row,
    segment_rows,
)
from ropeserve.positions._patterns import grid_pattern, pattern, place_blocks
from ropeserve.positions.mrope import mask_and_lengths

__all__ = ["HUNYUAN_VL_AXES", "XdRopePositions", "hunyuan_vl_positions", "hunyuan_vl_positions_from_segments"]

HUNYUAN_VL_AXES = 4
"""Axes of the released configs' ``mrope_section`` (``xdrope_section``): 4."""


@dataclass(frozen=True)
class XdRopePositions:
    position_ids: torch.Tensor
    """``[A, B, L]`` int64; padded slots 0."""
    mrope_position_deltas: torch.Tensor
    """``[B, 1]`` int64."""


def _image_runs(compact: np.ndarray, starts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(first [R], length [R])`` of the maximal runs of image tokens (type 1), never crossing a row start."""
    size = compact.size
    is_image = compact == 1
    changes = np.flatnonzero(is_image[1:] != is_image[:-1]) + 1  # a run opens or closes before these tokens
    inner = np.unique(starts[(starts > 0) & (starts < size)])  # (empty rows repeat a start)
    splits = inner[is_image[inner] & is_image[inner - 1]]  # a run on both sides of a row start
    if size and is_image[0]:
        changes = np.concatenate([[0], changes])
    if size and is_image[-1]:
        changes = np.append(changes, size)
    opening = (changes < size) & is_image[np.minimum(changes, size - 1)]  # else it closes the run before it
    first, end = changes[opening], changes[~opening]
    if splits.size:
        first, end = np.sort(np.concatenate([first, splits])), np.sort(np.concatenate([end, splits]))
    return first, end - first


def hunyuan_vl_positions(
    *,
    mm_token_type_ids: IntsLike,
    image_grid_thw: IntsLike | None = None,
    attention_mask: IntsLike | None = None,
    spatial_merge_size: int = 2,
    num_axes: int = HUNYUAN_VL_AXES,
) -> XdRopePositions:
    """Prefill XD-RoPE positions; ``num_axes`` is ``len(mrope_section)`` of the text config (>= 3)."""
    axes = require_int(num_axes, "num_axes", minimum=3)
    if axes > 16:
        raise InvalidInput(f"num_axes {axes} is more than 16", field="num_axes")
    merge = require_int(spatial_merge_size, "spatial_merge_size", minimum=1)
    types = as_long_array(mm_token_type_ids, "mm_token_type_ids", ndim=2)
    rows, width = types.shape
    mask, lengths = mask_and_lengths(attention_mask, types)
    starts = np.cumsum(lengths) - lengths
    index = mask.astype(np.int64)
    np.cumsum(index, axis=1, out=index)
    index -= 1  # 1-D index among the row's real tokens
    if not mask.all():
        np.copyto(index, 0, where=~mask)
    positions = np.empty((axes, rows, width), dtype=np.int64)
    positions[:] = index
    row_max = lengths - 1  # axes below A - 3 keep every token's 1-D index
    if image_grid_thw is not None:
        image_row, image_max = _place_images(
            positions.reshape(axes, -1), types, mask, starts, _grids(image_grid_thw), merge
        )
        np.maximum.at(row_max, image_row, image_max)
    if axes == 3:  # no 1-D axis left over image tokens: take the maximum the long way
        row_max = positions.max(axis=(0, 2)) if positions.size else row_max
    deltas = np.zeros((rows, 1), dtype=np.int64)
    filled = lengths > 0
    deltas[filled, 0] = row_max[filled] + 1 - lengths[filled]
    return XdRopePositions(torch.from_numpy(positions), torch.from_numpy(deltas))


def _grids(image_grid_thw: IntsLike) -> np.ndarray:
    grids = as_long_array(image_grid_thw, "image_grid_thw", ndim=2)
    if grids.shape[1] != 3 or (grids.size and (int(grids.min()) < 1 or int(grids.max()) > MAX_ELEMENTS)):
        raise InvalidInput("image_grid_thw must be [N, 3] with sizes in [1, 2**27]", field="image_grid_thw")
    return grids


def _xd_pattern(rows: int, columns: int) -> np.ndarray:
    """``[3, rows*columns]`` read-only (column, row, 0) of a grid's tokens, row-major."""
    return pattern(("xdrope", rows, columns), lambda: grid_pattern(1, rows, columns)[::-1].copy())


def _place_images(
    values: np.ndarray, types: np.ndarray, mask: np.ndarray, starts: np.ndarray, grids: np.ndarray, merge: int
) -> tuple[np.ndarray, np.ndarray]:
    """Write each image grid's column / row / image index into the last three axes of ``values`` ``[A, B*L]``
    (runs of image tokens found among the real tokens); returns each image's ``(row, largest value written)``."""
    slots = np.flatnonzero(mask.reshape(-1))  # compact index -> slot of the padded batch
    first, length = _image_runs(types[mask], starts)
    if first.size != grids.shape[0]:
        raise InvalidInput(
            f"the tokens hold {first.size} image runs but image_grid_thw has {grids.shape[0]} entries",
            field="image_grid_thw",
        )
    if not first.size:
        return first, first
    h, w = grids[:, 1] // merge, grids[:, 2] // merge + 1  # w counts the newline ending each row
    tokens = h * w
    bad = (length != tokens) & (length != tokens + 2)
    if bad.any():
        image = int(np.flatnonzero(bad)[0])
        row = int(np.searchsorted(starts, first[image], side="right")) - 1
        raise InvalidInput(
            f"row {row}: an image run of {int(length[image])} tokens, but image_grid_thw[{image}] needs "
            f"{int(tokens[image])} (or {int(tokens[image]) + 2} with its markers)",
            field=f"rows[{row}]",
        )
    grid_start = first + (length - tokens) // 2  # compact index of each grid's first token
    slot_start = slots[grid_start]
    dense = slots[grid_start + tokens - 1] + 1 - slot_start == tokens  # no padded slot inside the grid
    image_axis = np.zeros((3, first.size), dtype=np.int64)
    image_axis[2] = np.arange(first.size)
    place_blocks(
        values[values.shape[0] - 3 :],
        slot_start,
        dense,
        list(zip(h.tolist(), w.tolist(), strict=True)),
        lambda shape: _xd_pattern(*shape),
        image_axis,
        lambda image: slots[grid_start[image] : grid_start[image] + tokens[image]],
    )
    image_row = np.searchsorted(starts, first, side="right") - 1
    return image_row, np.maximum(np.maximum(w - 1, h - 1), np.arange(first.size))


def _segment_tokens(segment: object, field: str, merge: int) -> tuple[int, int, list[int] | None]:
    """``(token type, token count, grid or None)`` of one HunYuan-VL segment."""
    if not isinstance(segment, Mapping) or set(segment) - {"text", "image", "markers"} or len(segment) == 0:
        raise InvalidInput(f"{field} must be {{'text': n}} or {{'image': [t, h, w], 'markers': bool}}", field=field)
    if "text" in segment:
        count = segment["text"]
        if len(segment) != 1 or isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise InvalidInput(f"{field}: text must be an integer >= 0", field=field)
        return 0, count, None
    grid, markers = segment["image"], segment.get("markers", False)
    if (
        isinstance(grid, str | bytes)
        or not isinstance(grid, Sequence)
        or len(grid) != 3
        or not isinstance(markers, bool)
    ):
        raise InvalidInput(f"{field}: image must be [t, h, w] and markers true or false", field=field)
    t, h, w = (require_int(size, field, minimum=1) for size in grid)
    if max(t, h, w) > MAX_ELEMENTS:
        raise InvalidInput(f"{field}: image grid {[t, h, w]} is out of range", field=field)
    return 1, (h // merge) * (w // merge + 1) + 2 * markers, [t, h, w]


def hunyuan_vl_positions_from_segments(
    rows: Sequence[Sequence[Mapping[str, object]]],
    *,
    spatial_merge_size: int = 2,
    num_axes: int = HUNYUAN_VL_AXES,
    padding_side: str = "right",
    max_tokens: int | None = None,
) -> XdRopePositions:
    """Segment form: ``{"text": n}`` and ``{"image": [t, h, w], "markers": bool}`` (``markers``: the image's start
    and end tokens are image tokens too, as the processor emits them); rows pad on ``padding_side``. Images must be
    separated by text (adjacent image runs would be one run to transformers)."""
    merge = require_int(spatial_merge_size, "spatial_merge_size", minimum=1)
    require_padding_side(padding_side)
    rows = segment_rows(rows)
    limit = MAX_ELEMENTS if max_tokens is None else min(max_tokens, MAX_ELEMENTS)
    row_types: list[np.ndarray] = []
    grids: list[list[int]] = []
    total = 0
    for b, segments in enumerate(rows):
        segments = segment_row(segments, b)
        kinds, counts = [], []
        for i, segment in enumerate(segments):
            kind, count, grid = _segment_tokens(segment, f"rows[{b}].segments[{i}]", merge)
            total += count
            check_limit(total, limit, "tokens", field=f"rows[{b}].segments[{i}]")
            kinds.append(kind)
            counts.append(count)
            if grid is not None:
                grids.append(grid)
        row_types.append(np.repeat(np.array(kinds, dtype=np.int64), counts))
    lengths = np.array([row.size for row in row_types], dtype=np.int64)
    width = int(lengths.max(initial=0))
    check_limit(len(row_types) * width, limit, "position slots", field="rows")
    types = np.zeros((len(row_types), width), dtype=np.int64)
    mask = padded_mask(lengths, width, padding_side)
    types[mask] = np.concatenate(row_types) if row_types else np.zeros(0, dtype=np.int64)
    return hunyuan_vl_positions(
        mm_token_type_ids=types,
        image_grid_thw=np.array(grids, dtype=np.int64).reshape(-1, 3) if grids else None,
        attention_mask=mask,
        spatial_merge_size=merge,
        num_axes=num_axes,
    )
