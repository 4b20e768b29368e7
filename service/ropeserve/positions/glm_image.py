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

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import accumulate

import numpy as np
import torch

from ropeserve.errors import InvalidInput
from ropeserve.positions._common import (
    MAX_ELEMENTS,
    IntsLike,
    as_long_array,
    check_element_limit,
    padded_mask,
    require_int,
    require_padding_side,
    segment_row,
    segment_rows,
)
from ropeserve.positions._patterns import copy_blocks, grid_pattern, pattern, real_runs
from ropeserve.positions.mrope import real_mask

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


@dataclass(frozen=True)
class _Grids:
    """The batch's grids and which of them each row reads (``image_grid_thw`` split by ``images_per_sample``)."""

    shapes: tuple[tuple[int, ...], ...]  # [N] (t, h, w) of each grid
    first: list[int]  # [B] index of each row's first grid
    count: list[int]  # [B] grids of each row


def _grids(image_grid_thw: IntsLike | None, images_per_sample: IntsLike | None, rows: int) -> _Grids:
    if image_grid_thw is None:
        if images_per_sample is not None:
            raise InvalidInput("images_per_sample needs image_grid_thw", field="images_per_sample")
        return _Grids((), [0] * rows, [0] * rows)
    grids = as_long_array(image_grid_thw, "image_grid_thw", ndim=2)
    if grids.shape[1] != 3:
        raise InvalidInput(f"image_grid_thw must be [N, 3], got {list(grids.shape)}", field="image_grid_thw")
    # one pass: sizes below 1 wrap to huge unsigned values once 1 is taken off
    if grids.size and int((grids - 1).view(np.uint64).max()) >= MAX_ELEMENTS:
        index = int(np.flatnonzero(((grids < 1) | (grids > MAX_ELEMENTS)).any(axis=1))[0])
        raise InvalidInput(f"image_grid_thw[{index}] = {grids[index].tolist()} is out of range", field="image_grid_thw")
    shapes = tuple(map(tuple, grids.tolist()))
    if images_per_sample is None:  # every row reads all grids
        return _Grids(shapes, [0] * rows, [len(shapes)] * rows)
    counts = as_long_array(images_per_sample, "images_per_sample").reshape(-1).tolist()
    # the exact sum: an int64 sum of huge counts wraps (to the grid count, even)
    if len(counts) != rows or (counts and min(counts) < 0) or sum(counts) != len(shapes):
        raise InvalidInput(
            f"images_per_sample must give {rows} counts >= 0 summing to the {len(shapes)} grids",
            field="images_per_sample",
        )
    return _Grids(shapes, list(accumulate(counts[:-1], initial=0)), counts)


@dataclass(frozen=True)
class _Images:
    """Prompt images of the batch (each row's ``i``-th start and end markers, zip semantics, and ``i``-th grid), as
    :func:`_prefill` lays them out."""

    ends: list[int]  # slot of each image's <image_end>
    end_steps: list[int]  # max(h, w) - t*h*w: what its <image_end> advances besides its own 1
    dense: dict[tuple[int, ...], list[int]]  # grid -> first-token slots of the images whose tokens are consecutive
    holed: list[tuple[int, int, tuple[int, ...]]]  # (start slot, end slot, grid) of the images with padding inside
    complete: list[int]  # [B] <image_end> markers per row (transformers' "complete images")

    def add(self, start: int, end: int, shape: tuple[int, ...], tokens: int) -> None:
        """An image between the markers at slots ``start`` and ``end``, holding its ``tokens`` real tokens."""
        self.ends.append(end)
        self.end_steps.append(max(shape[1], shape[2]) - tokens)
        if end - start - 1 == tokens:  # no padded slot inside
            self.dense.setdefault(shape, []).append(start + 1)
        else:
            self.holed.append((start, end, shape))


