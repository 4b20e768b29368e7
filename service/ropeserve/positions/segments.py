"""M-RoPE positions from a segment list per row, and the conversion from token-level input to segments.

A row is a list of JSON-shaped segments (plain dicts, see the TypedDicts below), for example::

    [{"text": 12}, {"image": [1, 28, 28]}, {"video": [8, 16, 16], "second_per_grid_t": 0.5}, {"text": 5}]

Grids are ``(t, h, w)`` in patch units, before spatial merging; a vision segment holds ``t * (h/m) * (w/m)`` tokens.
Text segments count every text token, vision start/end markers and timestamps included; ``{"text": 0}`` is allowed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, NamedTuple, NotRequired, TypedDict

import numpy as np
import torch

from ropeserve.errors import InvalidInput, check_limit
from ropeserve.positions._blocks import (
    IMAGE_TOKEN,
    PAD_BLOCK,
    TEXT_TOKEN,
    VIDEO_TOKEN,
    Blocks,
    PositionPlan,
    frame_strides,
    needs_frame_time,
    plan_positions,
    time_factors,
)
from ropeserve.positions._common import (
    MAX_ELEMENTS,
    PAD_POSITION,
    IntsLike,
    check_element_limit,
    padded_mask,
    require_finite_float,
    require_int,
    require_padding_side,
    segment_row,
    segment_rows,
    tensor_on,
)
from ropeserve.positions.families import DEFAULT_COMPAT, MRopeCompat, MRopeFamily
from ropeserve.positions.mrope import (
    FloatsLike,
    ModelSettings,
    MRopePositions,
    analyse_tokens,
    resolve_settings,
)

__all__ = [
    "ImageSegment",
    "PaddingSide",
    "Segment",
    "TextSegment",
    "VideoSegment",
    "SegmentLayout",
    "mrope_positions_from_segments",
    "mrope_segments_from_tokens",
    "segment_layout",
]


class TextSegment(TypedDict):
    text: int
    """Number of text tokens (>= 0)."""


class ImageSegment(TypedDict):
    image: Sequence[int]
    """``(t, h, w)`` patch grid; ``h`` and ``w`` multiples of the merge size. Never scaled by tokens_per_second."""


class VideoSegment(TypedDict):
    video: Sequence[int]
    """``(t, h, w)`` patch grid."""
    second_per_grid_t: NotRequired[float]
    """Qwen2.5-VL: seconds per temporal patch (``temporal_patch_size / fps``; default 1.0). Other families ignore
    it (their time reaches the model only as timestamp text or not at all)."""
    frame_gaps: NotRequired[int | Sequence[int]]
    """Qwen3-VL / GLM-4V only, required when ``t > 1``: text tokens between consecutive frames' pad runs (the
    ``<vision_end>``, the next timestamp and ``<vision_start>``), one int for every gap or a list of ``t - 1``."""


Segment = TextSegment | ImageSegment | VideoSegment
SegmentRows = Sequence[Sequence[Segment | Mapping[str, object]]]
"""``B`` rows of segments: typed :data:`Segment` dicts or decoded JSON objects (every segment is checked)."""
PaddingSide = Literal["left", "right"]

_OPTIONAL_KEYS: dict[str, frozenset[str]] = {
    "text": frozenset(),
    "image": frozenset(),
    "video": frozenset({"second_per_grid_t", "frame_gaps"}),
}


@dataclass
class _BlockList:
    """Blocks collected segment by segment, one list per row (Python ints; one entry per block, never per token)."""

    token_limit: int
    """Most tokens a row may hold (checked as segments arrive, before any per-frame work)."""
    rows: list[list[int]] = field(default_factory=list)
    """Per row: (row, kind, merged t, merged h, merged w) of each block, flat."""
    seconds: list[list[float]] = field(default_factory=list)
    """Per row: second_per_grid_t of each block (1.0 but for videos)."""
    row_lengths: list[int] = field(default_factory=list)
    frame_times: bool = False
    """Whether some block needs Qwen2.5-VL frame times (:func:`~ropeserve.positions._blocks.needs_frame_time`)."""

    def reserve(self, row: int, tokens: int, field_name: str) -> None:
        """Count ``tokens`` more for ``row``; raise LimitExceeded past the limit."""
        total = self.row_lengths[row] = self.row_lengths[row] + tokens
        if total > self.token_limit:  # the message is only formatted for the error
            check_limit(total, self.token_limit, f"{field_name}: tokens of row {row}", field=field_name)

    def add_text(self, row: int, count: int) -> None:
        if count > 0:
            self.rows[row] += (row, TEXT_TOKEN, 1, 1, count)
            self.seconds[row].append(1.0)

    def add_vision(self, row: int, kind: int, t: int, h: int, w: int, seconds: float) -> None:
        self.rows[row] += (row, kind, t, h, w)
        self.seconds[row].append(seconds)
        self.frame_times |= needs_frame_time(kind, t)


def _segment_kind(segment: object, field_name: str) -> str:
    if type(segment) is not dict and not isinstance(segment, Mapping):
        raise InvalidInput(f"{field_name} must be an object, got {type(segment).__name__}", field=field_name)
    if len(segment) == 1:  # fast path: {"text": n}, {"image": [...]}, {"video": [...]}
        key: str
        (key,) = segment
        if key in _OPTIONAL_KEYS:
            return key
    kinds = [key for key in _OPTIONAL_KEYS if key in segment]
    if len(kinds) != 1:
        raise InvalidInput(
            f"{field_name} must have exactly one of 'text', 'image', 'video'; got keys {sorted(segment)}",
            field=field_name,
        )
    kind = kinds[0]
    extra = set(segment) - {kind} - _OPTIONAL_KEYS[kind]
    if extra:
        raise InvalidInput(f"{field_name}: unexpected keys {sorted(extra)} for a {kind} segment", field=field_name)
    return kind


def _merged_grid(value: object, settings: ModelSettings, field_name: str, kind: str) -> tuple[int, int, int]:
    """Validate a patch grid and return it in LLM tokens ``(t, h / merge, w / merge)``."""
    if (
        type(value) is not list
        and (isinstance(value, str | bytes) or not isinstance(value, Sequence))
        or len(value) != 3
    ):
        raise InvalidInput(f"{field_name}: {kind} must be a list [t, h, w], got {value!r}", field=field_name)
    t, h, w = value
    if not (type(t) is int and type(h) is int and type(w) is int):  # fast path for plain ints
        t, h, w = (require_int(size, field_name) for size in value)
    if min(t, h, w) < 1:
        raise InvalidInput(f"{field_name}: {kind} grid {[t, h, w]} has a zero or negative size", field=field_name)
    merge = settings.spatial_merge_size
    if h % merge or w % merge:
        raise InvalidInput(
            f"{field_name}: {kind} grid {[t, h, w]}: h and w must be multiples of spatial_merge_size {merge}",
            field=field_name,
        )
    t_merge = settings.family.video_temporal_merge_size if kind == "video" else 1
    if t < t_merge:
        raise InvalidInput(
            f"{field_name}: {kind} grid {[t, h, w]}: t must be at least the video temporal_merge_size {t_merge}",
            field=field_name,
        )
    return t // t_merge, h // merge, w // merge + settings.family.temporal_rule.row_end_tokens


def _add_text(
    blocks: _BlockList, segment: Mapping[str, object], settings: ModelSettings, row: int, field_name: str
) -> None:
    value = segment["text"]
    if type(value) is not int and (isinstance(value, bool) or not isinstance(value, int)):
        raise InvalidInput(f"{field_name}: text must be an integer, got {value!r}", field=field_name)
    if value < 0:
        raise InvalidInput(f"{field_name}: text length {value} is negative", field=field_name)
    blocks.reserve(row, value, field_name)
    blocks.add_text(row, value)


def _add_image(
    blocks: _BlockList, segment: Mapping[str, object], settings: ModelSettings, row: int, field_name: str
) -> None:
    t, h, w = _merged_grid(segment["image"], settings, field_name, "image")
    blocks.reserve(row, t * h * w, field_name)
    blocks.add_vision(row, IMAGE_TOKEN, t, h, w, 1.0)


def _frame_gaps(value: object, frames: int, settings: ModelSettings, field_name: str) -> list[int]:
    if value is None:
        if frames > 1:
            raise InvalidInput(
                f"{field_name}: {settings.family.name} places each of the {frames} frames between "
                "timestamp text; give frame_gaps (text tokens between consecutive frames)",
                field=field_name,
            )
        return []
    gaps = [value] * (frames - 1) if isinstance(value, int) and not isinstance(value, bool) else value
    if isinstance(gaps, str | bytes) or not isinstance(gaps, Sequence) or len(gaps) != frames - 1:
        raise InvalidInput(
            f"{field_name}: frame_gaps must be an int or a list of {frames - 1} ints, got {value!r}",
            field=field_name,
        )
    for gap in gaps:
        if isinstance(gap, bool) or not isinstance(gap, int) or gap < 0:
            raise InvalidInput(f"{field_name}: frame_gaps must hold integers >= 0, got {gap!r}", field=field_name)
    return list(gaps)


def _add_video(
    blocks: _BlockList, segment: Mapping[str, object], settings: ModelSettings, row: int, field_name: str
) -> None:
    t, h, w = _merged_grid(segment["video"], settings, field_name, "video")
    rule = settings.family.temporal_rule
    seconds = segment.get("second_per_grid_t")
    seconds = 1.0 if seconds is None else require_finite_float(seconds, field_name, minimum=0.0)
    if not rule.splits_video_frames:
        if "frame_gaps" in segment:
            raise InvalidInput(
                f"{field_name}: frame_gaps applies only to families with one block per frame "
                f"(not {settings.family.name})",
                field=field_name,
            )
        blocks.reserve(row, t * h * w, field_name)
        blocks.add_vision(row, VIDEO_TOKEN, t, h, w, seconds)
        return
    blocks.reserve(row, t * h * w, field_name)  # before the per-frame work below
    gaps = _frame_gaps(segment.get("frame_gaps"), t, settings, field_name)
    blocks.reserve(row, sum(gaps), field_name)
    blocks.add_vision(row, VIDEO_TOKEN, 1, h, w, seconds)
    for gap in gaps:
        blocks.add_text(row, gap)
        blocks.add_vision(row, VIDEO_TOKEN, 1, h, w, seconds)


_SEGMENT_HANDLERS: dict[str, Callable[[_BlockList, Mapping[str, object], ModelSettings, int, str], None]] = {
    "text": _add_text,
    "image": _add_image,
    "video": _add_video,
}


def _collect_blocks(rows: SegmentRows, settings: ModelSettings, token_limit: int) -> _BlockList:
    rows = segment_rows(rows)
    blocks = _BlockList(token_limit, [[] for _ in rows], [[] for _ in rows], [0] * len(rows))
    for row, segments in enumerate(rows):
        segments = segment_row(segments, row)
        for position, segment in enumerate(segments):
            field_name = f"rows[{row}].segments[{position}]"
            kind = _segment_kind(segment, field_name)
            _SEGMENT_HANDLERS[kind](blocks, segment, settings, row, field_name)
    return blocks


def _padded_blocks(
    collected: _BlockList,
    width: int,
    has_padding: bool,
    padding_side: PaddingSide,
    settings: ModelSettings,
) -> Blocks:
    """Blocks tiling ``[B, width]``: each row's blocks plus one padding block on ``padding_side``."""
    flat: list[int] = []
    seconds: list[float] = []
    for row, (blocks, times, length) in enumerate(
        zip(collected.rows, collected.seconds, collected.row_lengths, strict=True)
    ):
        if length < width:
            padding = [row, PAD_BLOCK, 1, 1, width - length]
            blocks, times = (
                (padding + blocks, [1.0, *times]) if padding_side == "left" else (blocks + padding, [*times, 1.0])
            )
        flat += blocks
        seconds += times
    table = np.array(flat, dtype=np.int64).reshape(-1, 5)
    kind, thw = table[:, 1], table[:, 2:]
    time_step, time_scale = _time_steps(kind, seconds, collected.frame_times, settings)
    strides = frame_strides(kind, thw) if settings.family.temporal_rule.frame_stride_all_axes else None
    return Blocks(table[:, 0], kind, thw, time_step, has_padding, time_scale, strides)


