"""HunYuan-VL (XD-RoPE) positions: ``A >= 3`` axes, 1-D except over image grids.

Reproduces transformers 5.24 ``HunYuanVLModel.get_rope_index`` (token form: ``mm_token_type_ids`` + grids). Every
axis starts as the token index among the row's real tokens; over each image's grid (``h' * (w' + 1)`` tokens: each
row of ``w'`` merged patches ends with a newline token), axis ``A - 3`` holds the column (0..w'), axis ``A - 2``
the row and axis ``A - 1`` the image's index in the batch; axes below ``A - 3`` stay 1-D. An image run of
``grid + 2`` tokens has its first and last token outside the grid (its markers). Padded slots hold 0; the delta is the
row's largest position + 1 - its real tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ropeserve.errors import InvalidInput
from ropeserve.positions._common import MAX_ELEMENTS, IntsLike, as_long_array, as_mask_array, require_int

__all__ = ["HUNYUAN_VL_AXES", "XdRopePositions", "hunyuan_vl_positions"]

HUNYUAN_VL_AXES = 4
"""Axes of the released configs' ``mrope_section`` (``xdrope_section``): 4."""


@dataclass(frozen=True)
class XdRopePositions:
    position_ids: torch.Tensor
    """``[A, B, L]`` int64; padded slots 0."""
    mrope_position_deltas: torch.Tensor
    """``[B, 1]`` int64."""


def _image_runs(types: np.ndarray) -> list[tuple[int, int]]:
    """``(first, end)`` of each maximal run of image tokens (type 1)."""
    is_image = np.concatenate([[False], types == 1, [False]])
    edges = np.flatnonzero(np.diff(is_image.astype(np.int8)))
    return list(zip(edges[0::2].tolist(), edges[1::2].tolist(), strict=True))


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
    mask = np.ones(types.shape, dtype=bool)
    if attention_mask is not None:
        mask = as_mask_array(attention_mask, "attention_mask")[0]
        if mask.shape != types.shape:
            raise InvalidInput(f"attention_mask has shape {mask.shape}, tokens {types.shape}", field="attention_mask")
    grids = np.zeros((0, 3), dtype=np.int64)
    if image_grid_thw is not None:
        grids = as_long_array(image_grid_thw, "image_grid_thw", ndim=2)
        if grids.shape[1] != 3 or (grids.size and (int(grids.min()) < 1 or int(grids.max()) > MAX_ELEMENTS)):
            raise InvalidInput("image_grid_thw must be [N, 3] with sizes in [1, 2**27]", field="image_grid_thw")
    positions = np.zeros((axes, rows, width), dtype=np.int64)
    deltas = np.zeros((rows, 1), dtype=np.int64)
    image = 0
    for b in range(rows):
        row_types = types[b][mask[b]]
        row = np.broadcast_to(np.arange(row_types.size), (axes, row_types.size)).copy()
        for first, end in _image_runs(row_types) if image_grid_thw is not None else []:
            if image >= grids.shape[0]:
                raise InvalidInput(f"row {b}: more image runs than image_grid_thw entries", field="image_grid_thw")
            h, w = int(grids[image, 1]) // merge, int(grids[image, 2]) // merge
            tokens = h * (w + 1)
            if end - first not in (tokens, tokens + 2):
                raise InvalidInput(
                    f"row {b}: an image run of {end - first} tokens, but image_grid_thw[{image}] needs {tokens} "
                    f"(or {tokens + 2} with its markers)",
                    field=f"rows[{b}]",
                )
            start = first + (end - first - tokens) // 2
            row[axes - 3, start : start + tokens] = np.tile(np.arange(w + 1), h)
            row[axes - 2, start : start + tokens] = np.repeat(np.arange(h), w + 1)
            row[axes - 1, start : start + tokens] = image
            image += 1
        positions[:, b, mask[b]] = row
        if row.size:
            deltas[b, 0] = int(row.max()) + 1 - row_types.size
    if image_grid_thw is not None and image != grids.shape[0]:
        raise InvalidInput(
            f"image_grid_thw has {grids.shape[0]} entries but the tokens use {image}", field="image_grid_thw"
        )
    return XdRopePositions(torch.from_numpy(positions), torch.from_numpy(deltas))
