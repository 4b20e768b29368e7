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

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from ropeserve.errors import InvalidInput
from ropeserve.positions._common import MAX_ELEMENTS, IntsLike, as_long_array, check_element_limit, require_int
from ropeserve.positions.mrope import mask_and_lengths

__all__ = [
    "GLM_IMAGE_END_TOKEN_ID",
    "GLM_IMAGE_START_TOKEN_ID",
    "GlmImagePositions",
    "glm_image_positions",
    "glm_image_positions_from_segments",
]

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


@dataclass(frozen=True)
class _Images:
    """Prompt images of the batch in compact (real-token) coordinates."""

    first: np.ndarray  # [I] compact index of each image's first token
    end: np.ndarray  # [I] compact index of its <image_end>
    grid: np.ndarray  # [I, 3]
    complete: np.ndarray  # [B] <image_end> markers per row (transformers' "complete images")


def _find_images(
    compact: np.ndarray, starts: np.ndarray, lengths: np.ndarray, grid_rows: list[np.ndarray], ids: tuple[int, int]
) -> _Images:
    """Pair each row's ``i``-th start and end markers (zip semantics) with the row's ``i``-th grid."""
    firsts, ends, grids, complete = [], [], [], []
    for b, (start, length) in enumerate(zip(starts.tolist(), lengths.tolist(), strict=True)):
        row = compact[start : start + length]
        opens = np.flatnonzero(row == ids[0]) + 1
        closes = np.flatnonzero(row == ids[1])
        count = min(opens.size, closes.size, grid_rows[b].shape[0])
        opens, pairs = opens[:count], closes[:count]
        previous = np.concatenate([[0], pairs[:-1]])
        tokens = grid_rows[b][:count].prod(axis=1) if count else np.zeros(0, dtype=np.int64)
        bad = (pairs - opens != tokens) | (opens < previous)
        if bad.any():
            image = int(np.flatnonzero(bad)[0])
            raise InvalidInput(
                f"row {b}: image {image} has {int(pairs[image] - opens[image])} tokens between its markers but grid "
                f"{grid_rows[b][image].tolist()} needs {int(tokens[image])}",
                field=f"rows[{b}]",
            )
        firsts.append(opens + start)
        ends.append(pairs + start)
        grids.append(grid_rows[b][:count])
        complete.append(closes.size)
    return _Images(
        np.concatenate(firsts).astype(np.int64),
        np.concatenate(ends).astype(np.int64),
        np.concatenate(grids).reshape(-1, 3),
        np.array(complete, dtype=np.int64),
    )


def _prefill(compact_size: int, starts: np.ndarray, lengths: np.ndarray, images: _Images) -> np.ndarray:
    """``[3, N]`` positions of the real tokens: 1-D, advanced by ``max(h, w)`` per image, images in T/H/W."""
    index = np.arange(compact_size) - np.repeat(starts, lengths)
    t, h, w = images.grid.T
    tokens = t * h * w
    step = np.zeros(compact_size + 1, dtype=np.int64)
    step[images.end] = np.maximum(h, w) - tokens  # from the <image_end> on, positions run max(h, w) - t*h*w behind
    running = np.cumsum(step)[:-1]
    before_row = np.where(starts > 0, running[np.maximum(starts - 1, 0)], 0) if compact_size else starts
    base = index + running - np.repeat(before_row, lengths)
    values = np.broadcast_to(base, (3, compact_size)).copy()
    origins = base[images.first].tolist()
    for first, origin, (frames, rows, columns) in zip(
        images.first.tolist(), origins, images.grid.tolist(), strict=True
    ):
        block = values[:, first : first + frames * rows * columns].reshape(3, frames, rows, columns)
        block[0] = origin + np.arange(frames)[:, None, None]  # a few large images: one broadcast each
        block[1] = origin + np.arange(rows)[None, :, None]
        block[2] = origin + np.arange(columns)[None, None, :]
    return values


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
    mask, lengths = mask_and_lengths(attention_mask, ids)
    grid_rows = _grid_rows(image_grid_thw, images_per_sample, rows)
    starts = np.cumsum(lengths) - lengths
    compact = ids[mask]
    images = _find_images(compact, starts, lengths, grid_rows, (image_start_token_id, image_end_token_id))
    values = _prefill(compact.size, starts, lengths, images)
    positions = np.full((3, rows, width), _FILL, dtype=np.int64)
    positions.reshape(3, -1)[:, np.flatnonzero(mask.reshape(-1))] = values
    decode: list[np.ndarray] = []
    for b in range(rows):
        grids = grid_rows[b]
        if grids.shape[0]:
            generated = grids[min(int(images.complete[b]), grids.shape[0]) :]  # beyond the prompt's images
            tokens = float(generated[:, 1:].astype(np.float64).prod(axis=1).sum()) + 1  # no int64 overflow
            check_element_limit(int(min(tokens, 2.0**62)), None, "decode positions", "image_grid_thw")
            after = int(values[0, starts[b] + lengths[b] - 1]) + 1 if lengths[b] else 0
            decode.append(_decode_row(generated, after))
    decode_ids = None
    if decode:
        length = max(piece.shape[1] for piece in decode)
        decode_ids = torch.from_numpy(
            np.stack([np.concatenate([p, np.repeat(p[:, -1:], length - p.shape[1], axis=1)], axis=1) for p in decode])
        )
    return GlmImagePositions(torch.from_numpy(positions), torch.zeros((rows, 1), dtype=torch.long), decode_ids)