def _time_steps(
    kind: np.ndarray, seconds: list[float], frame_times: bool, settings: ModelSettings
) -> tuple[np.ndarray | None, float | None]:
    """Qwen2.5-VL blocks needing frame times: :func:`~ropeserve.positions._blocks.time_factors` (seconds rounded to
    float32, as the processor's tensor holds them); ``(None, None)`` otherwise."""
    if not (frame_times and settings.family.temporal_rule.scales_by_seconds):
        return None, None
    assert settings.tokens_per_second is not None
    return time_factors(kind, np.array(seconds), np.float32, settings.tokens_per_second, settings.compat)


def _row_mask(
    row_lengths: np.ndarray, width: int, padding_side: PaddingSide, device: torch.device | str | None
) -> torch.Tensor:
    """``[B, width]`` bool, real tokens (``row_lengths`` ``[B]`` of each row) on the right or left."""
    if not (row_lengths < width).any():
        mask = np.empty((row_lengths.size, width), dtype=bool)
        mask.fill(True)  # np.ones costs twice as much
    else:
        mask = padded_mask(row_lengths, width, padding_side)
    return tensor_on(mask, device)


class SegmentLayout(NamedTuple):
    """Segment rows laid out (:func:`segment_layout`): the position plan and what the attention mask needs."""

    plan: PositionPlan
    row_lengths: np.ndarray  # [B] int64 real tokens per row
    width: int
    padding_side: PaddingSide

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """``position_ids`` ``[3, B, T]`` and ``mrope_position_deltas`` ``[B, 1]``, int64 arrays (no mask: what a
        JSON answer carries)."""
        return self.plan.arrays()

    def positions(self, device: torch.device | str | None = None) -> MRopePositions:
        """The tensors on ``device`` (None: the CPU), the attention mask included."""
        position_ids, deltas = self.plan.expand(device)
        return MRopePositions(position_ids, deltas, _row_mask(self.row_lengths, self.width, self.padding_side, device))


