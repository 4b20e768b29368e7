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

from dataclasses import dataclass

import numpy as np
import torch

from ropeserve.errors import InvalidInput
from ropeserve.positions._common import IntsLike, as_long_array
from ropeserve.positions._patterns import pattern, real_runs
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
Crop = tuple[int, int, int, bool, bool, int]
"""``(modality, start, end, after <slice>, only markers since the previous crop, end past its closing markers)``."""


def _crops(
    tokens: np.ndarray, types: np.ndarray, starts: np.ndarray, lengths: np.ndarray, markers: tuple[int, ...]
) -> list[list[Crop]]:
    """Each row's crops (maximal runs of visual tokens) in row coordinates, from the real tokens of the whole batch
    (``tokens``, ``types``: the rows' real tokens end to end, row ``b`` from ``starts[b]``).

    transformers walks every token in Python; here the runs, marker tests and frame ends are array operations over
    the batch and only the crops are visited in Python.
    """
    rows, total = lengths.size, tokens.size
    per_row: list[list[Crop]] = [[] for _ in range(rows)]
    if not total:
        return per_row
    change = np.ones(total, dtype=bool)
    change[1:] = types[1:] != types[:-1]
    change[starts[lengths > 0]] = True  # a run never crosses a row start
    bounds = np.flatnonzero(change)
    visual = types[bounds] != 0
    first, last = bounds[visual], np.append(bounds[1:], total)[visual]
    if not first.size:
        return per_row
    row = np.searchsorted(starts, first, side="right") - 1
    is_marker = tokens == markers[0]
    for marker in markers[1:]:  # (faster than np.isin for a handful of ids)
        is_marker |= tokens == marker
    non_markers = np.concatenate([[0], np.cumsum(~is_marker)])  # [i]: non-marker tokens before i
    opens_row = np.ones(first.size, dtype=bool)
    opens_row[1:] = row[1:] != row[:-1]
    previous_end = np.where(opens_row, starts[row], np.concatenate([[0], last[:-1]]))
    gap_end = first - 1
    only_markers = (gap_end <= previous_end) | (non_markers[np.maximum(gap_end, 0)] == non_markers[previous_end])
    text = np.append(np.flatnonzero(~is_marker), total)  # where the markers after a crop stop
    closed = np.minimum(text[np.searchsorted(text, last)], starts[row] + lengths[row])
    origin = starts[row]
    for b, crop in zip(
        row.tolist(),
        zip(
            types[first].tolist(),
            (first - origin).tolist(),
            (last - origin).tolist(),
            (tokens[first - 1] == markers[0]).tolist(),  # (a row's first crop opens a frame whatever this says)
            only_markers.tolist(),
            (closed - origin).tolist(),
            strict=True,
        ),
        strict=True,
    ):
        per_row[b].append(crop)
    return per_row


def _groups(crops: list[Crop]) -> list[tuple[int, int, list[Frame]]]:
    """``(group start, group end, frames)`` of one row, as transformers' ``_group_visual_frames``: a crop right after
    ``<slice>`` is a slice of the open frame, any other opens a frame, which joins the previous group when only
    markers lie between them."""
    groups: list[tuple[int, list[tuple[int, int, int, int, Slices]]]] = []
    open_slices: Slices | None = None
    slice_ends: list[int] = []
    for modality, start, end, after_slice, only_markers, closed in crops:
        if open_slices is not None and after_slice:
            open_slices.append((start, end))
            slice_ends[-1] = closed
        else:
            open_slices = []
            slice_ends.append(closed)
            frame = (modality, start, end, len(slice_ends) - 1, open_slices)
            if groups and only_markers:
                groups[-1][1].append(frame)
            else:
                groups.append((start - 1, [frame]))
    out = []
    for group_start, frames in groups:
        laid = [(modality, start, end, slice_ends[k], slices) for modality, start, end, k, slices in frames]
        out.append((group_start, laid[-1][3], laid))
    return out


def _canvas(grid_h: int, grid_w: int, canvas_h: int, canvas_w: int) -> tuple[torch.Tensor, torch.Tensor]:
    """H and W (from 0) of a crop stretched over a canvas, ``[grid_h*grid_w]`` each, row-major:
    ``round(linspace(0, canvas - 1, n))`` computed by torch exactly as transformers does."""
    h_coords = torch.linspace(0, canvas_h - 1, grid_h).round().long()
    w_coords = torch.linspace(0, canvas_w - 1, grid_w).round().long()
    h_grid, w_grid = torch.meshgrid(h_coords, w_coords, indexing="ij")
    return h_grid.reshape(-1), w_grid.reshape(-1)


