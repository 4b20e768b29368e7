"""Rotation with cos/sin tables the caller sends, their difference from ropeserve's own, and the vision tower's
rotation of q/k.

Engines keep a cos/sin cache and gather rows by position: vLLM and SGLang a ``cos_sin_cache`` ``[N, rotary_dim]``
(cos half, then sin half), transformers-style code separate ``cos`` / ``sin`` (``rotary_dim / 2`` wide, or
``rotary_dim`` wide in the pairing's layout). ``CallerTable`` makes such rows a fixed ``RopeTable``, so every
rotation kernel (and the M-RoPE slot map) rotates with them exactly as with ropeserve's own rows; comparing the
table with ropeserve's for the same parameters tells an engine whether a wrong answer comes from its cache or its
kernel.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from ropeserve.config import RopeParams
from ropeserve.errors import InvalidInput
from ropeserve.rope.apply import check_float, rotate_neox
from ropeserve.rope.tables import Pairing, RopeTable, TableCache, effective_length

__all__ = [
    "TABLE_TENSORS",
    "CallerTable",
    "TableDifference",
    "caller_table",
    "check_covers",
    "compare_table",
    "has_caller_table",
    "vision_rotate",
]

TABLE_TENSORS = ("cos_sin_cache", "cos", "sin")
"""Names of the caller's table tensors in a rotation body: ``cos_sin_cache``, or ``cos`` and ``sin``."""


def has_caller_table(tensors: Mapping[str, torch.Tensor]) -> bool:
    """Whether a rotation body carries a table of the caller's."""
    return any(name in tensors for name in TABLE_TENSORS)


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
    tensors: Mapping[str, torch.Tensor], rotary_dim: int, pairing: Pairing
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(cos, sin)`` each ``[N, rotary_dim/2]`` (the caller's dtype) from ``cos_sin_cache`` or ``cos`` + ``sin``;
    views, no copy. InvalidInput names the tensor of a wrong dtype, shape or combination."""
    for name in TABLE_TENSORS:
        if name in tensors:
            check_float(tensors[name], name)
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
    max_growth: int | None = None,
) -> TableDifference:
    """Compare ``[N, rotary_dim/2]`` caller rows (row ``p`` = position ``p``) with ropeserve's.

    Length-dependent types (dynamic NTK, LongRoPE) are compared at the table's own length ``N`` (as an engine
    builds its cache once for its serving length). ropeserve's half rows come from ``cache`` (the service's
    table cache, so repeated requests do not recompute them) unless covering ``N`` rows would grow its table by
    more than ``max_growth`` elements (cos + sin; the table grows to a power of two), or, without one, straight
    from the formula: the same float32 products either way.
    """
    rows = cos.shape[0]
    if rows == 0:
        return TableDifference(0, 0.0, False, None, atol)
    seq_len, device, positions = effective_length(params, rows - 1), torch.device("cpu"), torch.arange(rows)
    table = None if cache is None else cache.get(params, seq_len, device)
    if table is not None and (max_growth is None or table.growth_elements(rows - 1) <= max_growth):
        own_half = table.gather_half(positions)
    else:
        own_half = RopeTable.build(params, seq_len, device).compute_half(positions)
    half = cos.shape[1]
    own_cos, own_sin = (own[:, :half] for own in own_half)  # [N, half] each
    difference = torch.maximum((cos.float() - own_cos).abs(), (sin.float() - own_sin).abs())
    finite = torch.isfinite(difference)
    per_row = torch.where(finite, difference, torch.zeros_like(difference)).amax(dim=1)
    differs = (per_row > atol) | ~finite.all(dim=1)
    beyond = differs.nonzero()
    first = int(beyond[0, 0]) if beyond.numel() else None
    return TableDifference(rows, float(per_row.max()), not bool(finite.all()), first, atol)


@dataclass
class CallerTable(RopeTable):
    """The caller's rows as a fixed table: ``rows`` (cos, sin) ``[N, n_freq]`` float32 on the compute device, the
    caller's scaling included (``attention_factor`` 1). It never grows and computes nothing: its frequencies are
    unknown (NaN), every position reads its row, and a position past the rows is the caller's error, refused
    before any kernel runs (``check_covers``)."""

    @classmethod
    def of(cls, cos: torch.Tensor, sin: torch.Tensor, device: torch.device) -> CallerTable:
        """From ``caller_table``'s half rows ``[N, n_freq]`` (any float dtype; float32 holds them exactly)."""
        unknown = torch.full((cos.shape[1],), float("nan"), device=device)
        rows = (cos.to(device, torch.float32), sin.to(device, torch.float32))
        return cls(unknown, 1.0, rows)

    @property
    def row_cap(self) -> int:
        return self.rows[0].shape[0]

    def compute_half(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows ``positions`` of the caller's table (``check_covers`` has refused any past its end)."""
        cos, sin = self.rows
        positions = positions.to(cos.device)
        return cos[positions], sin[positions]


def check_covers(rows: int, max_position: int) -> None:
    """Refuse positions (already known to be ≥ 0) past the last of a caller's table's ``rows``."""
    if max_position >= rows:
        raise InvalidInput(
            f"positions must index the table's {rows} rows: got position {max_position}", field="positions"
        )


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
