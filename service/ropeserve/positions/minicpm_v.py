"""MiniCPM-V 4.7 canvas M-RoPE positions (token form).

Reproduces transformers 5.24 ``MiniCPMV4_7Model.get_rope_index``. Visual tokens come as crops (runs of
``mm_token_type_ids`` 1 = image, 2 = video); a crop right after ``<slice>`` is a detail slice of the current frame,
any other crop opens a frame (its thumbnail); frames separated only by marker tokens share a group. Each frame is laid
on a canvas at ``origin``: T stays at ``origin``; the thumbnail is stretched over the canvas with
``round(linspace(0, canvas - 1, n))``; slices tile it (row-major, a row ends where the gap between two slices holds
more than the two ``</slice><slice>`` markers: the newline); the markers pin the canvas corners; the next position is
``origin + max(canvas_h, canvas_w) + 1``. Text is 1-D. ``target_sizes`` / ``target_sizes_videos`` hold
``[H, W]`` in patches for each thumbnail and slice in order; ``downsample_mode`` ``16x`` merges 4x4 patches, ``4x``
2x2.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import torch

from ropeserve.errors import InvalidInput
from ropeserve.positions._common import IntsLike, as_long_array
from ropeserve.positions.mrope import MRopePositions, mask_and_lengths

__all__ = ["MINICPMV_MARKERS", "MiniCpmMarkers", "minicpmv_positions"]

MERGE_FACTORS = {"16x": 4, "4x": 2}
"""downsample_mode -> patches merged per side into one LLM token."""


@dataclass(frozen=True)
class MiniCpmMarkers:
    """Marker token ids, in the order the frame parser reads them (``<slice>`` first)."""

    slice_start: int
    slice_end: int
    image_start: int
    image_end: int
    newline: int

    def ids(self) -> tuple[int, ...]:
        return (self.slice_start, self.slice_end, self.image_start, self.image_end, self.newline)


MINICPMV_MARKERS: MiniCpmMarkers | None = None
"""The 4.7 config class has no default marker ids (the checkpoint's tokenizer sets them): pass ``markers``."""

Slices = list[tuple[int, int]]
"""``(start, end)`` token runs of a frame's slice crops."""
Frame = tuple[int, int, int, int, Slices]
"""``(modality, thumb start, thumb end, frame end, slices)``."""


def _groups(tokens: np.ndarray, types: np.ndarray, markers: tuple[int, ...]) -> list[tuple[int, int, list[Frame]]]:
    """``(group start, group end, frames)``; a frame is ``(modality, thumb start, thumb end, frame end, slices)``.

    transformers walks the tokens one by one; here runs, marker tests and frame ends are array operations and only
    the crops are visited in Python.
    """
    length = types.size
    bounds = np.concatenate([[0], np.flatnonzero(np.diff(types)) + 1, [length]]) if length else np.zeros(1, int)
    is_marker = np.isin(tokens, markers)
    non_markers_before = np.concatenate([[0], np.cumsum(~is_marker)])  # [i]: non-marker tokens in tokens[:i]
    # next_text[i]: first index >= i that is not a marker (length if none): where a frame's closing markers stop
    next_text = np.where(is_marker, length, np.arange(length))
    next_text = np.minimum.accumulate(next_text[::-1])[::-1] if length else next_text
    groups: list[tuple[int, list[tuple[int, int, int, Slices]]]] = []
    open_slices: Slices | None = None
    previous_end = 0
    for start, end in zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True):
        modality = int(types[start])
        if modality == 0:
            continue
        if open_slices is not None and int(tokens[start - 1]) == markers[0]:
            open_slices.append((start, end))
        else:
            open_slices = []
            frame = (modality, start, end, open_slices)
            gap_end = start - 1
            only_markers = gap_end <= previous_end or non_markers_before[gap_end] == non_markers_before[previous_end]
            if groups and only_markers:
                groups[-1][1].append(frame)
            else:
                groups.append((start - 1, [frame]))
        previous_end = end
    out = []
    for group_start, frames in groups:
        laid: list[Frame] = []
        for modality, thumb_start, thumb_end, slices in frames:
            last = slices[-1][1] if slices else thumb_end
            frame_end = int(next_text[last]) if last < length else last
            laid.append((modality, thumb_start, thumb_end, frame_end, slices))
        out.append((group_start, laid[-1][3], laid))
    return out


