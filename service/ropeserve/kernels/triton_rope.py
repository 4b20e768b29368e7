"""Triton kernel: gather cos/sin by position from the float32 half-table and rotate q and k in one launch.

Grid: (row blocks of ``BLOCK_T`` tokens, head blocks of q followed by head blocks of k). A program loads
the positions of its tokens, gathers the cos/sin rows once ([BLOCK_T, n_freq]; for M-RoPE each frequency
slot reads the position row named by the slot map), and rotates a [BLOCK_T, BLOCK_H, n_freq] tile of
channel pairs. Pairs are ``(j·PAIR_STRIDE, j·PAIR_STRIDE + PAIR_OFFSET)``: ``(j, j + n_freq)`` for NeoX and
``(2j, 2j + 1)`` for GPT-J. Layouts are handled through strides of the [B, T, H, D] view (channel stride 1).

Numerics match the eager formula bit for bit (a NaN's sign and payload bits excepted): cos/sin are rounded to
the tensor dtype, and every product, sum and difference is computed in float32 and rounded to the tensor dtype
(what torch's eager bf16/fp16 kernels do; bfloat16 uses an explicit round-to-nearest-even so the CPU
interpreter agrees too). Float contraction into FMA is disabled at launch.

Import with ``TRITON_INTERPRET=1`` already set to run on CPU tensors (tests).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache

import torch
import triton
import triton.language as tl

from ropeserve.errors import InvalidInput
from ropeserve.kernels.prep import RotationInputs, half_cos_sin, prepare, token_major
from ropeserve.kernels.spec import MropeSpec, RotationSpec
from ropeserve.rope.tables import RopeTable

ROUNDING: dict[torch.dtype, int] = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}
"""Per dtype, how ``_round_to`` rounds a float32 result: 0 keep, 1 bfloat16 (RNE), 2 float16."""

PAIR_GEOMETRY: dict[str, Callable[[int], tuple[int, int]]] = {
    "neox": lambda n_freq: (1, n_freq),
    "gptj": lambda n_freq: (2, 1),
}
"""Per pairing, ``(PAIR_STRIDE, PAIR_OFFSET)``: pair j is channels (j·stride, j·stride + offset)."""

TILE_ELEMENTS = 4096
"""Channel pairs per program (BLOCK_T · BLOCK_H · padded n_freq)."""


@triton.jit
def _round_to(value, ROUND: tl.constexpr):
    """Round float32 ``value`` to the tensor dtype and back (identity for float32)."""
    if ROUND == 1:
        bits = value.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        return bits.to(tl.float32, bitcast=True)
    elif ROUND == 2:
        return value.to(tl.float16).to(tl.float32)
    else:
        return value


@triton.jit
def _rotate_heads(
    src,
    dst,
    src_rows,
    dst_rows,
    src_head_stride,
    dst_head_stride,
    first_head,
    n_heads,
    cos,
    sin,
    row_mask,
    slots,
    slot_mask,
    BLOCK_H: tl.constexpr,
    PAIR_STRIDE: tl.constexpr,
    PAIR_OFFSET: tl.constexpr,
    ROTARY: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    PASS_PAD: tl.constexpr,
    COPY_PASS: tl.constexpr,
    ROUND: tl.constexpr,
):
    """Rotate heads [first_head, first_head + BLOCK_H) of a [BLOCK_T] row block from src into dst."""
    heads = first_head + tl.arange(0, BLOCK_H)
    head_mask = (heads < n_heads)[None, :, None]
    wide_heads = heads.to(tl.int64)
    src_base = src_rows[:, None, None] + (wide_heads * src_head_stride)[None, :, None]
    dst_base = dst_rows[:, None, None] + (wide_heads * dst_head_stride)[None, :, None]
    first = (slots * PAIR_STRIDE)[None, None, :]
    second = first + PAIR_OFFSET
    mask = row_mask[:, None, None] & head_mask & slot_mask[None, None, :]
    x1 = tl.load(src + src_base + first, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(src + src_base + second, mask=mask, other=0.0).to(tl.float32)
    c = cos[:, None, :]
    s = sin[:, None, :]
    out1 = _round_to(_round_to(x1 * c, ROUND) - _round_to(x2 * s, ROUND), ROUND)
    out2 = _round_to(_round_to(x2 * c, ROUND) + _round_to(x1 * s, ROUND), ROUND)
    tl.store(dst + dst_base + first, out1.to(dst.dtype.element_ty), mask=mask)
    tl.store(dst + dst_base + second, out2.to(dst.dtype.element_ty), mask=mask)
    if COPY_PASS:
        channels = (ROTARY + tl.arange(0, PASS_PAD))[None, None, :]
        pass_mask = row_mask[:, None, None] & head_mask & (channels < HEAD_DIM)
        kept = tl.load(src + src_base + channels, mask=pass_mask)
        tl.store(dst + dst_base + channels, kept, mask=pass_mask)


@triton.jit
def _rope_kernel(
    q,
    q_out,
    k,
    k_out,
    cos_table,
    sin_table,
    positions,
    slot_axes,
    n_rows,
    seq_len,
    q_sb,
    q_st,
    q_sh,
    qo_sb,
    qo_st,
    qo_sh,
    k_sb,
    k_st,
    k_sh,
    ko_sb,
    ko_st,
    ko_sh,
    pos_sa,
    pos_sb,
    pos_st,
    n_q_heads,
    n_k_heads,
    n_q_blocks,
    N_FREQ: tl.constexpr,
    FREQ_PAD: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_H: tl.constexpr,
    PAIR_STRIDE: tl.constexpr,
    PAIR_OFFSET: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    PASS_PAD: tl.constexpr,
    COPY_PASS: tl.constexpr,
    ROUND: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    row_mask = rows < n_rows
    batch = rows.to(tl.int64) // seq_len
    token = rows.to(tl.int64) % seq_len
    slots = tl.arange(0, FREQ_PAD)
    slot_mask = slots < N_FREQ
    table_mask = row_mask[:, None] & slot_mask[None, :]
    axes = tl.load(slot_axes + slots, mask=slot_mask, other=0)
    position = tl.load(
        positions + (axes * pos_sa)[None, :] + (batch * pos_sb + token * pos_st)[:, None], mask=table_mask, other=0
    )
    table_index = position * N_FREQ + slots[None, :]
    cos = _round_to(tl.load(cos_table + table_index, mask=table_mask, other=0.0), ROUND)
    sin = _round_to(tl.load(sin_table + table_index, mask=table_mask, other=0.0), ROUND)
    head_block = tl.program_id(1)
    if head_block < n_q_blocks:
        _rotate_heads(
            q, q_out, batch * q_sb + token * q_st, batch * qo_sb + token * qo_st, q_sh, qo_sh,
            head_block * BLOCK_H, n_q_heads, cos, sin, row_mask, slots, slot_mask,
            BLOCK_H, PAIR_STRIDE, PAIR_OFFSET, 2 * N_FREQ, HEAD_DIM, PASS_PAD, COPY_PASS, ROUND,
        )  # fmt: skip
    else:
        _rotate_heads(
            k, k_out, batch * k_sb + token * k_st, batch * ko_sb + token * ko_st, k_sh, ko_sh,
            (head_block - n_q_blocks) * BLOCK_H, n_k_heads, cos, sin, row_mask, slots, slot_mask,
            BLOCK_H, PAIR_STRIDE, PAIR_OFFSET, 2 * N_FREQ, HEAD_DIM, PASS_PAD, COPY_PASS, ROUND,
        )  # fmt: skip


def rotate_triton(
    q: torch.Tensor,
    k: torch.Tensor | None,
    positions: torch.Tensor,
    table: RopeTable,
    spec: RotationSpec,
    *,
    inplace: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One launch rotating q and k (see the module docstring); bit-identical to ``rotate_native``."""
    inputs = prepare(q, k, positions, table, spec)
    _require_unit_channel_stride(inputs)
    q_out = q if inplace else torch.empty_like(q)
    k_out = k if inplace or k is None else torch.empty_like(k)
    if inputs.q4.shape[:2].numel() == 0:
        return q_out, k_out
    q4_out = token_major(q_out, spec.layout, spec.head_dim, "q")
    if k_out is None or inputs.k4 is None:
        k_views = (inputs.q4, q4_out, 0)
    else:
        k_views = (inputs.k4, token_major(k_out, spec.layout, spec.head_dim, "k"), inputs.k4.shape[2])
    _launch(inputs, q4_out, *k_views, table, spec, copy_pass=not inplace)
    return q_out, k_out


