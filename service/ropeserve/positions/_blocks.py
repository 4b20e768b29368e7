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

Speed: the work per token is three passes over the ``[3, B * T]`` output (a zero fill and two running sums);
everything else is per block or per line, with a fixed number of batched tensor operations and no Python loop.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ropeserve.positions.families import MRopeCompat

TEXT_TOKEN, IMAGE_TOKEN, VIDEO_TOKEN = 0, 1, 2
"""Values of ``mm_token_type_ids`` (the transformers processor's convention; vision start/end tokens are text)."""
PAD_BLOCK = 3
"""Internal kind of a padding block."""

KIND_NAMES = {TEXT_TOKEN: "text", IMAGE_TOKEN: "image", VIDEO_TOKEN: "video", PAD_BLOCK: "padding"}

# Per kind, how T, H, W advance from one token of a line to the next.
_LINE_STEP = torch.tensor([[1, 1, 1], [0, 0, 1], [0, 0, 1], [0, 0, 0]], dtype=torch.long)


@dataclass(frozen=True)
class Blocks:
    """One entry per block, in row-major order; the blocks of row ``b`` tile that row of the output."""

    row: torch.Tensor  # [G] int64, non-decreasing
    kind: torch.Tensor  # [G] int64: TEXT_TOKEN, IMAGE_TOKEN, VIDEO_TOKEN or PAD_BLOCK
    thw: torch.Tensor  # [G, 3] int64 merged (t, h, w); text and padding: (1, 1, length)
    time_step: torch.Tensor | None  # [G] float T step per frame; None when every step is exactly 1
    has_padding: bool


def _temporal_offsets(frames: torch.Tensor, time_step: torch.Tensor | None) -> torch.Tensor:
    """``floor(frame * step)`` exactly as transformers: a float multiply in the step's dtype, then ``.long()``."""
    if time_step is None:
        return frames
    return (frames.to(time_step.dtype) * time_step).long()


def _extents(blocks: Blocks) -> torch.Tensor:
    """``[G]`` largest position of each block relative to its start (text: length - 1)."""
    if blocks.time_step is None:
        return (blocks.thw - 1).amax(dim=1)
    last_frame = _temporal_offsets(blocks.thw[:, 0] - 1, blocks.time_step)
    return torch.maximum(last_frame, blocks.thw[:, 1:].amax(dim=1) - 1)


def _advance_transformers5(blocks: Blocks, extents: torch.Tensor) -> torch.Tensor:
    # Text (1, 1, n) advances by n; vision by max(h, w): the temporal extent is ignored.
    return blocks.thw[:, 1:].amax(dim=1)


def _advance_transformers4(blocks: Blocks, extents: torch.Tensor) -> torch.Tensor:
    return extents + 1


ADVANCE_RULES: dict[MRopeCompat, Callable[[Blocks, torch.Tensor], torch.Tensor]] = {
    MRopeCompat.TRANSFORMERS5: _advance_transformers5,
    MRopeCompat.TRANSFORMERS4: _advance_transformers4,
}
"""compat -> ``[G]`` distance from a block's start to the next block's start."""


def _starts(blocks: Blocks, advance: torch.Tensor, num_rows: int) -> torch.Tensor:
    """``[G]`` start of each block: the exclusive running sum of ``advance``, restarted at every row."""
    global_start = advance.cumsum(0) - advance
    # Every row has at least one block (padding included), so the initial value never survives.
    row_base = torch.full((num_rows,), torch.iinfo(torch.long).max, dtype=torch.long, device=advance.device)
    row_base = row_base.scatter_reduce(0, blocks.row, global_start, reduce="amin")
    return global_start - row_base.index_select(0, blocks.row)