@functools.lru_cache(maxsize=4096)
def _canvas_grid(grid_h: int, grid_w: int, canvas_h: int, canvas_w: int) -> np.ndarray:
    """``[3, grid_h*grid_w]`` T/H/W of a crop stretched over a canvas, from 0: ``round(linspace(0, canvas - 1, n))``
    computed by torch exactly as transformers does (cached: the same shapes recur)."""
    h_coords = torch.linspace(0, canvas_h - 1, grid_h).round().long()
    w_coords = torch.linspace(0, canvas_w - 1, grid_w).round().long()
    h_grid, w_grid = torch.meshgrid(h_coords, w_coords, indexing="ij")
    grid = torch.stack([torch.zeros_like(h_grid), h_grid, w_grid], dim=0).reshape(3, -1).numpy()
    grid.flags.writeable = False
    return grid


def _canvas_ids(
    start: int, size: list[int], merge: int, canvas: tuple[int, int] = (0, 0), offset: tuple[int, int] = (0, 0)
) -> np.ndarray:
    """``[3, h*w]`` T/H/W of a crop of ``size`` patches, stretched over ``canvas`` (0: its own size)."""
    grid_h, grid_w = int(size[0]) // merge, int(size[1]) // merge
    ids = _canvas_grid(grid_h, grid_w, canvas[0] or grid_h, canvas[1] or grid_w) + start
    ids[1:] += np.array(offset, dtype=np.int64)[:, None]
    return ids


class _Sizes:
    """Consumes ``target_sizes`` (images) and ``target_sizes_videos`` in order, naming what ran out."""

    def __init__(self, images: list[list[int]], videos: list[list[int]]) -> None:
        self.lists = {1: images, 2: videos}
        self.used = {1: 0, 2: 0}

    def next(self, modality: int, row: int) -> list[int]:
        items, used = self.lists[modality], self.used[modality]
        if used >= len(items):
            name = "target_sizes" if modality == 1 else "target_sizes_videos"
            raise InvalidInput(f"row {row}: more crops than entries in {name}", field=name)
        self.used[modality] = used + 1
        return items[used]


def _slice_layout(slices: list[tuple[int, int]]) -> tuple[int, int]:
    """``(rows, columns)`` of a frame's slices: a gap wider than two markers ends a row."""
    columns = len(slices)
    for k in range(len(slices) - 1):
        if slices[k + 1][0] - slices[k][1] > 2:
            columns = k + 1
            break
    rows = len(slices) // columns if columns > 0 else 1
    return (rows, columns) if rows * columns == len(slices) else (1, len(slices))


