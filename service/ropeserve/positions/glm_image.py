"""GLM-Image M-RoPE positions: prompt images between start/end markers, and the positions of the images the model
generates during decode.

Reproduces transformers 5.24 ``GlmImageModel.get_rope_index`` (token form only: the rule is defined on the marker
tokens). Per row, the ``i``-th ``<image_start>`` / ``<image_end>`` pair encloses prompt image ``i`` of the row's
grids: text (markers included) advances by 1 per token; the image, ``t * h * w`` tokens, gets ``T = p + frame``,
``H = p + row``, ``W = p + column`` and advances the position by ``max(h, w)`` (no spatial merge). The row's grids
are ``image_grid_thw`` split by ``images_per_sample`` (all grids for every row when absent); those beyond the prompt's
complete images are generated: the last grid first, each at ``T = d``, ``H = d + row``, ``W = d + column`` then
``d += max(h, w)``, plus one final token at ``d`` — ``decode_position_ids`` ``[B, 3, D]``, shorter rows padded by
repeating their last column. Prefill deltas are 0; padded slots hold 1 (transformers starts from ``torch.ones``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ropeserve.errors import InvalidInput
from ropeserve.positions._common import MAX_ELEMENTS, IntsLike, as_long_array, as_mask_array, check_element_limit

__all__ = ["GLM_IMAGE_START_TOKEN_ID", "GLM_IMAGE_END_TOKEN_ID", "GlmImagePositions", "glm_image_positions"]

GLM_IMAGE_START_TOKEN_ID = 16384
GLM_IMAGE_END_TOKEN_ID = 16385
_FILL = 1


@dataclass(frozen=True)
class GlmImagePositions:
    position_ids: torch.Tensor
    """``[3, B, L]`` int64 prefill positions; padded slots 1."""
    mrope_position_deltas: torch.Tensor
    """``[B, 1]`` int64 zeros (GLM-Image decodes from ``decode_position_ids``)."""
    decode_position_ids: torch.Tensor | None
    """``[R, 3, D]`` int64 positions of the tokens generated after the prompt, one entry per row that has grids
    (step ``s`` of decode reads column ``s``, as transformers' cache does); None when no row has grids."""


def _grid_rows(image_grid_thw: IntsLike | None, images_per_sample: IntsLike | None, rows: int) -> list[np.ndarray]:
    if image_grid_thw is None:
        if images_per_sample is not None:
            raise InvalidInput("images_per_sample needs image_grid_thw", field="images_per_sample")
        return [np.zeros((0, 3), dtype=np.int64)] * rows
    grids = as_long_array(image_grid_thw, "image_grid_thw", ndim=2)
    if grids.shape[1] != 3:
        raise InvalidInput(f"image_grid_thw must be [N, 3], got {list(grids.shape)}", field="image_grid_thw")
    if grids.size and (int(grids.min()) < 1 or int(grids.max()) > MAX_ELEMENTS):
        index = int(np.flatnonzero(((grids < 1) | (grids > MAX_ELEMENTS)).any(axis=1))[0])
        raise InvalidInput(f"image_grid_thw[{index}] = {grids[index].tolist()} is out of range", field="image_grid_thw")
    if images_per_sample is None:
        return [grids] * rows
    counts = as_long_array(images_per_sample, "images_per_sample").reshape(-1)
    if counts.size != rows or (counts.size and int(counts.min()) < 0) or int(counts.sum()) != grids.shape[0]:
        raise InvalidInput(
            f"images_per_sample must give {rows} counts >= 0 summing to the {grids.shape[0]} grids",
            field="images_per_sample",
        )
    return np.split(grids, np.cumsum(counts)[:-1])


def _prefill_row(
    ids: np.ndarray, grids: np.ndarray, start_id: int, end_id: int, row: int
) -> tuple[np.ndarray, int, int]:
    """``([3, n] positions, complete images (end markers), position after the prompt)`` of one row's real tokens."""
    starts = np.flatnonzero(ids == start_id) + 1
    ends = np.flatnonzero(ids == end_id)
    pieces: list[np.ndarray] = []
    position = previous_end = 0
    for image, (start, end) in enumerate(zip(starts.tolist(), ends.tolist(), strict=False)):
        if image >= grids.shape[0]:
            break
        t, h, w = grids[image].tolist()
        if end - start != t * h * w or start - previous_end < 0:
            raise InvalidInput(
                f"row {row}: image {image} has {end - start} tokens between its markers but grid {[t, h, w]} "
                f"needs {t * h * w}",
                field=f"rows[{row}]",
            )
        text = start - previous_end
        pieces.append(np.broadcast_to(position + np.arange(text), (3, text)))
        position += text
        block = np.empty((3, t, h, w), dtype=np.int64)
        block[0] = np.arange(t)[:, None, None]
        block[1] = np.arange(h)[None, :, None]
        block[2] = np.arange(w)[None, None, :]
        pieces.append(block.reshape(3, -1) + position)
        position += max(h, w)
        previous_end = end
    tail = ids.size - previous_end
    pieces.append(np.broadcast_to(position + np.arange(tail), (3, tail)))
    return np.concatenate(pieces, axis=1), ends.size, position + tail


def _decode_row(grids: np.ndarray, position: int) -> np.ndarray:
    """``[3, D]`` positions of the generated images (the last grid first) and one final token."""
    columns: list[np.ndarray] = []
    for t, h, w in grids[::-1].tolist():
        del t  # generated images are one frame whatever t says
        block = np.empty((3, h, w), dtype=np.int64)
        block[0] = position
        block[1] = position + np.arange(h)[:, None]
        block[2] = position + np.arange(w)[None, :]
        columns.append(block.reshape(3, -1))
        position += max(h, w)
    columns.append(np.full((3, 1), position, dtype=np.int64))
    return np.concatenate(columns, axis=1)


def glm_image_positions(
    *,
    input_ids: IntsLike,
    image_grid_thw: IntsLike | None = None,
    images_per_sample: IntsLike | None = None,
    attention_mask: IntsLike | None = None,
    image_start_token_id: int = GLM_IMAGE_START_TOKEN_ID,
    image_end_token_id: int = GLM_IMAGE_END_TOKEN_ID,
) -> GlmImagePositions:
    """Prefill and decode positions of a GLM-Image batch (see the module docstring)."""
    ids = as_long_array(input_ids, "input_ids", ndim=2)
    rows, width = ids.shape
    mask = np.ones(ids.shape, dtype=bool)
    if attention_mask is not None:
        mask = as_mask_array(attention_mask, "attention_mask")[0]
        if mask.shape != ids.shape:
            raise InvalidInput(f"attention_mask has shape {mask.shape}, input_ids {ids.shape}", field="attention_mask")
    grid_rows = _grid_rows(image_grid_thw, images_per_sample, rows)
    positions = np.full((3, rows, width), _FILL, dtype=np.int64)
    decode: list[np.ndarray] = []
    for b in range(rows):
        grids = grid_rows[b]
        row_positions, complete, after = _prefill_row(
            ids[b][mask[b]], grids, image_start_token_id, image_end_token_id, b
        )
        positions[:, b, mask[b]] = row_positions
        if grids.shape[0]:
            generated = grids[min(complete, grids.shape[0]) :]  # the grids beyond the prompt's complete images
            check_element_limit(
                int(generated[:, 1:].prod(axis=1).sum()) + 1, None, "decode positions", "image_grid_thw"
            )
            decode.append(_decode_row(generated, after))
    decode_ids = None
    if decode:
        length = max(piece.shape[1] for piece in decode)
        decode_ids = torch.from_numpy(
            np.stack([np.concatenate([p, np.repeat(p[:, -1:], length - p.shape[1], axis=1)], axis=1) for p in decode])
        )
    return GlmImagePositions(torch.from_numpy(positions), torch.zeros((rows, 1), dtype=torch.long), decode_ids)