@dataclass(frozen=True)
class _Layout:
    """One frame in its own coordinates (index 0: the slot before its thumbnail, ``<image>``); with the frame's
    origin it fixes every position of the frame, so it keys the frame's cached pattern."""

    length: int  # frame end - frame start
    thumb: tuple[int, int, int, int]  # (start, end, grid h, grid w)
    canvas: tuple[int, int]  # (h, w) in tokens
    slice_hw: tuple[int, int]  # the first slice's (h, w): the canvas tile
    columns: int  # slices per canvas row
    slices: tuple[tuple[int, int, int, int], ...]  # (start, end, h, w) of each slice


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
    """Lay one frame out at ``origin`` (consuming its crops' sizes); returns the next position."""
    modality, thumb_start, thumb_end, frame_end, slices = frame
    frame_start = thumb_start - 1
    thumb = sizes.next(modality, row)
    _check_crop(thumb_start, thumb_end, thumb, merge, row)
    canvas_h, canvas_w = thumb[0] // merge, thumb[1] // merge
    slice_h = slice_w = columns = 0
    crops = []
    if slices:
        rows, columns = _slice_layout(slices)
        for slice_start, slice_end in slices:
            size = sizes.next(modality, row)
            _check_crop(slice_start, slice_end, size, merge, row)
            crops.append((slice_start - frame_start, slice_end - frame_start, size[0] // merge, size[1] // merge))
        slice_h, slice_w = crops[0][2], crops[0][3]
        canvas_h, canvas_w = rows * slice_h, columns * slice_w
    layout = _Layout(
        frame_end - frame_start,
        (1, thumb_end - frame_start, thumb[0] // merge, thumb[1] // merge),
        (canvas_h, canvas_w),
        (slice_h, slice_w),
        columns,
        tuple(crops),
    )
    if frame_start >= 0:  # everything the frame writes lies in [frame_start, frame_end): one cached pattern
        np.add(_frame_pattern(layout), origin, out=positions[:, frame_start:frame_end])
        if origin == 0:
            positions[1:, frame_start] = 0  # the halo is max(origin - 1, 0)
    else:  # a crop opening the row: transformers' frame starts at -1 (its writes wrap to the row's end)
        _paint(positions, frame_start, layout, origin)
    return origin + max(canvas_h, canvas_w) + 1


def _frame_pattern(layout: _Layout) -> np.ndarray:
    """``[3, layout.length]`` positions of a frame laid out at origin 0 (the halo at -1)."""

    def build() -> np.ndarray:
        scratch = np.zeros((3, layout.length), dtype=np.int64)
        _paint(scratch, 0, layout, 1)  # at origin 1 the halo max(origin - 1, 0) is still origin - 1
        scratch -= 1
        return scratch

    return pattern(("minicpmv-frame", layout), build)


def _paint(positions: np.ndarray, frame_start: int, layout: _Layout, origin: int) -> None:
    """Write one frame at ``origin`` as transformers does, in its order (later writes win)."""
    frame_end = frame_start + layout.length
    canvas_h, canvas_w = layout.canvas
    slice_h, slice_w = layout.slice_hw
    columns = layout.columns
    start, end, grid_h, grid_w = layout.thumb
    thumb_start, thumb_end = frame_start + start, frame_start + end
    positions[:, frame_start:frame_end] = origin
    positions[1:, frame_start] = max(origin - 1, 0)  # <image>: the halo just outside the canvas
    if thumb_end < frame_end:  # </image>: the canvas' far corner
        positions[1, thumb_end] = origin + canvas_h
        positions[2, thumb_end] = origin + canvas_w
    h_grid, w_grid = _canvas(grid_h, grid_w, canvas_h, canvas_w)
    positions[0, thumb_start:thumb_end] = origin
    positions[1, thumb_start:thumb_end] = origin + h_grid.numpy()
    positions[2, thumb_start:thumb_end] = origin + w_grid.numpy()
    for k, (start, end, height, width) in enumerate(layout.slices):
        slice_start, slice_end = frame_start + start, frame_start + end
        h_off, w_off = (k // columns) * slice_h, (k % columns) * slice_w
        if slice_start - 1 >= frame_start:
            positions[1, slice_start - 1] = origin + h_off
            positions[2, slice_start - 1] = origin + w_off
        if slice_end < frame_end:
            positions[1, slice_end] = origin + h_off + height - 1
            positions[2, slice_end] = origin + w_off + width - 1
        h_grid, w_grid = _canvas(height, width, height, width)
        positions[0, slice_start:slice_end] = origin
        positions[1, slice_start:slice_end] = origin + h_off + h_grid.numpy()
        positions[2, slice_start:slice_end] = origin + w_off + w_grid.numpy()
    for k in range(len(layout.slices) - 1):  # the newline ending a row of slices sits past its right edge
        gap_start, gap_end = frame_start + layout.slices[k][1], frame_start + layout.slices[k + 1][0]
        if gap_end - gap_start > 2:
            positions[1, gap_start + 1 : gap_end - 1] = origin + (k // columns + 1) * slice_h - 1
            positions[2, gap_start + 1 : gap_end - 1] = origin + columns * slice_w


def _row(positions: np.ndarray, crops: list[Crop], sizes: _Sizes, merge: int, row: int) -> None:
    """Lay one row out into ``positions`` ``[3, length]`` (its real tokens)."""
    length = positions.shape[1]
    positions[:] = np.arange(length)
    position = index = 0
    for group_start, group_end, frames in _groups(crops):
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
    everything = bool(mask.all())
    tokens, kinds = (ids.reshape(-1), types.reshape(-1)) if everything else (ids[mask], types[mask])
    crops = _crops(tokens, kinds, np.cumsum(lengths) - lengths, lengths, markers.ids())
    first, dense = real_runs(mask, lengths)
    for b, (start, length, one_run) in enumerate(zip(first.tolist(), lengths.tolist(), dense.tolist(), strict=True)):
        if one_run:  # the row's real tokens are one run of slots: lay it out in place
            _row(positions[:, b, start : start + length], crops[b], sizes, merge, b)
        else:
            laid = np.empty((3, length), dtype=np.int64)
            _row(laid, crops[b], sizes, merge, b)
            positions[:, b, mask[b]] = laid
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
