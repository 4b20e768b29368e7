"""Triton kernels: gather cos/sin by position from the float32 half-table and rotate q and k, one launch per call
(``rotate_triton``) or per batch of requests (``rotate_triton_many``).

Tiling: a program owns ``BLOCK_T`` tokens. It loads their positions and gathers their cos/sin rows once
([BLOCK_T, n_freq]; for M-RoPE each frequency slot reads the position row named by the slot map), then loops
over the heads of q and then of k, ``BLOCK_H`` heads per step, rotating [BLOCK_T, BLOCK_H, n_freq] channel
pairs. Channels are loaded as contiguous runs (vectorised): the two halves for NeoX, the whole rotated
prefix for GPT-J, split into even/odd channels in registers (``tl.split``) and interleaved back
(``tl.join``) for the store. Layouts are handled through the strides of the [B, T, H, D] view (channel
stride 1), so flat, [B, T, H, D] and [B, H, T, D] share the kernel.

No host synchronisation: the table's size is decided on the host, from positions that are still on the host
(read there for free, then copied to the device); positions already on the device get per-token cos/sin
computed there by torch ops (no read-back). So a call is a fixed sequence of device work: no ``.item()``,
``.tolist()`` or reduction read back, which is what CUDA graph capture needs.

Numerics match the eager formula bit for bit (a NaN's sign and payload bits excepted): cos/sin are rounded to
the tensor dtype, and every product, sum and difference is computed in float32 and rounded to the tensor dtype
(what torch's eager bf16/fp16 kernels do). On a GPU bfloat16 rounds by the hardware conversion (round to
nearest even); the CPU interpreter's conversion truncates, so under ``TRITON_INTERPRET=1`` the same rounding is
done with integer ops. Float contraction into FMA is disabled at launch.

Import with ``TRITON_INTERPRET=1`` already set to run on CPU tensors (tests).
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache, lru_cache

import torch
import triton  # type: ignore[import-untyped]
import triton.language as tl  # type: ignore[import-untyped]

from ropeserve.errors import InvalidInput
from ropeserve.kernels.prep import RotationInputs, prepare, token_major, upload
from ropeserve.kernels.spec import BatchItem, MropeSpec, RotationSpec
from ropeserve.rope.tables import RopeTable

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
"""Triton runs kernels in its CPU interpreter (read at import, as Triton does)."""

KEEP, BF16_BITS, BF16_NATIVE, FP16 = 0, 1, 2, 3
ROUNDING: dict[torch.dtype, int] = {
    torch.float32: KEEP,
    torch.bfloat16: BF16_BITS if INTERPRETED else BF16_NATIVE,
    torch.float16: FP16,
}
"""Per dtype, how ``_round_to`` rounds a float32 result to the tensor dtype."""

INTERLEAVED = {"neox": False, "gptj": True}
"""Per pairing, whether pair j is channels (2j, 2j + 1) (GPT-J) rather than (j, j + n_freq) (NeoX)."""

HEAD_STEP_CHANNELS = 1024
"""Rotated channels per head step (``BLOCK_H`` heads × padded rotary width): 8 heads of 128."""
TOKENS_PER_PROGRAM = 4
"""Tokens a program owns when there are enough of them to fill the device (``MIN_WAVES`` programs per SM)."""
MIN_WAVES = 4

JOB_FIELDS = 16
"""Columns of the batch kernel's job table (int64), padded to 16: 0 first program, 1 rows (B·T), 2 T, 3-6 q's
element offset from the base and its B/T/H strides, 7-10 the same for k, 11 offset of the job's positions,
12-14 their A/B/T strides."""


@dataclass(frozen=True)
class Tile:
    """Launch shape: tokens per program, heads per step, warps per program."""

    block_t: int
    block_h: int
    num_warps: int = 4


# The kernels' parameters stay unannotated: Triton reads their annotations (tl.constexpr, and type hints that
# change how it specialises a launch), and triton ships no type information, so each kernel carries two ignores.
@triton.jit  # type: ignore[untyped-decorator]
def _round_to(value, ROUND: tl.constexpr):  # type: ignore[no-untyped-def]
    """Round float32 ``value`` to the tensor dtype and back (identity for float32)."""
    if ROUND == 1:
        bits = value.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        return bits.to(tl.float32, bitcast=True)
    elif ROUND == 2:
        return value.to(tl.bfloat16).to(tl.float32)
    elif ROUND == 3:
        return value.to(tl.float16).to(tl.float32)
    else:
        return value


@triton.jit  # type: ignore[untyped-decorator]
def _gather_cos_sin(  # type: ignore[no-untyped-def]
    cos_table, sin_table, max_row, positions, slot_axes, first_row, n_rows, seq_len, pos_sa, pos_sb, pos_st,
    N_FREQ: tl.constexpr, FREQ_PAD: tl.constexpr, BLOCK_T: tl.constexpr, ROUND: tl.constexpr,
):  # fmt: skip
    """cos/sin [BLOCK_T, FREQ_PAD] (rounded to the tensor dtype) of rows [first_row, first_row + BLOCK_T),
    with their batch and token indices and the row mask. Positions are clamped to the table's rows
    [0, max_row], so a broken promise about their range reads wrong rows, never outside the table."""
    rows = first_row + tl.arange(0, BLOCK_T)
    row_mask = rows < n_rows
    batch = rows.to(tl.int64) // seq_len
    token = rows.to(tl.int64) % seq_len
    slots = tl.arange(0, FREQ_PAD)
    table_mask = row_mask[:, None] & (slots < N_FREQ)[None, :]
    axes = tl.load(slot_axes + slots, mask=slots < N_FREQ, other=0)
    position = tl.load(
        positions + (axes * pos_sa)[None, :] + (batch * pos_sb + token * pos_st)[:, None], mask=table_mask, other=0
    )
    table_index = tl.minimum(tl.maximum(position, 0), max_row) * N_FREQ + slots[None, :]
    cos = _round_to(tl.load(cos_table + table_index, mask=table_mask, other=0.0), ROUND)
    sin = _round_to(tl.load(sin_table + table_index, mask=table_mask, other=0.0), ROUND)
    return cos, sin, batch, token, row_mask


@triton.jit  # type: ignore[untyped-decorator]
def _rotate_heads(  # type: ignore[no-untyped-def]
    src, dst, src_rows, dst_rows, src_head_stride, dst_head_stride, n_heads, cos, sin, row_mask,
    BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr, N_FREQ: tl.constexpr, FREQ_PAD: tl.constexpr,
    INTERLEAVE: tl.constexpr, HEAD_DIM: tl.constexpr, PASS_PAD: tl.constexpr, COPY_PASS: tl.constexpr,
    ROUND: tl.constexpr,
):  # fmt: skip
    """Rotate every head of a row block from src into dst, BLOCK_H heads per step.

    src_rows / dst_rows: [BLOCK_T] element offsets of each token's head 0; cos, sin: [BLOCK_T, FREQ_PAD].
    """
    c = cos[:, None, :]
    s = sin[:, None, :]
    for first_head in range(0, n_heads, BLOCK_H):
        heads = first_head + tl.arange(0, BLOCK_H)
        head_mask = row_mask[:, None] & (heads < n_heads)[None, :]
        wide_heads = heads.to(tl.int64)[None, :]
        src_base = (src_rows[:, None] + wide_heads * src_head_stride)[:, :, None]
        dst_base = (dst_rows[:, None] + wide_heads * dst_head_stride)[:, :, None]
        if INTERLEAVE:
            channels = tl.arange(0, 2 * FREQ_PAD)[None, None, :]
            mask = head_mask[:, :, None] & (channels < 2 * N_FREQ)
            x = tl.load(src + src_base + channels, mask=mask, other=0.0).to(tl.float32)
            x1, x2 = tl.split(tl.reshape(x, (BLOCK_T, BLOCK_H, FREQ_PAD, 2)))
        else:
            channels = tl.arange(0, FREQ_PAD)[None, None, :]
            mask = head_mask[:, :, None] & (channels < N_FREQ)
            x1 = tl.load(src + src_base + channels, mask=mask, other=0.0).to(tl.float32)
            x2 = tl.load(src + src_base + N_FREQ + channels, mask=mask, other=0.0).to(tl.float32)
        out1 = _round_to(_round_to(x1 * c, ROUND) - _round_to(x2 * s, ROUND), ROUND)
        out2 = _round_to(_round_to(x2 * c, ROUND) + _round_to(x1 * s, ROUND), ROUND)
        if INTERLEAVE:
            out = tl.reshape(tl.join(out1, out2), (BLOCK_T, BLOCK_H, 2 * FREQ_PAD))
            tl.store(dst + dst_base + channels, out.to(dst.dtype.element_ty), mask=mask)
        else:
            tl.store(dst + dst_base + channels, out1.to(dst.dtype.element_ty), mask=mask)
            tl.store(dst + dst_base + N_FREQ + channels, out2.to(dst.dtype.element_ty), mask=mask)
        if COPY_PASS:
            kept_channels = (2 * N_FREQ + tl.arange(0, PASS_PAD))[None, None, :]
            pass_mask = head_mask[:, :, None] & (kept_channels < HEAD_DIM)
            kept = tl.load(src + src_base + kept_channels, mask=pass_mask)
            tl.store(dst + dst_base + kept_channels, kept, mask=pass_mask)


@triton.jit  # type: ignore[untyped-decorator]
def _rope_kernel(  # type: ignore[no-untyped-def]
    q, q_out, k, k_out, cos_table, sin_table, max_row, positions, slot_axes, n_rows, seq_len,
    q_sb, q_st, q_sh, qo_sb, qo_st, qo_sh, k_sb, k_st, k_sh, ko_sb, ko_st, ko_sh, pos_sa, pos_sb, pos_st,
    n_q_heads, n_k_heads,
    N_FREQ: tl.constexpr, FREQ_PAD: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr,
    INTERLEAVE: tl.constexpr, HEAD_DIM: tl.constexpr, PASS_PAD: tl.constexpr, COPY_PASS: tl.constexpr,
    ROUND: tl.constexpr,
):  # fmt: skip
    """One call: program p rotates rows [p·BLOCK_T, (p+1)·BLOCK_T) of q (all heads) and then of k."""
    cos, sin, batch, token, row_mask = _gather_cos_sin(
        cos_table, sin_table, max_row, positions, slot_axes, tl.program_id(0) * BLOCK_T, n_rows, seq_len,
        pos_sa, pos_sb, pos_st, N_FREQ, FREQ_PAD, BLOCK_T, ROUND,
    )  # fmt: skip
    _rotate_heads(
        q, q_out, batch * q_sb + token * q_st, batch * qo_sb + token * qo_st, q_sh, qo_sh, n_q_heads, cos, sin,
        row_mask, BLOCK_T, BLOCK_H, N_FREQ, FREQ_PAD, INTERLEAVE, HEAD_DIM, PASS_PAD, COPY_PASS, ROUND,
    )  # fmt: skip
    _rotate_heads(
        k, k_out, batch * k_sb + token * k_st, batch * ko_sb + token * ko_st, k_sh, ko_sh, n_k_heads, cos, sin,
        row_mask, BLOCK_T, BLOCK_H, N_FREQ, FREQ_PAD, INTERLEAVE, HEAD_DIM, PASS_PAD, COPY_PASS, ROUND,
    )  # fmt: skip


@triton.jit  # type: ignore[untyped-decorator]
def _job_field(job_row, COLUMN: tl.constexpr, ALIGN: tl.constexpr):  # type: ignore[no-untyped-def]
    """Column ``COLUMN`` of a job-table row, promised to be a multiple of ``ALIGN`` (vectorised access)."""
    return tl.multiple_of(tl.load(job_row + COLUMN), ALIGN)


@triton.jit  # type: ignore[untyped-decorator]
def _rope_batch_kernel(  # type: ignore[no-untyped-def]
    base, cos_table, sin_table, max_row, positions, slot_axes, jobs, n_jobs, n_q_heads, n_k_heads,
    N_FREQ: tl.constexpr, FREQ_PAD: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr,
    INTERLEAVE: tl.constexpr, HEAD_DIM: tl.constexpr, PASS_PAD: tl.constexpr, ROUND: tl.constexpr,
    JOBS_PAD: tl.constexpr, FIELDS: tl.constexpr, ALIGN: tl.constexpr,
):  # fmt: skip
    """A batch, in place: the program finds its job in the job table (the last job whose first program is at
    most its id), then rotates that job's rows as ``_rope_kernel`` does. Tensor addresses are element offsets
    from ``base`` (the lowest of them), positions offsets into ``positions``."""
    program = tl.program_id(0)
    ids = tl.arange(0, JOBS_PAD)
    firsts = tl.load(jobs + ids * FIELDS, mask=ids < n_jobs, other=2**62)
    job = tl.sum((firsts <= program).to(tl.int32), axis=0) - 1
    row = jobs + job.to(tl.int64) * FIELDS
    first_row = (program - tl.load(row + 0)) * BLOCK_T
    cos, sin, batch, token, row_mask = _gather_cos_sin(
        cos_table, sin_table, max_row, positions + tl.load(row + 11), slot_axes, first_row, tl.load(row + 1),
        tl.load(row + 2), tl.load(row + 12), tl.load(row + 13), tl.load(row + 14), N_FREQ, FREQ_PAD, BLOCK_T, ROUND,
    )  # fmt: skip
    q_rows = _job_field(row, 3, ALIGN) + batch * _job_field(row, 4, ALIGN) + token * _job_field(row, 5, ALIGN)
    _rotate_heads(
        base, base, q_rows, q_rows, _job_field(row, 6, ALIGN), _job_field(row, 6, ALIGN), n_q_heads, cos, sin,
        row_mask, BLOCK_T, BLOCK_H, N_FREQ, FREQ_PAD, INTERLEAVE, HEAD_DIM, PASS_PAD, False, ROUND,
    )  # fmt: skip
    k_rows = _job_field(row, 7, ALIGN) + batch * _job_field(row, 8, ALIGN) + token * _job_field(row, 9, ALIGN)
    _rotate_heads(
        base, base, k_rows, k_rows, _job_field(row, 10, ALIGN), _job_field(row, 10, ALIGN), n_k_heads, cos, sin,
        row_mask, BLOCK_T, BLOCK_H, N_FREQ, FREQ_PAD, INTERLEAVE, HEAD_DIM, PASS_PAD, False, ROUND,
    )  # fmt: skip


@dataclass(frozen=True)
class PositionTable:
    """What the kernels gather from: cos/sin rows [R, n_freq] float32, positions [A, B, T] int64 indexing
    them (on the device), and the slot map (M-RoPE row of each frequency slot)."""

    cos_rows: torch.Tensor
    sin_rows: torch.Tensor
    positions: torch.Tensor
    mrope: MropeSpec | None

    @property
    def max_row(self) -> int:
        """Last row of the table (positions are clamped to it in the kernel)."""
        return self.cos_rows.shape[0] - 1


def rotate_triton(
    q: torch.Tensor,
    k: torch.Tensor | None,
    positions: torch.Tensor,
    table: RopeTable,
    spec: RotationSpec,
    *,
    inplace: bool = False,
    position_range: tuple[int, int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One launch rotating q and k (see the module docstring); bit-identical to ``rotate_native``.

    ``positions`` may be on the host (its range is read there, then it is copied to q's device) or on q's
    device: then cos/sin are gathered from the cached table if the caller states the positions' (min, max)
    as ``position_range`` (the kernel clamps to the table, so a wrong range gives wrong values, never a
    read outside it), else computed per token on the device.
    """
    inputs = prepare(q, k, positions, table, spec)
    bounds = position_range or host_bounds([positions])
    _require_unit_channel_stride(inputs)
    q_out = q if inplace else torch.empty_like(q)
    k_out = k if inplace or k is None else torch.empty_like(k)
    if inputs.q4.shape[:2].numel() == 0:
        return q_out, k_out
    q4_out = token_major(q_out, spec.layout, spec.head_dim, "q")
    k4, k4_out = inputs.q4, q4_out
    if k_out is not None and inputs.k4 is not None:
        k4, k4_out = inputs.k4, token_major(k_out, spec.layout, spec.head_dim, "k")
    gather = position_table(table, inputs.positions, spec.mrope, bounds)
    _launch(inputs.q4, q4_out, k4, k4_out, 0 if inputs.k4 is None else k4.shape[2], gather, spec, not inplace)
    return q_out, k_out