def _launch(
    inputs: RotationInputs,
    q4_out: torch.Tensor,
    k4: torch.Tensor,
    k4_out: torch.Tensor,
    n_k_heads: int,
    table: RopeTable,
    spec: RotationSpec,
    *,
    copy_pass: bool,
) -> None:
    """Size the tiles and launch ``_rope_kernel`` over [B·T rows, q head blocks + k head blocks]."""
    cos_rows, sin_rows, grid, mrope = _position_table(table, inputs, spec.mrope)
    q4 = inputs.q4
    batch, tokens, n_q_heads = q4.shape[:3]
    n_freq = cos_rows.shape[-1]
    freq_pad = triton.next_power_of_2(n_freq)
    block_h = min(triton.next_power_of_2(max(n_q_heads, n_k_heads)), max(1, TILE_ELEMENTS // (4 * freq_pad)))
    block_t = min(max(1, TILE_ELEMENTS // (block_h * freq_pad)), triton.next_power_of_2(batch * tokens))
    n_q_blocks = triton.cdiv(n_q_heads, block_h)
    launch_grid = (triton.cdiv(batch * tokens, block_t), n_q_blocks + triton.cdiv(n_k_heads, block_h))
    pass_width = spec.head_dim - 2 * n_freq
    pair_stride, pair_offset = PAIR_GEOMETRY[spec.pairing](n_freq)
    _rope_kernel[launch_grid](
        q4, q4_out, k4, k4_out, cos_rows, sin_rows, grid, _slot_axes(mrope, n_freq, str(q4.device)),
        batch * tokens, tokens,
        *q4.stride()[:3], *q4_out.stride()[:3], *k4.stride()[:3], *k4_out.stride()[:3], *grid.stride(),
        n_q_heads, n_k_heads, n_q_blocks,
        N_FREQ=n_freq, FREQ_PAD=freq_pad, BLOCK_T=block_t, BLOCK_H=block_h,
        PAIR_STRIDE=pair_stride, PAIR_OFFSET=pair_offset, HEAD_DIM=spec.head_dim,
        PASS_PAD=triton.next_power_of_2(max(pass_width, 1)), COPY_PASS=copy_pass and pass_width > 0,
        ROUND=ROUNDING[q4.dtype], enable_fp_fusion=False,
    )  # fmt: skip


def _require_unit_channel_stride(inputs: RotationInputs) -> None:
    for name, x4 in (("q", inputs.q4), ("k", inputs.k4)):
        if x4 is not None and x4.shape[-1] > 1 and x4.stride(-1) != 1:
            raise InvalidInput(f"{name} must have contiguous channels (stride 1 on head_dim)", field=name)


def _position_table(
    table: RopeTable, inputs: RotationInputs, mrope: MropeSpec | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, MropeSpec | None]:
    """(cos rows, sin rows, positions [A, B, T], slot map) the kernel gathers from.

    Positions inside the cached table index its rows directly. Others (negative, or beyond
    the table's ``row_cap``) get per-token rows computed here, indexed by token number, with no slot map.
    """
    grid = inputs.positions
    low, high = torch.stack(torch.aminmax(grid)).tolist() if grid.numel() else (0, 0)
    rows = table.rows_covering(high) if low >= 0 else None
    if rows is not None:
        cos_rows, sin_rows = rows
        return cos_rows, sin_rows, grid, mrope
    cos_half, sin_half = half_cos_sin(table, grid, mrope)
    batch, tokens = grid.shape[1:]
    token_ids = torch.arange(batch * tokens, device=grid.device).view(1, batch, tokens)
    return cos_half.reshape(batch * tokens, -1), sin_half.reshape(batch * tokens, -1), token_ids, None


@lru_cache(maxsize=64)
def _slot_axes(mrope: MropeSpec | None, n_freq: int, device: str) -> torch.Tensor:
    """Position row of each frequency slot as int32 on ``device``: all 0 without M-RoPE."""
    if mrope is None:
        return torch.zeros(n_freq, dtype=torch.int32, device=device)
    return mrope.slot_axes(n_freq).to(device=device, dtype=torch.int32)
