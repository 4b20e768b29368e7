"""Rotation with cos/sin tables the caller sends, their difference from ropeserve's own, and the vision tower's
rotation of q/k.

Engines keep a cos/sin cache and gather rows by position: vLLM and SGLang a ``cos_sin_cache`` ``[N, rotary_dim]``
(cos half, then sin half), transformers-style code separate ``cos`` / ``sin`` (``rotary_dim / 2`` wide, or
``rotary_dim`` wide in the pairing's layout). Rotating with the caller's table and comparing the table with
ropeserve's own for the same parameters tells an engine whether a wrong answer comes from its cache or its kernel.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from ropeserve.config import RopeParams
from ropeserve.errors import InvalidInput
from ropeserve.rope.apply import Layout, apply_rotary, rotate_neox
from ropeserve.rope.tables import Pairing, RopeTable, TableCache, effective_length, expand_pairing

__all__ = [
    "TableDifference",
    "TableLayout",
    "caller_table",
    "compare_table",
    "rotate_with_table",
    "vision_rotate",
]

TableLayout = Layout | Literal["batched_flat"]
"""The rotation layouts plus vLLM's ``[batch, tokens, heads*head_dim]`` (``batched_flat``)."""


def _half(table: torch.Tensor, pairing: Pairing, rotary_dim: int, name: str) -> torch.Tensor:
    """``[N, rotary_dim/2]`` from a half-width table or a full-width one in the pairing's layout."""
    if table.dim() != 2 or table.shape[1] not in (rotary_dim // 2, rotary_dim):
        raise InvalidInput(
            f"{name} must be [rows, {rotary_dim // 2}] or [rows, {rotary_dim}] (rotary_dim {rotary_dim}), "
            f"got {list(table.shape)}",
            field=name,
        )
    if table.shape[1] == rotary_dim // 2:
        return table
    return table[:, : rotary_dim // 2] if pairing == "neox" else table[:, 0::2]


def caller_table(
    tensors: dict[str, torch.Tensor], rotary_dim: int, pairing: Pairing
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(cos, sin)`` each ``[N, rotary_dim/2]`` (the caller's dtype) from ``cos_sin_cache`` or ``cos`` + ``sin``."""
    if "cos_sin_cache" in tensors:
        if "cos" in tensors or "sin" in tensors:
            raise InvalidInput("send cos_sin_cache or cos and sin, not both", field="cos_sin_cache")
        cache = tensors["cos_sin_cache"]
        if cache.dim() != 2 or cache.shape[1] != rotary_dim:
            raise InvalidInput(
                f"cos_sin_cache must be [rows, rotary_dim={rotary_dim}] (cos half, then sin half), "
                f"got {list(cache.shape)}",
                field="cos_sin_cache",
            )
        return cache[:, : rotary_dim // 2], cache[:, rotary_dim // 2 :]
    if "cos" not in tensors or "sin" not in tensors:
        raise InvalidInput("send cos_sin_cache, or cos and sin", field="cos_sin_cache")
    cos = _half(tensors["cos"], pairing, rotary_dim, "cos")
    sin = _half(tensors["sin"], pairing, rotary_dim, "sin")
    if cos.shape != sin.shape:
        raise InvalidInput(f"cos {list(cos.shape)} and sin {list(sin.shape)} differ in shape", field="sin")
    return cos, sin


@dataclass(frozen=True)
class TableDifference:
    """The caller's table against ropeserve's own (float32, attention factor applied) for the same parameters."""

    rows: int
    max_abs_error: float
    """Largest finite ``|caller - ropeserve|`` over cos and sin (float32, after casting the caller's values)."""
    non_finite: bool
    """Whether the caller's table holds NaN or infinite values (their rows count as differing)."""
    first_differing_position: int | None
    """First row whose difference exceeds ``atol``; None when none does."""
    atol: float

    def as_dict(self) -> dict[str, object]:
        return {
            "rows": self.rows,
            "max_abs_error": self.max_abs_error,
            "non_finite": self.non_finite,
            "first_differing_position": self.first_differing_position,
            "atol": self.atol,
        }


def compare_table(
    params: RopeParams,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    atol: float = 0.0,
    cache: TableCache | None = None,
) -> TableDifference:
    """Compare ``[N, rotary_dim/2]`` caller rows (row ``p`` = position ``p``) with ropeserve's.

    Length-dependent types (dynamic NTK, LongRoPE) are compared at the table's own length ``N`` (as an engine
    builds its cache once for its serving length). ropeserve's half rows come from ``cache`` (the service's
    table cache, so repeated requests do not recompute them) or, without one, straight from the formula: the
    same float32 products either way.
    """
    rows = cos.shape[0]
    if rows == 0:
        return TableDifference(0, 0.0, False, None, atol)
    seq_len, device, positions = effective_length(params, rows - 1), torch.device("cpu"), torch.arange(rows)
    if cache is None:
        own_half = RopeTable.build(params, seq_len, device).compute_half(positions)
    else:
        own_half = cache.get(params, seq_len, device).gather_half(positions)
    half = cos.shape[1]
    own_cos, own_sin = (own[:, :half] for own in own_half)  # [N, half] each
    difference = torch.maximum((cos.float() - own_cos).abs(), (sin.float() - own_sin).abs())
    finite = torch.isfinite(difference)
    per_row = torch.where(finite, difference, torch.zeros_like(difference)).amax(dim=1)
    differs = (per_row > atol) | ~finite.all(dim=1)
    beyond = differs.nonzero()
    first = int(beyond[0, 0]) if beyond.numel() else None
    return TableDifference(rows, float(per_row.max()), not bool(finite.all()), first, atol)


def _positions_in(positions: torch.Tensor, rows: int) -> torch.Tensor:
    if positions.dim() not in (1, 2):
        raise InvalidInput(f"positions must be [T] or [B, T], got {list(positions.shape)}", field="positions")
    if positions.is_floating_point():
        raise InvalidInput(f"positions must be int32 or int64, got {positions.dtype}", field="positions")
    positions = positions.long()
    if positions.numel() and (int(positions.min()) < 0 or int(positions.max()) >= rows):
        raise InvalidInput(
            f"positions must index the table's {rows} rows: got {int(positions.min())}..{int(positions.max())}",
            field="positions",
        )
    return positions


def _view_batched_flat(x: torch.Tensor, head_dim: int, name: str) -> torch.Tensor:
    if x.dim() != 3 or x.shape[-1] % head_dim:
        raise InvalidInput(
            f"{name} in layout 'batched_flat' must be [batch, tokens, heads*head_dim] with a multiple of head_dim "
            f"{head_dim}, got {list(x.shape)}",
            field=name,
        )
    return x.view(x.shape[0], x.shape[1], x.shape[2] // head_dim, head_dim)


def rotate_with_table(
    q: torch.Tensor,
    k: torch.Tensor | None,
    positions: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    head_dim: int,
    layout: TableLayout,
    pairing: Pairing,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Rotate q (and k) with rows ``positions`` of the caller's half tables, in q's dtype (transformers' formula;
    vLLM's ``forward_native`` gives the same products). ``positions`` ``[T]`` or ``[B, T]``."""
    index = _positions_in(positions, cos.shape[0])
    cos_rows = expand_pairing(cos[index], pairing)
    sin_rows = expand_pairing(sin[index], pairing)
    if layout != "batched_flat":
        return apply_rotary(q, k, cos_rows, sin_rows, head_dim=head_dim, layout=layout, pairing=pairing)
    q4 = _view_batched_flat(q, head_dim, "q")
    k4 = None if k is None else _view_batched_flat(k, head_dim, "k")
    q_out, k_out = apply_rotary(q4, k4, cos_rows, sin_rows, head_dim=head_dim, layout="bthd", pairing=pairing)
    return q_out.reshape(q.shape), None if k_out is None or k is None else k_out.reshape(k.shape)


def vision_rotate(
    q: torch.Tensor, k: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The Qwen-VL vision towers' rotation (transformers ``apply_rotary_pos_emb_vision``): q/k ``[N, heads, D]``,
    cos/sin ``[N, D]``; computed in float32 with rotate-half, cast back to each tensor's dtype."""
    tokens, width = cos.shape
    for name, x in (("q", q), ("k", k)):
        if x is not None and (x.dim() != 3 or x.shape[0] != tokens or x.shape[2] != width):
            raise InvalidInput(
                f"{name} must be [patches={tokens}, heads, head_dim={width}], got {list(x.shape)}", field=name
            )
    cos3, sin3 = cos.unsqueeze(-2).float(), sin.unsqueeze(-2).float()

    def one(x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        return ((x32 * cos3) + (rotate_neox(x32) * sin3)).to(x.dtype)

    return one(q), None if k is None else one(k)