def _launch(
    q4: torch.Tensor,
    q4_out: torch.Tensor,
    k4: torch.Tensor,
    k4_out: torch.Tensor,
    n_k_heads: int,
    gather: PositionTable,
    spec: RotationSpec,
    copy_pass: bool,
) -> None:
    """Launch ``_rope_kernel`` over the B·T rows of the [B, T, H, D] views."""
    batch, tokens, n_q_heads = q4.shape[:3]
    n_freq = gather.cos_rows.shape[-1]
    tile = choose_tile(batch * tokens, max(n_q_heads, n_k_heads), n_freq, q4.device)
    pass_width = spec.head_dim - 2 * n_freq
    _rope_kernel[(_cdiv(batch * tokens, tile.block_t),)](
        q4, q4_out, k4, k4_out, gather.cos_rows, gather.sin_rows, gather.max_row, gather.positions,
        slot_axes_on(gather.mrope, n_freq, q4.device), batch * tokens, tokens,
        *q4.stride()[:3], *q4_out.stride()[:3], *k4.stride()[:3], *k4_out.stride()[:3], *gather.positions.stride(),
        n_q_heads, n_k_heads,
        **_shape_constants(n_freq, spec, tile, q4.dtype), COPY_PASS=copy_pass and pass_width > 0,
        num_warps=tile.num_warps, enable_fp_fusion=False,
    )  # fmt: skip