def _check_crop(start: int, end: int, size: list[int], merge: int, row: int) -> None:
    needed = (size[0] // merge) * (size[1] // merge)
    if end - start != needed:
        raise InvalidInput(
            f"row {row}: a crop of {end - start} tokens at {start} but its size {size} needs {needed}",
            field=f"rows[{row}]",
        )


def _frame(positions: np.ndarray, frame: Frame, origin: int, sizes: _Sizes, merge: int, row: int) -> int:
    """Lay one frame out at ``origin``; returns the next position."""
    modality, thumb_start, thumb_end, frame_end, slices = frame
    frame_start = thumb_start - 1
    thumb = sizes.next(modality, row)
    _check_crop(thumb_start, thumb_end, thumb, merge, row)
    canvas_h, canvas_w = thumb[0] // merge, thumb[1] // merge
    slice_h = slice_w = 0
    rows, columns = 0, 0
    if slices:
        rows, columns = _slice_layout(slices)
        first = sizes.next(modality, row)
        slice_h, slice_w = first[0] // merge, first[1] // merge
        canvas_h, canvas_w = rows * slice_h, columns * slice_w
    positions[:, frame_start:frame_end] = origin
    positions[1:, frame_start] = max(origin - 1, 0)  # <image>: the halo just outside the canvas
    if thumb_end < frame_end:  # </image>: the canvas' far corner
        positions[1, thumb_end] = origin + canvas_h
        positions[2, thumb_end] = origin + canvas_w
    positions[:, thumb_start:thumb_end] = _canvas_ids(origin, thumb, merge, (canvas_h, canvas_w))
    for k, (slice_start, slice_end) in enumerate(slices):
        h_off, w_off = (k // columns) * slice_h, (k % columns) * slice_w
        size = first if k == 0 else sizes.next(modality, row)
        _check_crop(slice_start, slice_end, size, merge, row)
        height, width = size[0] // merge, size[1] // merge
        if slice_start - 1 >= frame_start:
            positions[1, slice_start - 1] = origin + h_off
            positions[2, slice_start - 1] = origin + w_off
        if slice_end < frame_end:
            positions[1, slice_end] = origin + h_off + height - 1
            positions[2, slice_end] = origin + w_off + width - 1
        positions[:, slice_start:slice_end] = _canvas_ids(origin, size, merge, offset=(h_off, w_off))
    for k in range(len(slices) - 1):  # the newline ending a row of slices sits past its right edge
        gap_start, gap_end = slices[k][1], slices[k + 1][0]
        if gap_end - gap_start > 2:
            positions[1, gap_start + 1 : gap_end - 1] = origin + (k // columns + 1) * slice_h - 1
            positions[2, gap_start + 1 : gap_end - 1] = origin + columns * slice_w
    return origin + max(canvas_h, canvas_w) + 1


def _row(
    tokens: np.ndarray, types: np.ndarray, markers: tuple[int, ...], sizes: _Sizes, merge: int, row: int
) -> np.ndarray:
    length = tokens.size
    positions = np.broadcast_to(np.arange(length), (3, length)).copy()
    position = index = 0
    for group_start, group_end, frames in _groups(tokens, types, markers):
        if group_start > index:
            positions[:, index:group_start] = np.arange(group_start - index) + position
            position += group_start - index
        cursor = group_start
        for frame in frames:
            frame_start = frame[1] - 1
            if frame_start > cursor:  # text between two frames of a clip, then one position of room
                positions[:, cursor:frame_start] = np.arange(frame_start - cursor) + position
                position += frame_start - cursor + 1
            frame = (*frame[:3], min(frame[3], group_end), frame[4])
            position = _frame(positions, frame, position, sizes, merge, row)
            cursor = frame[3]
        if cursor < group_end:
            positions[:, cursor:group_end] = np.arange(group_end - cursor) + position
            position += group_end - cursor
        index = group_end
    if index < length:
        positions[:, index:length] = np.arange(length - index) + position
    return positions


def minicpmv_positions(
    *,
    input_ids: IntsLike,
    mm_token_type_ids: IntsLike,
    markers: MiniCpmMarkers,
    target_sizes: IntsLike | None = None,
    target_sizes_videos: IntsLike | None = None,
    downsample_mode: str = "16x",
    attention_mask: IntsLike | None = None,
) -> MRopePositions:
    """Prefill positions ``[3, B, L]`` (padded slots 0) and deltas (largest position + 1 - real tokens)."""
    if downsample_mode not in MERGE_FACTORS:
        raise InvalidInput(f"downsample_mode must be one of {sorted(MERGE_FACTORS)}", field="downsample_mode")
    merge = MERGE_FACTORS[downsample_mode]
    ids = as_long_array(input_ids, "input_ids", ndim=2)
    types = as_long_array(mm_token_type_ids, "mm_token_type_ids", ndim=2)
    if types.shape != ids.shape:
        message = f"mm_token_type_ids {types.shape} and input_ids {ids.shape} differ"
        raise InvalidInput(message, field="mm_token_type_ids")
    if types.size and (int(types.min()) < 0 or int(types.max()) > 2):
        raise InvalidInput("mm_token_type_ids may hold 0 (text), 1 (image) or 2 (video)", field="mm_token_type_ids")
    mask, lengths = mask_and_lengths(attention_mask, ids)
    sizes = _Sizes(_sizes(target_sizes, "target_sizes"), _sizes(target_sizes_videos, "target_sizes_videos"))
    positions = np.zeros((3, *ids.shape), dtype=np.int64)
    for b in range(ids.shape[0]):
        positions[:, b, mask[b]] = _row(ids[b][mask[b]], types[b][mask[b]], markers.ids(), sizes, merge, b)
    deltas = positions.max(axis=(0, 2), initial=0)[:, None] + 1 - lengths[:, None]
    return MRopePositions(torch.from_numpy(positions), torch.from_numpy(deltas), torch.from_numpy(mask))


def _sizes(value: IntsLike | None, name: str) -> list[list[int]]:
    if value is None:
        return []
    sizes = as_long_array(value, name, ndim=2)
    if sizes.shape[1] != 2 or (sizes.size and (int(sizes.min()) < 1 or int(sizes.max()) > 2**20)):
        raise InvalidInput(f"{name} must be [N, 2] sizes in patches, each in [1, 2**20]", field=name)
    checked: list[list[int]] = sizes.tolist()
    return checked