_TEXT_ID = -1
"""Any id other than the markers works for text once the ids are rendered here."""


def _render_row(segments: object, b: int, limit: int, spent: int) -> tuple[list[np.ndarray], list[list[int]], int]:
    """Token ids (as pieces) and grids (prompt images, then images to generate) of one segment row."""
    if isinstance(segments, str | bytes | Mapping) or not isinstance(segments, Sequence):
        raise InvalidInput(f"rows[{b}] must be a list of segments", field=f"rows[{b}]")
    pieces: list[np.ndarray] = []
    prompt: list[list[int]] = []
    generated: list[list[int]] = []
    for i, segment in enumerate(segments):
        field = f"rows[{b}].segments[{i}]"
        if not isinstance(segment, Mapping) or len(segment) != 1 or set(segment) - {"text", "image", "generate"}:
            raise InvalidInput(f"{field} must be one of text, image, generate", field=field)
        ((kind, value),) = segment.items()
        if kind == "text":
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise InvalidInput(f"{field}: text must be an integer >= 0", field=field)
            spent += value
            check_element_limit(spent, limit, "tokens", field)
            pieces.append(np.full(value, _TEXT_ID, dtype=np.int64))
            continue
        if isinstance(value, str | bytes) or not isinstance(value, Sequence) or len(value) != 3:
            raise InvalidInput(f"{field}: {kind} must be [t, h, w]", field=field)
        grid = [require_int(size, field, minimum=1) for size in value]
        if max(grid) > MAX_ELEMENTS:
            raise InvalidInput(f"{field}: grid {grid} is out of range", field=field)
        if kind == "generate":
            generated.append(grid)
            continue
        if generated:
            raise InvalidInput(f"{field}: prompt images come before the images to generate", field=field)
        spent += grid[0] * grid[1] * grid[2] + 2
        check_element_limit(spent, limit, "tokens", field)
        pieces += [
            np.array([GLM_IMAGE_START_TOKEN_ID], dtype=np.int64),
            np.full(grid[0] * grid[1] * grid[2], _TEXT_ID, dtype=np.int64),
            np.array([GLM_IMAGE_END_TOKEN_ID], dtype=np.int64),
        ]
        prompt.append(grid)
    return pieces, prompt + generated, spent


def glm_image_positions_from_segments(
    rows: Sequence[Sequence[Mapping[str, object]]],
    *,
    padding_side: str = "right",
    max_tokens: int | None = None,
) -> GlmImagePositions:
    """Segment form: ``{"text": n}``, ``{"image": [t, h, w]}`` (a prompt image with its start and end markers:
    ``t*h*w + 2`` tokens) and ``{"generate": [t, h, w]}`` (an image the model will generate: no tokens, after the
    prompt images). Rows pad on ``padding_side``; the grids of each row are its ``images_per_sample``."""
    if padding_side not in ("left", "right"):
        raise InvalidInput(f"padding_side must be 'left' or 'right', got {padding_side!r}", field="padding_side")
    if isinstance(rows, str | bytes) or not isinstance(rows, Sequence):
        raise InvalidInput("rows must be a list of segment lists", field="rows")
    limit = MAX_ELEMENTS if max_tokens is None else min(max_tokens, MAX_ELEMENTS)
    spent = 0
    id_rows, grids, counts = [], [], []
    for b, segments in enumerate(rows):
        pieces, row_grids, spent = _render_row(segments, b, limit, spent)
        id_rows.append(np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int64))
        grids += row_grids
        counts.append(len(row_grids))
    lengths = np.array([row.size for row in id_rows], dtype=np.int64)
    width = int(lengths.max(initial=0))
    check_element_limit(len(id_rows) * width, limit, "position slots", "rows")
    columns = np.arange(width)[None, :]
    mask = columns >= width - lengths[:, None] if padding_side == "left" else columns < lengths[:, None]
    ids = np.full(mask.shape, _TEXT_ID, dtype=np.int64)
    ids[mask] = np.concatenate(id_rows) if id_rows else np.zeros(0, dtype=np.int64)
    return glm_image_positions(
        input_ids=ids,
        image_grid_thw=np.array(grids, dtype=np.int64).reshape(-1, 3) if grids else None,
        images_per_sample=np.array(counts, dtype=np.int64) if grids else None,
        attention_mask=mask,
    )