def _shape_constants(n_freq: int, spec: RotationSpec, tile: Tile, dtype: torch.dtype) -> dict[str, object]:
    """The compile-time constants both kernels share."""
    return {
        "N_FREQ": n_freq,
        "FREQ_PAD": _pow2_at_least(n_freq),
        "BLOCK_T": tile.block_t,
        "BLOCK_H": tile.block_h,
        "INTERLEAVE": INTERLEAVED[spec.pairing],
        "HEAD_DIM": spec.head_dim,
        "PASS_PAD": _pow2_at_least(max(spec.head_dim - 2 * n_freq, 1)),
        "ROUND": ROUNDING[dtype],
    }


def choose_tile(rows: int, heads: int, n_freq: int, device: torch.device) -> Tile:
    """``HEAD_STEP_CHANNELS`` rotated channels per head step; ``TOKENS_PER_PROGRAM`` tokens per program,
    fewer when that would leave fewer than ``MIN_WAVES`` programs per SM."""
    head_channels = 2 * _pow2_at_least(n_freq)
    block_h = min(_pow2_at_least(max(heads, 1)), max(1, HEAD_STEP_CHANNELS // head_channels))
    block_t = TOKENS_PER_PROGRAM
    while block_t > 1 and _cdiv(rows, block_t) < MIN_WAVES * _multiprocessors(device):
        block_t //= 2
    return Tile(block_t, block_h)


def _cdiv(a: int, b: int) -> int:
    """⌈a / b⌉ (plain Python: ``triton.cdiv`` is a constexpr-function wrapper, slow on the host path)."""
    return -(-a // b)


def _pow2_at_least(n: int) -> int:
    """Smallest power of two ≥ n (1 for n ≤ 1)."""
    return 1 << max(n - 1, 0).bit_length()


@cache
def _multiprocessors(device: torch.device) -> int:
    """SMs of a CUDA device (1 elsewhere: the interpreter runs one program at a time)."""
    if device.type != "cuda":
        return 1
    return int(torch.cuda.get_device_properties(device).multi_processor_count)


def _require_unit_channel_stride(inputs: RotationInputs) -> None:
    for name, x4 in (("q", inputs.q4), ("k", inputs.k4)):
        if x4 is not None and x4.shape[-1] > 1 and x4.stride(-1) != 1:
            raise InvalidInput(f"{name} must have contiguous channels (stride 1 on head_dim)", field=name)


def host_bounds(positions: Sequence[torch.Tensor]) -> tuple[int, int] | None:
    """(min, max) of positions that are all on the host (read there, no device sync); None when any is on a
    device (reading it back would synchronise) or none has elements."""
    if any(p.device.type != "cpu" for p in positions):
        return None
    filled = [p for p in positions if p.numel()]
    if not filled:
        return None
    lows, highs = zip(*(torch.aminmax(p) for p in filled), strict=True)
    return min(int(low) for low in lows), max(int(high) for high in highs)


def position_table(
    table: RopeTable, grid: torch.Tensor, mrope: MropeSpec | None, bounds: tuple[int, int] | None
) -> PositionTable:
    """The cached table when the host-known ``bounds`` fit it (grown as needed; a snapshot of rows that covers
    them); otherwise (negative, beyond ``row_cap``, or unknown) cos/sin computed per position on the device,
    indexed by the position's place in ``grid`` [A, B, T], with the same slot map. Reads nothing back from the
    device."""
    covering = table.rows_covering(bounds[1]) if bounds is not None and bounds[0] >= 0 else None
    if covering is not None:
        cos_rows, sin_rows = covering
        return PositionTable(cos_rows, sin_rows, grid, mrope)
    cos, sin = table.compute_half(grid)
    places = torch.arange(grid.numel(), device=grid.device).view(grid.shape)
    return PositionTable(cos.reshape(grid.numel(), -1), sin.reshape(grid.numel(), -1), places, mrope)


@lru_cache(maxsize=64)
def slot_axes_on(mrope: MropeSpec | None, n_freq: int, device: torch.device) -> torch.Tensor:
    """Position row of each frequency slot as int64 on ``device``: all 0 without M-RoPE (made once)."""
    if mrope is None:
        return torch.zeros(n_freq, dtype=torch.int64, device=device)
    return upload(mrope.slot_axes(n_freq).to(torch.int64), device)


def rotate_triton_many(items: Sequence[BatchItem], table: RopeTable) -> None:
    """Rotate several requests' q and k in place with one launch of ``_rope_batch_kernel``, without copying
    them into one tensor: a job table (offsets and strides per request) and the requests' positions travel to
    the device in one copy. Items share the table, dtype, pairing, head_dim and head counts (a batch key);
    layouts may differ. Falls back to one launch per item when the positions are not all on the host (their
    range would need a read-back), do not fit the cached table, or the tensors do not share an element grid.
    """
    plan = _batch_plan(items, table)
    if plan is None:
        for q, k, positions, spec in items:
            rotate_triton(q, k, positions, table, spec, inplace=True)
        return
    plan.launch()


@dataclass(frozen=True)
class BatchPlan:
    """One batch launch: the lowest-addressed tensor (offsets count elements from it), the job table on the
    device, the table and packed positions to gather from, and the compile-time shape."""

    base: torch.Tensor
    jobs: torch.Tensor
    n_jobs: int
    programs: int
    heads: tuple[int, int]
    gather: PositionTable
    spec: RotationSpec
    tile: Tile
    align: int

    def launch(self) -> None:
        n_freq = self.gather.cos_rows.shape[-1]
        _rope_batch_kernel[(self.programs,)](
            self.base, self.gather.cos_rows, self.gather.sin_rows, self.gather.max_row, self.gather.positions,
            slot_axes_on(self.spec.mrope, n_freq, self.base.device), self.jobs, self.n_jobs, *self.heads,
            **_shape_constants(n_freq, self.spec, self.tile, self.base.dtype),
            JOBS_PAD=_pow2_at_least(self.n_jobs), FIELDS=JOB_FIELDS, ALIGN=self.align,
            num_warps=self.tile.num_warps, enable_fp_fusion=False,
        )  # fmt: skip


def _batch_plan(items: Sequence[BatchItem], table: RopeTable) -> BatchPlan | None:
    """The batch launch for ``items`` (validated), or None when it does not apply (see ``rotate_triton_many``)."""
    views = []
    for q, k, positions, spec in items:
        inputs = prepare(q, k, positions, table, spec, positions_to_device=False)
        _require_unit_channel_stride(inputs)
        if inputs.q4.shape[:2].numel():
            views.append((inputs.q4, inputs.k4, inputs.positions))
    bounds = host_bounds([positions for _, _, positions, _ in items])
    covering = table.rows_covering(bounds[1]) if views and bounds is not None and bounds[0] >= 0 else None
    if covering is None:
        return None
    tensors = [x4 for q4, k4, _ in views for x4 in (q4, k4) if x4 is not None]
    base = min(tensors, key=torch.Tensor.data_ptr)
    element = base.element_size()
    offsets = [x4.data_ptr() - base.data_ptr() for x4 in tensors]
    if any(offset % element for offset in offsets):
        return None
    q4 = views[0][0]
    k_heads = 0 if views[0][1] is None else views[0][1].shape[2]
    spec = items[0][3]
    n_freq = table.inv_freq.numel()
    rows = sum(v[0].shape[0] * v[0].shape[1] for v in views)
    tile = choose_tile(rows, max(q4.shape[2], k_heads), n_freq, q4.device)
    host_rows, host_positions, alignment = _job_rows(views, base, tile.block_t)
    job_count = len(host_rows) // JOB_FIELDS
    programs = sum(_cdiv(v[0].shape[0] * v[0].shape[1], tile.block_t) for v in views)
    packed = upload(torch.cat([torch.tensor(host_rows, dtype=torch.int64), host_positions]), q4.device)
    cos_rows, sin_rows = covering
    device_positions = packed[len(host_rows) :]
    gather = PositionTable(cos_rows, sin_rows, device_positions, spec.mrope)
    vector = max(1, 16 // element)
    return BatchPlan(
        base, packed[: len(host_rows)], job_count, programs, (q4.shape[2], k_heads),
        gather, spec, tile, min(vector, alignment),
    )  # fmt: skip


def _job_rows(
    views: Sequence[tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]], base: torch.Tensor, block_t: int
) -> tuple[list[int], torch.Tensor, int]:
    """Job-table rows (``JOB_FIELDS`` int64 columns each, in the order its docstring gives), the jobs' host
    positions packed one after another (each [A, B or 1, T] contiguous), and the largest power of two dividing
    every element offset and stride (what ``ALIGN`` may promise)."""
    rows: list[int] = []
    packed: list[torch.Tensor] = []
    first_program = position_offset = 0
    element = base.element_size()
    divisor = 0
    for q4, k4, grid in views:
        batch, tokens = q4.shape[:2]
        compact = (grid[:, :1] if batch > 1 and grid.stride(1) == 0 else grid).contiguous()
        k_view = q4 if k4 is None else k4
        geometry = []
        for x4 in (q4, k_view):
            offset = (x4.data_ptr() - base.data_ptr()) // element
            geometry += [offset, *x4.stride()[:3]]
        divisor = math.gcd(divisor, *geometry)
        sb = tokens if compact.shape[1] > 1 else 0
        row = [first_program, batch * tokens, tokens, *geometry, position_offset, compact.shape[1] * tokens, sb, 1]
        rows += row + [0] * (JOB_FIELDS - len(row))
        packed.append(compact.flatten())
        first_program += _cdiv(batch * tokens, block_t)
        position_offset += compact.numel()
    return rows, torch.cat(packed), divisor & -divisor if divisor else 1 << 30