def _find_images(ids: np.ndarray, mask: np.ndarray, grids: _Grids, marks: tuple[int, int]) -> _Images:
    """Pair each row's ``i``-th start and end markers with its ``i``-th grid and check the pair holds the grid's
    tokens. The markers are found with one pass over the batch; the pairs (few) are checked in Python."""
    rows, width = ids.shape
    found = ((ids == marks[0]) | (ids == marks[1])).reshape(-1).nonzero()[0]
    found = found[mask.reshape(-1)[found]]
    opening = ids.reshape(-1)[found] == marks[0]
    opens, closes = found[opening], found[~opening]
    row_edges = np.arange(rows + 1) * width  # each row's markers: a slice of the sorted slots
    open_at, close_at = np.searchsorted(opens, row_edges).tolist(), np.searchsorted(closes, row_edges).tolist()
    keys, shift = _real_index(mask)
    open_slots, close_slots = opens.tolist(), closes.tolist()
    open_keys = open_slots if keys is None else keys[opens].tolist()
    close_keys = close_slots if keys is None else keys[closes].tolist()
    images = _Images([], [], {}, [], [close_at[b + 1] - close_at[b] for b in range(rows)])
    for b, (first, count) in enumerate(zip(grids.first, grids.count, strict=True)):
        o, c, previous_end = open_at[b], close_at[b], 0
        for image in range(min(open_at[b + 1] - o, close_at[b + 1] - c, count)):
            shape = grids.shapes[first + image]
            tokens = math.prod(shape)
            # the image's first token (after <image_start>) and its <image_end>, among the row's real tokens
            first_token, end_token = open_keys[o + image] - shift[b], close_keys[c + image] - shift[b] - 1
            if end_token - first_token != tokens or first_token < previous_end:
                raise InvalidInput(
                    f"row {b}: image {image} has {end_token - first_token} tokens between its markers but grid "
                    f"{list(shape)} needs {tokens}",
                    field=f"rows[{b}]",
                )
            previous_end = end_token
            images.add(open_slots[o + image], close_slots[c + image], shape, tokens)
    return images


def _real_index(mask: np.ndarray) -> tuple[np.ndarray | None, list[int]]:
    """``(keys, shift)``: the real tokens of row ``b`` up to and including slot ``s`` are ``keys[s] - shift[b]``.

    When every row's real tokens are one run of slots (left or right padding), ``keys`` is None (read the slot
    itself) and ``shift[b]`` is the slot before the row's first real token; else ``keys`` ``[B * L]`` is a running
    count over each row and the shifts are 0."""
    rows, width = mask.shape
    first, one_run = real_runs(mask)
    if bool(one_run.all()):
        return None, [b * width + start - 1 for b, start in enumerate(first.tolist())]
    counts = mask.astype(np.int64)
    np.cumsum(counts, axis=1, out=counts)
    return counts.reshape(-1), [0] * rows


def _relative_pattern(shape: tuple[int, ...]) -> np.ndarray:
    """``[3, t*h*w]`` read-only grid pattern less each token's index in the image: added to the text positions the
    image's slots would have (``origin + index``), it gives ``origin + pattern``."""

    def build() -> np.ndarray:
        grid = grid_pattern(*shape)
        return grid - np.arange(grid.shape[1])

    return pattern(("glm-image-relative", *shape), build)


def _prefill(mask: np.ndarray, images: _Images) -> tuple[np.ndarray, np.ndarray]:
    """``[3, B, L]`` positions (padded slots 1) and ``[B]`` the position after each row's last real token.

    ``text`` ``[B, L]`` holds the 1-D positions: each real slot advances by 1 (the slot after an image, its
    ``<image_end>``, by ``max(h, w) - t*h*w`` more, so that the image's tokens advance ``max(h, w)`` in all), the
    first column starts at -1, and one running sum gives every position. An image whose tokens are consecutive
    slots then holds ``origin + index`` there (``origin``: the text position of its first token, which follows
    every earlier image's advance): its relative pattern is copied into a zeroed answer (one strided assignment per
    grid shape, no numpy call per image), and one add lays the text positions over all three axes. An image with
    padding inside is written on top, from the text position of its first token."""
    rows, width = mask.shape
    text = np.empty((rows, width), dtype=np.int64)
    np.copyto(text, mask)
    if images.ends:
        text.reshape(-1)[images.ends] += images.end_steps
    if width:
        text[:, 0] -= 1
    np.cumsum(text, axis=1, out=text)
    after = text[:, -1] + 1 if width else np.zeros(rows, dtype=np.int64)  # padded slots never advance the sum
    if not mask.all():
        np.copyto(text, _FILL, where=~mask)
    positions = np.zeros((3, rows, width), dtype=np.int64)
    flat = positions.reshape(3, -1)
    for shape, firsts in images.dense.items():
        copy_blocks(flat, firsts, _relative_pattern(shape))
    np.add(positions, text, out=positions)
    real, text_flat = mask.reshape(-1), text.reshape(-1)
    for start, end, shape in images.holed:
        slots = start + 1 + np.flatnonzero(real[start + 1 : end])
        flat[:, slots] = grid_pattern(*shape) + text_flat[slots[0]]  # the first token is the origin
    return positions, after


