"""The C kernel (``csrc/rope_cpu.c``): one pass over q and k, rotated where they lie, bit-identical to
``rotate_native``.

Torch gathers cos/sin per token (small: [B, T, rotary_dim/2]); the C function then reads every channel pair
once, rounds where the eager formula rounds, and writes it back (or to the output, with the pass-through
channels of partial rotary). Rows are cut into pieces of about ``PIECE_BYTES`` that all threads claim
(``threads.share_pieces``); ctypes releases the GIL for each call, so the threads run in parallel.
Anything the C path does not cover (non-CPU tensors, strided channels, float16 without compiler support)
goes to the fused torch kernel. ``rotate_compiled_many`` serves a batch of requests the same way: their
pieces go into one shared list, so the batch needs no concatenated copy.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

import torch

from ropeserve.kernels.cbuild import load_library
from ropeserve.kernels.fused import rotate_fused
from ropeserve.kernels.prep import half_cos_sin, prepare, row_blocks, token_major
from ropeserve.kernels.spec import BatchItem, RotationSpec
from ropeserve.kernels.threads import share_pieces
from ropeserve.rope.tables import RopeTable

PIECE_BYTES = 1 << 19
"""Bytes of x per C call: large enough that the call overhead vanishes, small enough to share the rows fairly."""

SYMBOLS = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}
PAIRING_FLAG = {"neox": 0, "gptj": 1}
_ARGTYPES: list[type[ctypes._SimpleCData[Any]]] = [
    *[ctypes.c_void_p] * 2,
    *[ctypes.c_int64] * 8,
    *[ctypes.c_void_p] * 2,
    ctypes.c_int64,
    ctypes.c_int32,
]
"""x, out, row_begin, row_end, heads, head_dim, 4 strides, cos, sin, n_freq, gptj (see ``csrc/rope_cpu.c``)."""


@cache
def c_function(dtype: torch.dtype) -> Callable[..., None] | None:
    """``ropeserve_rotate_<dtype>`` from the built library, or None (no compiler, or no such dtype in it)."""
    library = load_library().library
    if library is None or dtype not in SYMBOLS:
        return None
    function: ctypes._NamedFuncPointer | None = getattr(library, f"ropeserve_rotate_{SYMBOLS[dtype]}", None)
    if function is None:
        return None
    function.argtypes, function.restype = _ARGTYPES, None
    return function


def available() -> bool:
    """Whether the C library builds and loads here (the float32 entry point at least)."""
    return c_function(torch.float32) is not None


def unavailable_reason() -> str | None:
    """Why the C kernel cannot run here (the build's report), or None when it can."""
    return None if available() else load_library().detail


@dataclass(frozen=True)
class RowBlock:
    """Rows [N, H, D] of one tensor and its output (channels contiguous), with cos/sin [N, r/2] in its dtype."""

    rows_in: torch.Tensor
    rows_out: torch.Tensor
    cos: torch.Tensor
    sin: torch.Tensor

    def call(self, function: Callable[..., None], begin: int, end: int, gptj: int) -> None:
        """Rotate rows [begin, end) of this block (the GIL is released during the call)."""
        heads, head_dim = self.rows_in.shape[1:]
        function(
            self.rows_in.data_ptr(), self.rows_out.data_ptr(), begin, end, heads, head_dim,
            *self.rows_in.stride()[:2], *self.rows_out.stride()[:2],
            self.cos.data_ptr(), self.sin.data_ptr(), self.cos.shape[-1], gptj,
        )  # fmt: skip


def rotate_compiled(
    q: torch.Tensor,
    k: torch.Tensor | None,
    positions: torch.Tensor,
    table: RopeTable,
    spec: RotationSpec,
    *,
    inplace: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One-pass C rotation (see the module docstring); bit-identical to ``rotate_native``."""
    function = c_function(q.dtype)
    plan = _plan(q, k, positions, table, spec, inplace) if function else None
    if function is None or plan is None:
        return rotate_fused(q, k, positions, table, spec, inplace=inplace)
    outputs, blocks = plan
    _run(function, blocks, PAIRING_FLAG[spec.pairing])
    return outputs


def rotate_compiled_many(items: Sequence[BatchItem], table: RopeTable) -> None:
    """Rotate several requests' q and k in place as one piece list shared by all threads, without copying
    them into one tensor. Items share the table, dtype and pairing (a batch key); layouts may differ."""
    function = c_function(items[0][0].dtype) if items else None
    plans = [_plan(q, k, positions, table, spec, True) for q, k, positions, spec in items] if function else []
    if function is None or None in plans:
        for q, k, positions, spec in items:
            rotate_compiled(q, k, positions, table, spec, inplace=True)
        return
    blocks = [block for plan in plans if plan is not None for block in plan[1]]
    _run(function, blocks, PAIRING_FLAG[items[0][3].pairing])


def _plan(
    q: torch.Tensor,
    k: torch.Tensor | None,
    positions: torch.Tensor,
    table: RopeTable,
    spec: RotationSpec,
    inplace: bool,
) -> tuple[tuple[torch.Tensor, torch.Tensor | None], list[RowBlock]] | None:
    """Validate, gather cos/sin, allocate outputs: the results and the row blocks for the C calls; None when
    the C path does not apply (another device, strided channels)."""
    if q.device.type != "cpu":
        return None
    inputs = prepare(q, k, positions, table, spec)
    if any(x4.stride(-1) != 1 for x4 in (inputs.q4, inputs.k4) if x4 is not None):
        return None
    cos_half, sin_half = half_cos_sin(table, inputs.positions, spec.mrope)
    cos, sin = cos_half.to(q.dtype).contiguous(), sin_half.to(q.dtype).contiguous()
    q_out = q if inplace else torch.empty_like(q)
    k_out = k if inplace or k is None else torch.empty_like(k)
    blocks: list[RowBlock] = []
    for x4, out in ((inputs.q4, q_out), (inputs.k4, k_out)):
        if x4 is None or out is None:
            continue
        out4 = x4 if inplace else token_major(out, spec.layout, spec.head_dim, "out")
        blocks.extend(RowBlock(*rows) for rows in row_blocks(x4, out4, cos, sin))
    return (q_out, k_out), blocks


def _run(function: Callable[..., None], blocks: list[RowBlock], gptj: int) -> None:
    """Cut every block into row ranges of about PIECE_BYTES and rotate them on all threads."""
    pieces: list[tuple[RowBlock, int, int]] = []
    for block in blocks:
        if block.rows_in.numel() == 0:
            continue
        rows = block.rows_in.shape[0]
        step = max(1, PIECE_BYTES // (block.rows_in[0].numel() * block.rows_in.element_size()))
        pieces.extend((block, begin, min(begin + step, rows)) for begin in range(0, rows, step))
    share_pieces(pieces, lambda piece: piece[0].call(function, piece[1], piece[2], gptj))
