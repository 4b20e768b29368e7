"""The M-RoPE layout engine: blocks -> ``[3, B, T]`` positions and ``[B, 1]`` deltas (shared by both input forms).

Vocabulary:
    block   a maximal run of text tokens, one image, one video (Qwen2/2.5-VL), one video frame (Qwen3-VL, GLM-4V)
            or a run of padding. The blocks of all rows, in order, tile the flat ``[B * T]`` output exactly.
    start   the position a block begins at; every axis of the block is offset by it.
    reach   the block's largest position minus its start, plus 1 (a text block's length).
    line    a run of consecutive tokens of one block along which only the column advances: one row of one frame
            of a vision block (``w`` tokens), or a whole text or padding block.

A text block of ``n`` tokens is stored as the grid ``(1, 1, n)`` and gets ``start + k`` on all three axes; a vision
block of merged grid ``(t, h, w)`` is ordered frame-major, then row, then column, and gets
``T = start + floor(frame * step)``, ``H = start + row``, ``W = start + column`` (step = 1 except Qwen2.5-VL
videos); padding gets the fill value. Each block starts where the previous one of its row ends, as the
:class:`~ropeserve.positions.families.MRopeCompat` rule says.

Speed: the layout runs in numpy on the CPU, frame times included (numpy 2's float32/float64 multiplies and its cast
to int64 give torch's results bit for bit; the tests compare them). The block and line arrays hold a few entries, so
the number of operations sets the time (a numpy call on them costs a fraction of a microsecond, a torch one several):
a fixed number of batched operations and no Python loop, in their cheapest forms (``np.add.accumulate`` costs half
of ``cumsum``'s call), and nothing an input does not need (frame times without a video or a multi-frame block, the
per-row restart of the running start for one row, the position ceiling check without frame times). The work per
token: a few blocks (:data:`PATTERN_EXPANSION_BLOCKS`) without frame times or strides are written as each block's
start plus its pattern (its own lines expanded at start 0, cached read-only by shape), with no line arrays at all;
else up to :data:`DIRECT_EXPANSION_TOKENS` tokens, each position written directly from its line's first position,
step and column; beyond, a repeat of each line's step (with the jump from the previous line written at its first
token) and one running sum in torch, in place: one ``[3, B * T]`` temporary where the direct formula needs three,
which fresh memory made over 20 times slower at 26k tokens here. The issue-15 request (one row of text, a 1x8x8 image,
text) takes three blocks through the patterns: in a tight loop on a loaded 2-core machine 29 us in
:func:`~ropeserve.positions.segments.mrope_positions_from_segments` and 22 us for the JSON route's
``segment_layout(...).arrays()`` (38 and 30 us through the lines).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple, overload

import numpy as np
import torch

from ropeserve.errors import InvalidInput
from ropeserve.positions._common import tensor_on
from ropeserve.positions._patterns import pattern
from ropeserve.positions.families import COMPAT_RULES, MRopeCompat

TEXT_TOKEN, IMAGE_TOKEN, VIDEO_TOKEN = 0, 1, 2
"""Values of ``mm_token_type_ids`` (the transformers processor's convention; vision start/end tokens are text)."""
PAD_BLOCK = 3
"""Internal kind of a padding block."""

KIND_NAMES = {TEXT_TOKEN: "text", IMAGE_TOKEN: "image", VIDEO_TOKEN: "video", PAD_BLOCK: "padding"}

POSITION_CEILING = 2**62
"""Largest M-RoPE position (and temporal offset) built; the float64 checks against it keep a margin to int64."""

_running_sum = np.add.accumulate
"""Inclusive running sum of a 1-D array (``cumsum``, at half its call cost: the block and line arrays are small)."""

# [axis, kind]: how T, H, W advance from one token of a line to the next (text, image, video, padding).
_LINE_STEP = np.array([[1, 0, 0, 0], [1, 0, 0, 0], [1, 1, 1, 0]], dtype=np.int64)


class Blocks(NamedTuple):
    """One entry per block, in row-major order; the blocks of row ``b`` tile that row of the output."""

    row: np.ndarray  # [G] int64, non-decreasing; every row has at least one block
    kind: np.ndarray  # [G] int64: TEXT_TOKEN, IMAGE_TOKEN, VIDEO_TOKEN or PAD_BLOCK
    thw: np.ndarray  # [G, 3] int64 merged (t, h, w); text and padding: (1, 1, length)
    time_step: np.ndarray | None  # [G] float T step per frame; None when every frame's offset is its index
    has_padding: bool
    time_scale: float | None = None
    """Second float multiply of the frame time (vLLM / SGLang: tokens_per_second); None: none."""
    frame_stride: np.ndarray | None = None
    """[G] int64 offset of each frame on all three axes (HY-V4-VL vision: ``max(h, w)``, 0 elsewhere); None: none."""
    narrow: torch.dtype | None = None
    """float16 / bfloat16: the dtype of the caller's seconds tensor, to which torch rounds every frame-time product
    (``time_step`` then holds its values in float32); None: the products stay in ``time_step``'s dtype."""


@overload
def needs_frame_time(kind: int, frames: int) -> bool: ...


@overload
def needs_frame_time(kind: np.ndarray, frames: np.ndarray) -> np.ndarray: ...


def needs_frame_time(kind: int | np.ndarray, frames: int | np.ndarray) -> bool | np.ndarray:
    """Whether a block (ints; arrays: each block) needs a Qwen2.5-VL frame time: a video (its step is checked even
    with one frame) or a block of several frames. Without any, :func:`time_factors` is not needed: each block's only
    frame is frame 0, whose offset is 0 whatever the step."""
    return (kind == VIDEO_TOKEN) | (frames > 1)


def rounded_to(values: np.ndarray, narrow: torch.dtype | None) -> np.ndarray:
    """float32 ``values`` rounded to ``narrow`` (float16 / bfloat16) and held in float32 again, as torch stores a
    product of ``narrow`` tensors (computed in float32) in their dtype; ``values`` itself when None."""
    if narrow is None:
        return values
    return torch.from_numpy(values).to(narrow).float().numpy()


def time_factors(
    kind: np.ndarray,
    seconds: np.ndarray,
    dtype: type[np.floating],
    tokens_per_second: float,
    compat: MRopeCompat,
    narrow: torch.dtype | None = None,
) -> tuple[np.ndarray, float | None]:
    """Qwen2.5-VL: ``([G] step, scale)`` with ``T offset of frame k = floor((k * step) * scale)`` (no ``* scale``
    when None), in ``dtype`` (float32, or float64 for float64 seconds) with one rounding per multiply, as the
    reproduced torch code computes it.

    ``kind`` ``[G]`` int64: each block's kind. ``seconds`` ``[G]`` float: each video block's ``second_per_grid_t``
    (other blocks: any value), rounded to ``dtype`` here; with ``narrow`` (``dtype`` float32), each product is rounded
    to that dtype as torch does for a float16 / bfloat16 seconds tensor. transformers: step ``tokens_per_second *
    second_per_grid_t`` (rounded to ``dtype`` first), 1 for images; vLLM / SGLang: step ``second_per_grid_t`` then
    ``* tokens_per_second``, 0 for images.
    """
    rule = COMPAT_RULES[compat]
    is_video = kind == VIDEO_TOKEN
    with np.errstate(over="ignore"):  # past the float range: inf, refused by _last_frame_offsets
        seconds = seconds.astype(dtype, copy=False)
        other = np.where(kind == IMAGE_TOKEN, rule.image_time_step, 1.0).astype(dtype)
        if rule.seconds_first:
            return np.where(is_video, seconds, other), tokens_per_second
        return np.where(is_video, rounded_to(seconds * tokens_per_second, narrow), other), None


def frame_strides(kind: np.ndarray, thw: np.ndarray) -> np.ndarray:
    """HY-V4-VL: ``[G]`` per-frame offset on all axes, ``max(h, w)`` of vision blocks (w with the row-end token),
    0 for text and padding."""
    is_vision = (kind == IMAGE_TOKEN) | (kind == VIDEO_TOKEN)
    return np.where(is_vision, np.maximum(thw[:, 1], thw[:, 2]), 0)


MAX_TIME_OFFSET = 2**53
"""Largest temporal offset a video frame may reach (beyond it float time stops being exact, and far beyond it
``.long()`` would wrap)."""


def _scaled_frames(
    frames: np.ndarray, time_step: np.ndarray, time_scale: float | None, narrow: torch.dtype | None = None
) -> np.ndarray:
    """``(frame * step) * scale`` in the step's float dtype, as torch computes it: the frame converted to that dtype,
    the Python-float scale rounded to it, one IEEE rounding per multiply (numpy 2 and torch agree bit for bit, see
    the tests); with ``narrow``, the frame and each product rounded to it as well (:attr:`Blocks.narrow`). Overflow
    gives inf and ``0 * inf`` NaN, silently: :func:`_last_frame_offsets` refuses both."""
    scaled: np.ndarray  # numpy types ufuncs over untyped-dtype arrays as Any
    with np.errstate(over="ignore", invalid="ignore"):
        scaled = rounded_to(rounded_to(frames.astype(time_step.dtype), narrow) * time_step, narrow)
        if time_scale is not None:
            scaled = rounded_to(scaled * time_scale, narrow)
    return scaled


def _temporal_offsets(
    frames: np.ndarray,
    time_step: np.ndarray | None,
    time_scale: float | None = None,
    narrow: torch.dtype | None = None,
) -> np.ndarray:
    """``floor((frame * step) * scale)`` exactly as the reproduced code, then torch's ``.long()``: a truncation,
    which numpy's cast to int64 shares for the finite values >= 0 met here (checked by :func:`_reach` on each
    block's last frame first)."""
    if time_step is None:
        return frames
    return _scaled_frames(frames, time_step, time_scale, narrow).astype(np.int64)


def _last_frame_offsets(blocks: Blocks) -> np.ndarray:
    """``[G]`` temporal offset of each block's last frame; raises when one is not finite or past MAX_TIME_OFFSET
    (every frame's offset is at most the last one's: steps are >= 0)."""
    assert blocks.time_step is not None
    scaled = _scaled_frames(blocks.thw[:, 0] - 1, blocks.time_step, blocks.time_scale, blocks.narrow)
    bad = ~(scaled <= MAX_TIME_OFFSET)  # NaN compares False
    if bad.any():
        raise InvalidInput(
            f"a video's temporal position offset (frame × tokens_per_second × second_per_grid_t) is "
            f"{float(scaled[bad][0])}; it must be finite and at most 2**53",
            field="second_per_grid_t",
        )
    return scaled.astype(np.int64)


def _reach(blocks: Blocks, side: np.ndarray) -> np.ndarray:
    """``[G]`` reach of each block (largest position relative to its start, plus 1); ``side`` is ``max(h, w)``."""
    reach: np.ndarray  # numpy types ufuncs over untyped-dtype arrays as Any
    frames = blocks.thw[:, 0]
    if blocks.frame_stride is not None:
        reach = np.maximum(np.maximum(frames, side), (frames - 1) * blocks.frame_stride + side)
    elif blocks.time_step is None:
        reach = np.maximum(frames, side)
    else:
        reach = np.maximum(_last_frame_offsets(blocks) + 1, side)
    return reach


def _advance_transformers5(side: np.ndarray, reach: np.ndarray) -> np.ndarray:
    # Text (1, 1, n) advances by n; vision by max(h, w): the temporal extent is ignored.
    return side


def _advance_transformers4(side: np.ndarray, reach: np.ndarray) -> np.ndarray:
    return reach


ADVANCE_RULES: dict[bool, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    False: _advance_transformers5,
    True: _advance_transformers4,
}
"""``CompatRule.next_start_after_max`` -> ``(side, reach)`` -> ``[G]`` distance from a block's start to the next
block's start (``side``: ``max(h, w)`` of each block)."""


def _check_ceiling(advance: np.ndarray, reach: np.ndarray) -> None:
    """Refuse blocks whose positions would pass POSITION_CEILING (float64 sums: before any int64 sum can wrap)."""
    if float(advance.sum(dtype=np.float64)) + float(reach.max() - 1) > POSITION_CEILING:
        raise InvalidInput(
            f"M-RoPE positions would pass {POSITION_CEILING}: tokens_per_second or second_per_grid_t is too large",
            field="second_per_grid_t",
        )


_ONE_ROW_FIRST_BLOCK = np.zeros(1, dtype=np.int64)
"""``[1]`` index of the first block of a batch of one row (read-only, shared)."""
_ONE_ROW_FIRST_BLOCK.flags.writeable = False


def _starts(advance: np.ndarray, row: np.ndarray, num_rows: int) -> tuple[np.ndarray, np.ndarray]:
    """``[G]`` start of each block (the exclusive running sum of ``advance``, restarted at every row) and ``[B]``
    index of each row's first block."""
    starts = _running_sum(advance)
    starts -= advance
    if num_rows == 1:  # nothing to restart
        return starts, _ONE_ROW_FIRST_BLOCK
    row_first_block = row.searchsorted(np.arange(num_rows))
    starts -= starts[row_first_block][row]
    return starts, row_first_block


def _lines(blocks: Blocks, starts: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per line: ``[3, Lc]`` T/H/W of its first token, ``[3, Lc]`` step along the line, ``[Lc]`` length.

    A block's lines are its frames' rows: line ``k`` of a block is row ``k % h`` of frame ``k // h``; its first token
    is at ``T = start + offset(frame)``, ``H = start + row``, ``W = start`` (plus ``frame * stride`` on all axes for
    HY-V4-VL).
    """
    frames, rows, columns = blocks.thw[:, 0], blocks.thw[:, 1], blocks.thw[:, 2]
    lines_per_block = frames * rows
    block_of_line = np.arange(frames.size).repeat(lines_per_block)
    first_line = _running_sum(lines_per_block)
    first_line -= lines_per_block
    line_in_block = np.arange(block_of_line.size) - first_line[block_of_line]
    rows_per_frame = rows[block_of_line]
    frame = line_in_block // rows_per_frame
    start = starts[block_of_line]
    step = None if blocks.time_step is None else blocks.time_step[block_of_line]
    values = np.empty((3, block_of_line.size), dtype=np.int64)
    np.add(start, _temporal_offsets(frame, step, blocks.time_scale, blocks.narrow), out=values[0])
    np.add(start, line_in_block % rows_per_frame, out=values[1])
    values[2] = start
    if blocks.frame_stride is not None:
        offset = frame * blocks.frame_stride[block_of_line]  # text/padding lines: frame 0
        np.add(start, offset, out=values[0])
        values[1:] += offset
    return values, _LINE_STEP.take(blocks.kind[block_of_line], axis=1), columns[block_of_line]


DIRECT_EXPANSION_TOKENS = 2048
"""Up to this many tokens, :func:`_expand_lines` writes each token's position directly (fewest operations); beyond,
as a running sum (one ``[3, total]`` temporary instead of three)."""


def _expand_lines(values: np.ndarray, steps: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """``[3, total]`` int64 positions ``values[:, l] + steps[:, l] * column`` of lines tiling ``total`` tokens.

    Small: that formula, per token (``column`` counted from the line's first token). Large: one running sum (in
    torch, in place) of per-token differences: each line's step, except at the line's first token, which carries
    the jump from the previous line's last position (int64 wrap-around cancels out in the sum).
    """
    ends = _running_sum(lengths)
    first_token = ends - lengths
    total = int(ends[-1])
    if total <= DIRECT_EXPANSION_TOKENS:
        column = np.arange(total) - first_token.repeat(lengths)
        positions = values.repeat(lengths, axis=1)
        positions += steps.repeat(lengths, axis=1) * column
        return positions
    last = steps * (lengths - 1)
    last += values
    jumps = values.copy()
    jumps[:, 1:] -= last[:, :-1]
    differences = steps.repeat(lengths, axis=1)
    differences[:, first_token] = jumps
    torch.from_numpy(differences).cumsum_(dim=1)
    return differences


PATTERN_EXPANSION_TOKENS = DIRECT_EXPANSION_TOKENS
"""Up to this many tokens (and :data:`PATTERN_EXPANSION_BLOCKS` blocks), :meth:`PositionPlan.arrays` writes each
block as its start plus its pattern (:func:`_block_pattern`): a few numpy calls per block instead of the line
arrays' fixed few dozen."""
PATTERN_EXPANSION_BLOCKS = 16
"""Most blocks written one by one from their patterns (a Python step each); more go through the lines."""

# [kind, axis, column]: the positions of a one-line block of each kind relative to its start (its step times the
# column, as _expand_lines writes a line), read-only slices of which are the patterns of text and padding blocks.
_ONE_LINE_PATTERNS = _LINE_STEP.T[:, :, None] * np.arange(PATTERN_EXPANSION_TOKENS)
_ONE_LINE_PATTERNS.flags.writeable = False


def _block_pattern(kind: int, frames: int, rows: int, columns: int) -> np.ndarray:
    """``[3, frames * rows * columns]`` read-only positions of a block relative to its start, for blocks whose
    frame offsets are their frame index (no frame times, no frame stride): a one-line block's from
    ``_ONE_LINE_PATTERNS``, a vision grid's the engine's own lines of that block alone at start 0, cached by shape
    (``_patterns``, bounded)."""
    if frames * rows == 1:
        return _ONE_LINE_PATTERNS[kind, :, :columns]
    return pattern(("mrope-block", kind, frames, rows, columns), lambda: _lines_alone(kind, frames, rows, columns))


def _lines_alone(kind: int, frames: int, rows: int, columns: int) -> np.ndarray:
    """``[3, frames * rows * columns]`` positions of one block at start 0, expanded from its lines."""
    one = np.zeros(1, dtype=np.int64)
    block = Blocks(one, np.array([kind]), np.array([[frames, rows, columns]]), None, False)
    return _expand_lines(*_lines(block, one))


def _expand_blocks(blocks: Blocks, starts: np.ndarray) -> np.ndarray:
    """``[3, total]`` int64 positions of blocks without frame times or frame strides: their
    :func:`_block_pattern` side by side, plus each block's start (``starts`` ``[G]``; padding: the fill value)."""
    patterns = [
        _block_pattern(kind, frames, rows, columns)
        for kind, (frames, rows, columns) in zip(blocks.kind.tolist(), blocks.thw.tolist(), strict=True)
    ]
    positions = np.concatenate(patterns, axis=1)
    positions += starts.repeat([block.shape[1] for block in patterns])
    return positions


def _writes_from_patterns(blocks: Blocks, total: int) -> bool:
    """Whether :func:`_expand_blocks` writes ``blocks`` (``total`` tokens): few blocks and tokens, and every frame
    offset its frame index (no frame times, no frame strides)."""
    return (
        total <= PATTERN_EXPANSION_TOKENS
        and blocks.kind.size <= PATTERN_EXPANSION_BLOCKS
        and blocks.time_step is None
        and blocks.frame_stride is None
    )


class PositionPlan(NamedTuple):
    """Everything but the per-token expansion: small arrays (per row, per block)."""

    num_rows: int
    width: int
    deltas: np.ndarray  # [B, 1] int64
    blocks: Blocks
    starts: np.ndarray  # [G] int64 position of each block's first token (padding blocks: the fill value)

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """``position_ids`` ``[3, B, width]`` int64 and ``mrope_position_deltas`` ``[B, 1]`` int64 arrays."""
        total = self.num_rows * self.width
        blocks = self.blocks
        if total == 0:
            positions = np.zeros((3, 0), dtype=np.int64)
        elif _writes_from_patterns(blocks, total):
            positions = _expand_blocks(blocks, self.starts)
        else:
            positions = _expand_lines(*_lines(blocks, self.starts))
        return positions.reshape(3, self.num_rows, self.width), self.deltas

    def expand(self, device: torch.device | str | None) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`arrays` as tensors on ``device`` (None: the CPU)."""
        position_ids, deltas = self.arrays()
        return tensor_on(position_ids, device), tensor_on(deltas, device)


def plan_positions(
    blocks: Blocks,
    row_lengths: np.ndarray,
    width: int,
    continue_after_max: bool,
    fill_value: int,
) -> PositionPlan:
    """Lay the blocks out: the starts and deltas to expand into ``[3, B, width]`` positions.

    ``row_lengths`` ``[B]`` counts each row's real (non-padding) tokens; a row without any has delta 0.
    ``continue_after_max``: the block after a vision block starts at its largest position + 1 (else at
    ``start + max(h, w)``).
    """
    num_rows = row_lengths.size
    if num_rows * width == 0:
        return PositionPlan(num_rows, width, np.zeros((num_rows, 1), dtype=np.int64), blocks, blocks.row)
    side = np.maximum(blocks.thw[:, 1], blocks.thw[:, 2])
    reach = _reach(blocks, side)
    advance = ADVANCE_RULES[continue_after_max](side, reach)
    if blocks.time_step is not None:  # else a block's advance and reach are at most its token count
        _check_ceiling(advance, reach)
    is_padding = blocks.kind == PAD_BLOCK if blocks.has_padding else None
    if is_padding is not None:
        advance = np.where(is_padding, 0, advance)
        reach = np.where(is_padding, 0, reach)  # a padding block raises no row maximum
    starts, row_first_block = _starts(advance, blocks.row, num_rows)
    deltas = np.maximum.reduceat(starts + reach, row_first_block)  # largest position + 1 of each row
    deltas -= row_lengths
    if is_padding is not None:
        starts[is_padding] = fill_value  # a padding block is one line at the fill value, which does not advance
    return PositionPlan(num_rows, width, deltas.reshape(num_rows, 1), blocks, starts)
