"""Fused rotation in torch ops: chunked, in-place arithmetic with no full-size temporaries.

On CPU the C kernel (``compiled.py``) is faster (one pass instead of four ops per chunk); this one serves
where it cannot: no C compiler, strided channels, other devices.

The eager formula ``x·cos + rot(x)·sin`` materialises ``rot(x)``, two products and their sum at full size.
Here rows (tokens) are processed in chunks of at most ``GRAIN_ELEMENTS`` (a few hundred KiB, so a chunk and
its scratch stay in L2), and each chunk is rotated in place by four ops (``S``, ``C``: sin/cos expanded to
the pairing's layout)::

    scratch  = x · S
    x       *= C
    x_first  -= scratch_second      # x1·c − x2·s
    x_second += scratch_first       # x2·c + x1·s

Every op rounds to x's dtype exactly where the eager formula does, so the results are bit-identical to
``rope.apply_rotary`` for float32, bfloat16 and float16. Out of place, each chunk is first copied into the
output (which also carries the pass-through channels of partial rotary).

Parallelism: chunks stay under ATen's grain size, so each op runs inline in its thread, and
``torch.get_num_threads()`` threads (the caller plus a small pool, ``threads.py``) claim chunks from a
shared counter.
Splitting each small op with OpenMP instead costs a fork/join barrier per op, and with cores shared (the
event loop, other processes) every barrier waits for a descheduled thread: measured on 2 busy cores, 12×
the copy time out of place against 1.2× this way.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import torch

from ropeserve.kernels.prep import half_cos_sin, prepare, row_blocks, token_major
from ropeserve.kernels.spec import RotationSpec
from ropeserve.kernels.threads import run_on_all_threads
from ropeserve.rope.tables import Pairing, RopeTable, expand_pairing

GRAIN_ELEMENTS = 32_768
"""ATen runs an elementwise op inline, without an OpenMP region, up to this many elements (``GRAIN_SIZE``)."""

PAIR_VIEWS: dict[str, Callable[[torch.Tensor], tuple[torch.Tensor, ...]]] = {
    "neox": lambda t: t.chunk(2, dim=-1),
    "gptj": lambda t: (t[..., 0::2], t[..., 1::2]),
}
"""The two members of every rotated channel pair, as views: NeoX halves, GPT-J even/odd channels."""


def rotate_fused(
    q: torch.Tensor,
    k: torch.Tensor | None,
    positions: torch.Tensor,
    table: RopeTable,
    spec: RotationSpec,
    *,
    inplace: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Chunked in-place rotation (see the module docstring); bit-identical to ``rotate_native``."""
    inputs = prepare(q, k, positions, table, spec)
    cos_half, sin_half = half_cos_sin(table, inputs.positions, spec.mrope)
    cos = expand_pairing(cos_half, spec.pairing).to(q.dtype)
    sin = expand_pairing(sin_half, spec.pairing).to(q.dtype)
    q_out = _rotate_tensor(q, inputs.q4, cos, sin, spec, inplace)
    if k is None or inputs.k4 is None:
        return q_out, None
    return q_out, _rotate_tensor(k, inputs.k4, cos, sin, spec, inplace)


def _rotate_tensor(
    x: torch.Tensor, x4: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, spec: RotationSpec, inplace: bool
) -> torch.Tensor:
    """Rotate ``x`` (token-major view ``x4`` [B, T, H, D]) by cos/sin [B, T, r] into x or a new tensor."""
    out = x if inplace else torch.empty_like(x)
    out4 = x4 if inplace else token_major(out, spec.layout, spec.head_dim, "out")
    for rows_in, rows_out, rows_cos, rows_sin in row_blocks(x4, out4, cos, sin):
        _rotate_rows(rows_in, rows_out, rows_cos, rows_sin, spec.pairing, copy=not inplace)
    return out


def _rotate_rows(
    rows_in: torch.Tensor,
    rows_out: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    pairing: Pairing,
    *,
    copy: bool,
) -> None:
    """Rotate rows [N, H, D] by cos/sin [N, r] into ``rows_out`` (which may be rows_in), chunk by chunk.

    Every per-chunk view is cut up front (one ``split`` per operand), so a chunk costs only its ops.
    """
    heads, head_dim = rows_in.shape[1:]
    if rows_in.numel() == 0:
        return
    rotary_dim = cos.shape[-1]
    tokens = max(1, GRAIN_ELEMENTS // (heads * head_dim))
    rotated = rows_out[..., :rotary_dim]
    operands = (rows_in, rows_out, rotated, *PAIR_VIEWS[pairing](rotated), cos[:, None], sin[:, None])
    chunks = list(zip(*(operand.split(tokens) for operand in operands), strict=True))  # type: ignore[no-untyped-call]
    claim = itertools.count().__next__

    def drain() -> None:
        scratch = rows_in.new_empty((tokens, heads, rotary_dim))

        def scratch_views(size: int) -> tuple[torch.Tensor, ...]:
            part = scratch[:size]
            return (part, *PAIR_VIEWS[pairing](part))

        full = scratch_views(tokens)
        while (index := claim()) < len(chunks):
            x_in, x_out, x_rot, x_first, x_second, c, s = chunks[index]
            part, part_first, part_second = full if len(x_out) == tokens else scratch_views(len(x_out))
            if copy:
                x_out.copy_(x_in)
            torch.mul(x_rot, s, out=part)
            x_rot.mul_(c)
            x_first.sub_(part_second)
            x_second.add_(part_first)

    run_on_all_threads(drain, len(chunks))
