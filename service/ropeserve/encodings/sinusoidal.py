"""Sinusoidal absolute position tables (Vaswani et al. 2017 and the tensor2tensor/fairseq variant).

For ``positions`` p [N] and width ``d`` the table is [N, d] built from frequencies ``ω`` [F]:

* ``vaswani`` (XLM, DistilBERT, Marian): ``ω_i = 1 / base^(2i/d)``, ``F = ceil(d/2)``; angles ``p / base^(2i/d)``
  in float64 (those models build the table with numpy float64), sin columns use all F frequencies and cos
  columns the first ``floor(d/2)``. An odd ``d`` therefore ends with one extra sin column.
* ``tensor2tensor`` (fairseq, FSMT, Speech2Text, M2M100, Whisper's ``sinusoids``):
  ``ω_i = exp(-i · ln(base) / (d/2 - 1))``, ``F = floor(d/2)``, angles ``p · ω`` in float32 as those models
  compute them; an odd ``d`` ends with one zero column. Needs ``d >= 4``.

Layouts place the sin/cos columns:

* ``interleaved``: ``PE[p, 2i] = sin(p·ω_i)``, ``PE[p, 2i+1] = cos(p·ω_i)`` (the paper's formula).
* ``concat``: ``[sin(p·ω_0..) | cos(p·ω_0..)]`` (Marian, fairseq, Whisper).

Continuation: the table for positions ``start .. start+n-1`` is exactly those rows of a longer table, because
each row depends on its own position only.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch

from ropeserve.errors import InvalidInput

SinusoidalLayout = Literal["interleaved", "concat"]
SinusoidalSchedule = Literal["vaswani", "tensor2tensor"]


@dataclass(frozen=True)
class FrequencySchedule:
    """How a schedule spaces its frequencies, and the float precision its reference models compute in."""

    angles: Callable[[torch.Tensor, int, float], torch.Tensor]
    """``(positions [N] int64, dim, base) -> angles [N, F]`` in ``compute_dtype``."""
    compute_dtype: torch.dtype
    min_dim: int


def _vaswani_angles(positions: torch.Tensor, dim: int, base: float) -> torch.Tensor:
    """``p / base^(2i/d)`` for ``i < ceil(d/2)``, float64 (numpy's float64 in XLM/DistilBERT/Marian).  [N, F]"""
    exponents = torch.arange(0, dim, 2, dtype=torch.float64) / dim
    return positions.to(torch.float64)[:, None] / torch.pow(base, exponents)[None, :]


def _tensor2tensor_angles(positions: torch.Tensor, dim: int, base: float) -> torch.Tensor:
    """``p · exp(-i · ln(base) / (d/2 - 1))`` for ``i < floor(d/2)``, float32 (fairseq's torch code).  [N, F]"""
    half = dim // 2
    step = math.log(base) / (half - 1)
    frequencies = torch.exp(torch.arange(half, dtype=torch.int64).float() * -step)
    return positions.float()[:, None] * frequencies[None, :]


SCHEDULES: dict[str, FrequencySchedule] = {
    "vaswani": FrequencySchedule(_vaswani_angles, torch.float64, min_dim=1),
    "tensor2tensor": FrequencySchedule(_tensor2tensor_angles, torch.float32, min_dim=4),
}


def _interleaved(sin: torch.Tensor, cos: torch.Tensor, out: torch.Tensor) -> None:
    out[:, 0 : 2 * sin.shape[1] : 2] = sin
    out[:, 1 : 2 * cos.shape[1] : 2] = cos


def _concat(sin: torch.Tensor, cos: torch.Tensor, out: torch.Tensor) -> None:
    out[:, : sin.shape[1]] = sin
    out[:, sin.shape[1] : sin.shape[1] + cos.shape[1]] = cos


LAYOUTS: dict[str, Callable[[torch.Tensor, torch.Tensor, torch.Tensor], None]] = {
    "interleaved": _interleaved,
    "concat": _concat,
}
"""Writers placing sin [N, S] and cos [N, C] columns into a zero table [N, d]; unwritten columns stay 0."""


def sinusoidal_table(
    positions: torch.Tensor,
    dim: int,
    *,
    base: float = 10000.0,
    layout: SinusoidalLayout = "interleaved",
    schedule: SinusoidalSchedule = "vaswani",
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """The sinusoidal table for int64 ``positions`` [N]: [N, dim] in ``dtype`` (see the module docstring)."""
    plan = SCHEDULES[schedule]
    if dim < plan.min_dim:
        raise InvalidInput(f"the {schedule} schedule needs dim >= {plan.min_dim} (got {dim})", field="dim")
    if base <= 0:
        raise InvalidInput(f"base must be > 0 (got {base})", field="base")
    angles = plan.angles(positions, dim, base)
    sin_columns = angles.shape[1]
    cos_columns = min(sin_columns, dim - sin_columns)
    table = torch.zeros(positions.shape[0], dim, dtype=plan.compute_dtype)
    LAYOUTS[layout](torch.sin(angles), torch.cos(angles[:, :cos_columns]), table)
    return table.to(dtype)