def segment_layout(
    rows: SegmentRows,
    *,
    family: str | MRopeFamily,
    spatial_merge_size: int | None = None,
    tokens_per_second: float | None = None,
    compat: str | MRopeCompat = DEFAULT_COMPAT,
    padding_side: PaddingSide = "right",
    fill_value: int = PAD_POSITION,
    max_tokens: int | None = None,
) -> SegmentLayout:
    """Check and lay out segment rows: :func:`mrope_positions_from_segments` without building tensors.

    Raises what :func:`mrope_positions_from_segments` raises.
    """
    require_padding_side(padding_side)
    settings = resolve_settings(family, spatial_merge_size, tokens_per_second, compat)
    collected = _collect_blocks(rows, settings, MAX_ELEMENTS if max_tokens is None else min(max_tokens, MAX_ELEMENTS))
    row_lengths = collected.row_lengths
    width = max(row_lengths) if row_lengths else 0
    check_element_limit(len(rows) * width, max_tokens, "M-RoPE position slots", "rows")
    has_padding = bool(row_lengths) and min(row_lengths) < width
    blocks = _padded_blocks(collected, width, has_padding, padding_side, settings)
    lengths = np.array(row_lengths, dtype=np.int64)
    plan = plan_positions(blocks, lengths, width, settings.continue_after_max, fill_value)
    return SegmentLayout(plan, lengths, width, padding_side)