def _decode_pattern(generated: tuple[tuple[int, ...], ...]) -> np.ndarray:
    """``[3, D]`` read-only positions from 0 of the generated images (the last grid first) and one final token
    (``D`` checked by :func:`_decode`)."""

    def build() -> np.ndarray:
        columns, position = [], 0
        for _, h, w in generated[::-1]:  # generated images are one frame whatever t says
            columns.append(grid_pattern(1, h, w) + position)
            position += max(h, w)
        columns.append(np.full((3, 1), position, dtype=np.int64))
        return np.concatenate(columns, axis=1)

    return pattern(("glm-image-decode", generated), build)


def _decode(grids: _Grids, complete: list[int], after: np.ndarray, limit: int | None, field: str) -> np.ndarray | None:
    """``[R, 3, D]`` decode positions of the rows with grids, from each row's ``after`` (shorter rows repeat
    their last column); rows with the same generated grids share one pattern. ``R * D`` is checked against
    ``limit`` before anything is built (a few grid numbers ask for billions of positions)."""
    keyed: dict[tuple[tuple[int, ...], ...], int] = {}
    which, rows = [], []
    for b, (first, count, done) in enumerate(zip(grids.first, grids.count, complete, strict=True)):
        if count:
            generated = grids.shapes[first + min(done, count) : first + count]
            which.append(keyed.setdefault(generated, len(keyed)))
            rows.append(b)
    if not rows:
        return None
    width = max(sum(h * w for _, h, w in generated) + 1 for generated in keyed)
    check_element_limit(len(rows) * width, limit, "decode positions", field)
    starts = after if len(rows) == after.size else after[rows]
    patterns = [_decode_pattern(generated) for generated in keyed]
    if len(patterns) == 1:  # the usual batch: every row generates the same grids
        same: np.ndarray = patterns[0] + starts[:, None, None]
        return same
    length = max(p.shape[1] for p in patterns)
    padded = np.stack([np.pad(p, ((0, 0), (0, length - p.shape[1])), mode="edge") for p in patterns])
    decode: np.ndarray = padded[which] + starts[:, None, None]
    return decode


def glm_image_positions(
    *,
    input_ids: IntsLike,
    image_grid_thw: IntsLike | None = None,
    images_per_sample: IntsLike | None = None,
    attention_mask: IntsLike | None = None,
    image_start_token_id: int = GLM_IMAGE_START_TOKEN_ID,
    image_end_token_id: int = GLM_IMAGE_END_TOKEN_ID,
    max_tokens: int | None = None,
) -> GlmImagePositions:
    """Prefill and decode positions of a GLM-Image batch (see the module docstring); ``max_tokens`` bounds the
    decode positions (rows with grids × the longest row's)."""
    return _positions(
        input_ids,
        image_grid_thw,
        images_per_sample,
        attention_mask,
        (image_start_token_id, image_end_token_id),
        max_tokens,
        "image_grid_thw",
    )


def _positions(
    input_ids: IntsLike,
    image_grid_thw: IntsLike | None,
    images_per_sample: IntsLike | None,
    attention_mask: IntsLike | None,
    marks: tuple[int, int],
    max_tokens: int | None,
    decode_field: str,
) -> GlmImagePositions:
    ids = as_long_array(input_ids, "input_ids", ndim=2)
    rows, width = ids.shape
    mask = real_mask(attention_mask, ids)
    grids = _grids(image_grid_thw, images_per_sample, rows)
    images = _find_images(ids, mask, grids, marks)
    positions, after = _prefill(mask, images)
    decode = _decode(grids, images.complete, after, max_tokens, decode_field)
    return GlmImagePositions(
        torch.from_numpy(positions),
        torch.from_numpy(np.zeros((rows, 1), dtype=np.int64)),
        None if decode is None else torch.from_numpy(decode),
    )


_TEXT_ID = -1
"""Any id other than the markers works for text once the ids are rendered here."""


def _render_row(segments: object, b: int, limit: int, spent: int) -> tuple[list[np.ndarray], list[list[int]], int]:
    """Token ids (as pieces) and grids (prompt images, then images to generate) of one segment row."""
    segments = segment_row(segments, b)
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
    require_padding_side(padding_side)
    rows = segment_rows(rows)
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
    mask = padded_mask(lengths, width, padding_side)
    ids = np.full(mask.shape, _TEXT_ID, dtype=np.int64)
    ids[mask] = np.concatenate(id_rows) if id_rows else np.zeros(0, dtype=np.int64)
    return _positions(
        ids,
        np.array(grids, dtype=np.int64).reshape(-1, 3) if grids else None,
        np.array(counts, dtype=np.int64) if grids else None,
        mask,
        (GLM_IMAGE_START_TOKEN_ID, GLM_IMAGE_END_TOKEN_ID),
        limit,
        "rows",
    )