def _line_values(
    blocks: Blocks, starts: torch.Tensor, fill_value: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per line: first token's ``[3, Lc]`` T/H/W, ``[3, Lc]`` step along the line, ``[Lc]`` length."""
    lines_per_block = blocks.thw[:, 0] * blocks.thw[:, 1]
    line_block = torch.repeat_interleave(lines_per_block)
    first_line = lines_per_block.cumsum(0) - lines_per_block
    # One gather for everything a line needs from its block: h, w, start, kind, first line.
    per_line = torch.stack([blocks.thw[:, 1], blocks.thw[:, 2], starts, blocks.kind, first_line]).index_select(
        1, line_block
    )
    rows_per_frame, length, start, kind, first = per_line.unbind(dim=0)
    line_in_block = torch.arange(line_block.numel(), device=start.device) - first
    frame = torch.div(line_in_block, rows_per_frame, rounding_mode="floor")
    row_in_frame = line_in_block - frame * rows_per_frame
    step = None if blocks.time_step is None else blocks.time_step.index_select(0, line_block)
    values = torch.stack([start + _temporal_offsets(frame, step), start + row_in_frame, start])
    if blocks.has_padding:
        values.masked_fill_(kind == PAD_BLOCK, fill_value)
    steps = _LINE_STEP.to(start.device).index_select(0, kind).T
    return values, steps, length


def _expand_lines(values: torch.Tensor, steps: torch.Tensor, lengths: torch.Tensor, total: int) -> torch.Tensor:
    """``[3, total]`` int64 token positions ``values[:, l] + steps[:, l] * column`` of lines tiling ``total`` tokens.

    Written as a second-order running sum: the step of each token is a running sum of step changes placed at line
    starts, and each line start also carries the jump from the previous token's position.
    """
    first_token = lengths.cumsum(0) - lengths
    # The previous line's last position and step (zero before the first line).
    previous_end = torch.zeros_like(values)
    previous_end[:, 1:] = (values + steps * (lengths - 1))[:, :-1]
    previous_step = torch.zeros_like(steps)
    previous_step[:, 1:] = steps[:, :-1]
    positions = torch.zeros((3, total), dtype=torch.long, device=values.device)
    positions.index_copy_(1, first_token, steps - previous_step)
    positions.cumsum_(dim=1)
    positions.index_add_(1, first_token, values - previous_end - steps)
    return positions.cumsum_(dim=1)


@dataclass(frozen=True)
class PositionPlan:
    """Everything but the per-token expansion: small tensors (per row, per line).

    Build it under ``torch.inference_mode()`` (it cuts the per-operation overhead of these many small operations
    by about a fifth) and call :meth:`expand` outside it, so the returned tensors are ordinary ones.
    """

    num_rows: int
    width: int
    deltas: torch.Tensor  # [B, 1] int64
    line_values: torch.Tensor  # [3, Lc] int64
    line_steps: torch.Tensor  # [3, Lc] int64
    line_lengths: torch.Tensor  # [Lc] int64

    def expand(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``position_ids`` ``[3, B, width]`` int64 and ``mrope_position_deltas`` ``[B, 1]`` int64."""
        total = self.num_rows * self.width
        if total == 0:
            empty = torch.zeros((3, self.num_rows, self.width), dtype=torch.long, device=self.deltas.device)
            return empty, self.deltas.clone()
        positions = _expand_lines(self.line_values, self.line_steps, self.line_lengths, total)
        return positions.view(3, self.num_rows, self.width), self.deltas.clone()


def plan_positions(
    blocks: Blocks,
    row_lengths: torch.Tensor,
    width: int,
    compat: MRopeCompat,
    fill_value: int,
) -> PositionPlan:
    """Lay the blocks out: starts, deltas and the lines to expand into ``[3, B, width]`` positions.

    ``row_lengths`` ``[B]`` counts each row's real (non-padding) tokens; a row without any has delta 0.
    """
    num_rows = row_lengths.numel()
    device = row_lengths.device
    if num_rows * width == 0:
        none = torch.zeros((3, 0), dtype=torch.long, device=device)
        deltas = torch.zeros((num_rows, 1), dtype=torch.long, device=device)
        return PositionPlan(num_rows, width, deltas, none, none, none[0])
    extents = _extents(blocks)
    advance = ADVANCE_RULES[compat](blocks, extents)
    if blocks.has_padding:
        is_padding = blocks.kind == PAD_BLOCK
        advance = advance.masked_fill(is_padding, 0)
        extents = extents.masked_fill(is_padding, -1)  # a padding block raises no row maximum
    starts = _starts(blocks, advance, num_rows)
    row_max = torch.full((num_rows,), -1, dtype=torch.long, device=device)
    row_max = row_max.scatter_reduce(0, blocks.row, starts + extents, reduce="amax")
    deltas = (row_max + 1 - row_lengths)[:, None]
    values, steps, lengths = _line_values(blocks, starts, fill_value)
    return PositionPlan(num_rows, width, deltas, values, steps, lengths)