def mrope_positions_from_segments(
    rows: SegmentRows,
    *,
    family: str | MRopeFamily,
    spatial_merge_size: int | None = None,
    tokens_per_second: float | None = None,
    compat: str | MRopeCompat = DEFAULT_COMPAT,
    padding_side: PaddingSide = "right",
    fill_value: int = PAD_POSITION,
    max_tokens: int | None = None,
    device: torch.device | str | None = None,
) -> MRopePositions:
    """Prefill M-RoPE positions from a segment list per row.

    Rows of different lengths are padded to the longest on ``padding_side`` with ``fill_value``. Gives the same
    positions as :func:`mrope_positions_from_tokens` on the equivalent token sequence.

    Args:
        rows: ``B`` lists of :data:`Segment` dicts.
        max_tokens: optional limit on ``B * T`` (raises ``LimitExceeded`` before any tensor is built).

    Returns:
        :class:`MRopePositions`: ``position_ids`` ``[3, B, T]``, ``mrope_position_deltas`` ``[B, 1]``,
        ``attention_mask`` ``[B, T]``.

    Raises:
        InvalidInput with ``field="rows[b].segments[i]"`` for a malformed segment, a negative text length, an empty
        grid, a grid not divisible by the merge size, or misplaced/missing ``frame_gaps``.
    """
    layout = segment_layout(
        rows,
        family=family,
        spatial_merge_size=spatial_merge_size,
        tokens_per_second=tokens_per_second,
        compat=compat,
        padding_side=padding_side,
        fill_value=fill_value,
        max_tokens=max_tokens,
    )
    return layout.positions(device)


