"""The M-RoPE layout engine: blocks -> ``[3, B, T]`` positions and ``[B, 1]`` deltas (shared by both input forms).

Vocabulary:
    block   a maximal run of text tokens, one image, one video (Qwen2/2.5-VL), one video frame (Qwen3-VL, GLM-4V)
            or a run of padding. The blocks of all rows, in order, tile the flat ``[B * T]`` output exactly.
    start   the position a block begins at; every axis of the block is offset by it.
    extent  the block's largest position minus its start.
    line    a run of consecutive tokens of one block along which only the column advances: one row of one frame
            of a vision block (``w`` tokens), or a whole text or padding block.

A text block of ``n`` tokens is stored as the grid ``(1, 1, n)`` and gets ``start + k`` on all three axes; a vision
block of merged grid ``(t, h, w)`` is ordered frame-major, then row, then column, and gets
``T = start + floor(frame * step)``, ``H = start + row``, ``W = start + column`` (step = 1 except Qwen2.5-VL
videos); padding gets the fill value. Each block starts where the previous one of its row ends, as the
:class:`~ropeserve.positions.families.MRopeCompat` rule says.

Speed: the layout runs in numpy on the CPU, where a small operation costs a fraction of a torch one (the block and
line arrays are small, so the number of operations sets the time). The work per token is two passes over the
``[3, B * T]`` output: a repeat of each line's step (with the jump from the previous line written at its first token)
and one running sum in torch (several times faster than numpy's). Everything else is per block or per line, with a
fixed number of batched operations and no Python loop.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from ropeserve.errors import InvalidInput
from ropeserve.positions._common import tensor_on
from ropeserve.positions.families import COMPAT_RULES, MRopeCompat

TEXT_TOKEN, IMAGE_TOKEN, VIDEO_TOKEN = 0, 1, 2
"""Values of ``mm_token_type_ids`` (the transformers processor's convention; vision start/end tokens are text)."""
PAD_BLOCK = 3
"""Internal kind of a padding block."""

KIND_NAMES = {TEXT_TOKEN: "text", IMAGE_TOKEN: "image", VIDEO_TOKEN: "video", PAD_BLOCK: "padding"}

POSITION_CEILING = 2**62
"""Largest M-RoPE position (and temporal offset) built; the float64 checks against it keep a margin to int64."""

# [axis, kind]: how T, H, W advance from one token of a line to the next (text, image, video, padding).
_LINE_STEP = np.array([[1, 0, 0, 0], [1, 0, 0, 0], [1, 1, 1, 0]], dtype=np.int64)


@dataclass(frozen=True)
class Blocks:
    """One entry per block, in row-major order; the blocks of row ``b`` tile that row of the output."""

    row: np.ndarray  # [G] int64, non-decreasing; every row has at least one block
    kind: np.ndarray  # [G] int64: TEXT_TOKEN, IMAGE_TOKEN, VIDEO_TOKEN or PAD_BLOCK
    thw: np.ndarray  # [G, 3] int64 merged (t, h, w); text and padding: (1, 1, length)
    time_step: np.ndarray | None  # [G] float T step per frame; None when every step is exactly 1
    has_padding: bool
    time_scale: float | None = None
    """Second float multiply of the frame time (vLLM / SGLang: tokens_per_second); None: none."""
    frame_stride: np.ndarray | None = None
    """[G] int64 offset of each frame on all three axes (HY-V4-VL vision: ``max(h, w)``, 0 elsewhere); None: none."""


def time_factors(
    kind: np.ndarray, seconds: torch.Tensor, tokens_per_second: float, compat: MRopeCompat
) -> tuple[np.ndarray, float | None]:
    """Qwen2.5-VL: ``([G] step, scale)`` with ``T offset of frame k = floor((k * step) * scale)`` (no ``* scale``
    when None), computed in torch as the reproduced implementation does.

    ``seconds`` ``[G]`` float tensor: each video block's ``second_per_grid_t`` (other blocks: any value).
    transformers: step ``tokens_per_second * second_per_grid_t`` (rounded to the tensor's dtype first), 1 for
    images; vLLM / SGLang: step ``second_per_grid_t`` then ``* tokens_per_second``, 0 for images.
    """
    rule = COMPAT_RULES[compat]
    is_video = torch.from_numpy(kind == VIDEO_TOKEN)
    other = torch.where(
        torch.from_numpy(kind == IMAGE_TOKEN),
        torch.full_like(seconds, rule.image_time_step),
        torch.ones_like(seconds),
    )
    if rule.seconds_first:
        return torch.where(is_video, seconds, other).numpy(), tokens_per_second
    return torch.where(is_video, seconds * tokens_per_second, other).numpy(), None


def frame_strides(kind: np.ndarray, thw: np.ndarray) -> np.ndarray:
    """HY-V4-VL: ``[G]`` per-frame offset on all axes, ``max(h, w)`` of vision blocks (w with the row-end token),
    0 for text and padding."""
    is_vision = (kind == IMAGE_TOKEN) | (kind == VIDEO_TOKEN)
    return np.where(is_vision, thw[:, 1:].max(axis=1), 0)


MAX_TIME_OFFSET = 2**53
"""Largest temporal offset a video frame may reach (beyond it float time stops being exact, and far beyond it
``.long()`` would wrap)."""


def _scaled_frames(frames: np.ndarray, time_step: np.ndarray, time_scale: float | None) -> torch.Tensor:
    """``(frame * step) * scale`` as float tensors: torch multiplies in the step's dtype (the scale a Python float)."""
    step = torch.from_numpy(time_step)
    scaled = torch.from_numpy(frames).to(step.dtype) * step
    return scaled if time_scale is None else scaled * time_scale


def _temporal_offsets(frames: np.ndarray, time_step: np.ndarray | None, time_scale: float | None = None) -> np.ndarray:
    """``floor((frame * step) * scale)`` exactly as the reproduced code, then ``.long()`` (checked by
    :func:`_extents` on each block's last frame first)."""
    if time_step is None:
        return frames
    return _scaled_frames(frames, time_step, time_scale).long().numpy()


def _last_frame_offsets(blocks: Blocks) -> np.ndarray:
    """``[G]`` temporal offset of each block's last frame; raises when one is not finite or past MAX_TIME_OFFSET
    (every frame's offset is at most the last one's: steps are >= 0)."""
    assert blocks.time_step is not None
    scaled = _scaled_frames(blocks.thw[:, 0] - 1, blocks.time_step, blocks.time_scale)
    bad = ~torch.isfinite(scaled) | (scaled > MAX_TIME_OFFSET)
    if bool(bad.any()):
        raise InvalidInput(
            f"a video's temporal position offset (frame × tokens_per_second × second_per_grid_t) is "
            f"{float(scaled[bad][0])}; it must be finite and at most 2**53",
            field="second_per_grid_t",
        )
    return scaled.long().numpy()


def _extents(blocks: Blocks) -> np.ndarray:
    """``[G]`` largest position of each block relative to its start (text: length - 1)."""
    extents: np.ndarray  # numpy types reductions and ufuncs over untyped-dtype arrays as Any
    if blocks.frame_stride is not None:
        strided = (blocks.thw[:, 0] - 1) * blocks.frame_stride + blocks.thw[:, 1:].max(axis=1) - 1
        extents = np.maximum(blocks.thw.max(axis=1) - 1, strided)
    elif blocks.time_step is None:
        extents = blocks.thw.max(axis=1) - 1
    else:
        last_frame = _last_frame_offsets(blocks)
        extents = np.maximum(last_frame, blocks.thw[:, 1:].max(axis=1) - 1)
    return extents


def _advance_transformers5(blocks: Blocks, extents: np.ndarray) -> np.ndarray:
    # Text (1, 1, n) advances by n; vision by max(h, w): the temporal extent is ignored.
    advance: np.ndarray = blocks.thw[:, 1:].max(axis=1)
    return advance


def _advance_transformers4(blocks: Blocks, extents: np.ndarray) -> np.ndarray:
    return extents + 1


ADVANCE_RULES: dict[bool, Callable[[Blocks, np.ndarray], np.ndarray]] = {
    False: _advance_transformers5,
    True: _advance_transformers4,
}
"""``CompatRule.next_start_after_max`` -> ``[G]`` distance from a block's start to the next block's start."""


def _starts(advance: np.ndarray, row: np.ndarray, row_first_block: np.ndarray) -> np.ndarray:
    """``[G]`` start of each block: the exclusive running sum of ``advance``, restarted at every row."""
    global_start = np.cumsum(advance) - advance
    starts: np.ndarray = global_start - global_start[row_first_block][row]
    return starts


def _line_values(blocks: Blocks, starts: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per line: first token's ``[3, Lc]`` T/H/W, ``[3, Lc]`` step along the line, ``[Lc]`` length."""
    frames, rows, columns = blocks.thw.T
    lines_per_block = frames * rows
    line_ends = np.cumsum(lines_per_block)
    per_block = np.vstack([starts, rows, columns, line_ends - lines_per_block, _LINE_STEP[:, blocks.kind]])
    per_line = np.repeat(per_block, lines_per_block, axis=1)  # one batched gather for all of the above
    start, rows_per_frame, length, first_line = per_line[:4]
    frame, row_in_frame = np.divmod(np.arange(line_ends[-1]) - first_line, rows_per_frame)
    step = None if blocks.time_step is None else np.repeat(blocks.time_step, lines_per_block)
    values = np.stack([start + _temporal_offsets(frame, step, blocks.time_scale), start + row_in_frame, start])
    if blocks.frame_stride is not None:
        offset = frame * np.repeat(blocks.frame_stride, lines_per_block)  # text/padding lines: frame 0
        values[0] = start + offset
        values[1:] += offset
    return values, per_line[4:], length


def _expand_lines(values: np.ndarray, steps: np.ndarray, lengths: np.ndarray) -> torch.Tensor:
    """``[3, total]`` int64 token positions ``values[:, l] + steps[:, l] * column`` of lines tiling ``total`` tokens.

    Written as one running sum of per-token differences: each line's step, except at the line's first token,
    which carries the jump from the previous line's last position (int64 wrap-around cancels out in the sum).
    """
    first_token = np.cumsum(lengths) - lengths
    jumps = values.copy()
    jumps[:, 1:] -= (values + steps * (lengths - 1))[:, :-1]
    differences = np.repeat(steps, lengths, axis=1)
    differences[:, first_token] = jumps
    return torch.from_numpy(differences).cumsum_(dim=1)


@dataclass(frozen=True)
class PositionPlan:
    """Everything but the per-token expansion: small arrays (per row, per line)."""

    num_rows: int
    width: int
    deltas: np.ndarray  # [B, 1] int64
    line_values: np.ndarray  # [3, Lc] int64
    line_steps: np.ndarray  # [3, Lc] int64
    line_lengths: np.ndarray  # [Lc] int64

    def expand(self, device: torch.device | str | None) -> tuple[torch.Tensor, torch.Tensor]:
        """``position_ids`` ``[3, B, width]`` int64 and ``mrope_position_deltas`` ``[B, 1]`` int64 on ``device``
        (None: the CPU)."""
        if self.num_rows * self.width == 0:
            positions = torch.zeros((3, self.num_rows, self.width), dtype=torch.long)
        else:
            positions = _expand_lines(self.line_values, self.line_steps, self.line_lengths)
        position_ids = positions.view(3, self.num_rows, self.width)
        return (position_ids if device is None else position_ids.to(device)), tensor_on(self.deltas, device)


def plan_positions(
    blocks: Blocks,
    row_lengths: np.ndarray,
    width: int,
    continue_after_max: bool,
    fill_value: int,
) -> PositionPlan:
    """Lay the blocks out: starts, deltas and the lines to expand into ``[3, B, width]`` positions.

    ``row_lengths`` ``[B]`` counts each row's real (non-padding) tokens; a row without any has delta 0.
    ``continue_after_max``: the block after a vision block starts at its largest position + 1 (else at
    ``start + max(h, w)``).
    """
    num_rows = row_lengths.size
    if num_rows * width == 0:
        none = np.zeros((3, 0), dtype=np.int64)
        return PositionPlan(num_rows, width, np.zeros((num_rows, 1), dtype=np.int64), none, none, none[0])
    extents = _extents(blocks)
    advance = ADVANCE_RULES[continue_after_max](blocks, extents)
    if float(advance.sum(dtype=np.float64)) + float(extents.max()) > POSITION_CEILING:  # before any int64 sum
        raise InvalidInput(
            f"M-RoPE positions would pass {POSITION_CEILING}: tokens_per_second or second_per_grid_t is too large",
            field="second_per_grid_t",
        )
    is_padding = blocks.kind == PAD_BLOCK if blocks.has_padding else None
    if is_padding is not None:
        advance = np.where(is_padding, 0, advance)
        extents = np.where(is_padding, -1, extents)  # a padding block raises no row maximum
    row_first_block = np.searchsorted(blocks.row, np.arange(num_rows))
    starts = _starts(advance, blocks.row, row_first_block)
    row_max = np.maximum.reduceat(starts + extents, row_first_block)
    deltas = (row_max + 1 - row_lengths)[:, None]
    if is_padding is not None:
        starts[is_padding] = fill_value  # a padding block is one line at the fill value, which does not advance
    values, steps, lengths = _line_values(blocks, starts)
    return PositionPlan(num_rows, width, deltas, values, steps, lengths)