def mrope_segments_from_tokens(
    *,
    family: str | MRopeFamily,
    mm_token_type_ids: IntsLike | None = None,
    input_ids: IntsLike | None = None,
    image_grid_thw: IntsLike | None = None,
    video_grid_thw: IntsLike | None = None,
    second_per_grid_ts: FloatsLike | None = None,
    attention_mask: IntsLike | None = None,
    image_token_id: int | None = None,
    video_token_id: int | None = None,
    spatial_merge_size: int | None = None,
) -> list[list[Segment]]:
    """The segment lists equivalent to token-level input (same arguments and validation as
    :func:`mrope_positions_from_tokens`). Padding is dropped; Qwen3-VL / GLM-4V videos come out as one
    ``{"video": [1, h, w]}`` per frame with the timestamp text between them as text segments."""
    settings = resolve_settings(family, spatial_merge_size, None, DEFAULT_COMPAT)
    analysis = analyse_tokens(
        settings,
        mm_token_type_ids=mm_token_type_ids,
        input_ids=input_ids,
        image_grid_thw=image_grid_thw,
        video_grid_thw=video_grid_thw,
        second_per_grid_ts=second_per_grid_ts,
        attention_mask=attention_mask,
        image_token_id=image_token_id,
        video_token_id=video_token_id,
    )
    rows: list[list[Segment]] = [[] for _ in range(analysis.mask.shape[0])]
    blocks = analysis.blocks
    merge = analysis.spatial_merge_size
    t_merge = settings.family.video_temporal_merge_size  # a video's t comes back as t_merge * its LLM frames
    row_end = settings.family.temporal_rule.row_end_tokens
    seconds = analysis.second_per_grid_t.tolist() if analysis.second_per_grid_t is not None else None
    for block, (row, kind, (t, h, w)) in enumerate(
        zip(blocks.row.tolist(), blocks.kind.tolist(), blocks.thw.tolist(), strict=True)
    ):
        if kind == TEXT_TOKEN:
            rows[row].append(TextSegment(text=w))
        elif kind != PAD_BLOCK:
            patch_grid = [t * t_merge if kind == VIDEO_TOKEN else t, h * merge, (w - row_end) * merge]
            rows[row].append(_vision_segment(kind, patch_grid, None if seconds is None else seconds[block]))
    return rows


def _vision_segment(kind: int, grid: list[int], seconds: float | None) -> Segment:
    if kind == IMAGE_TOKEN:
        return ImageSegment(image=grid)
    video = VideoSegment(video=grid)
    if seconds is not None:
        video["second_per_grid_t"] = seconds
    return video
