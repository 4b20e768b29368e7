"""Resample a learned absolute position table to a new grid (ViT 2-D grids, BERT/GPT-2 1-D tables).

Input ``table``: [P + H·W, D] or [1, P + H·W, D]: ``P`` prefix rows (class/distillation/register tokens), then the
grid in row-major order (height outer). A 1-D table of ``N`` positions is the grid ``[N]``, handled as a 1 x N
grid. Output: the same layout for the target grid, in the input dtype, with the prefix rows copied unchanged.

The grid is reshaped to [1, D, H, W] and passed to ``torch.nn.functional.interpolate(size=target, mode, align_corners,
antialias)`` in float32 (float64 for float64 tables), then cast back. On a 1 x N grid ``bilinear`` is exactly 1-D
``linear`` interpolation (the height weight is 1) and ``bicubic`` is 1-D cubic convolution.

Modes: ``bicubic`` (default for 2-D grids), ``bilinear``, ``linear`` (its 1-D name; default for 1-D tables),
``nearest`` and ``nearest-exact``. ``align_corners`` defaults to ``False``, as in ViT's
``interpolate_pos_encoding`` (transformers, DINO/DINOv2) and timm's ``resample_abs_pos_embed``: the grid cells'
centres are mapped, so the table stretches over the same image area; ``True`` pins the corner cells instead.
``antialias`` (bilinear/bicubic only) low-pass filters when downsampling.

Non-finite values (NaN, ±inf) are rejected: interpolation would spread them over their neighbours.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ropeserve.errors import InvalidInput


@dataclass(frozen=True)
class InterpolationMode:
    torch_mode: str
    smooth: bool
    """Whether the mode interpolates (accepts ``align_corners`` and ``antialias``) rather than copies."""


RESAMPLE_MODES: dict[str, InterpolationMode] = {
    "bicubic": InterpolationMode("bicubic", smooth=True),
    "bilinear": InterpolationMode("bilinear", smooth=True),
    "linear": InterpolationMode("bilinear", smooth=True),
    "nearest": InterpolationMode("nearest", smooth=False),
    "nearest-exact": InterpolationMode("nearest-exact", smooth=False),
}
DEFAULT_MODES: dict[int, str] = {1: "linear", 2: "bicubic"}
"""Default mode by grid rank."""


def grid_2d(grid: Sequence[int], field: str) -> tuple[int, int]:
    """``[H, W]`` -> ``(H, W)``; a 1-D length ``[N]`` -> ``(1, N)``."""
    if len(grid) not in DEFAULT_MODES or any(size < 1 for size in grid):
        raise InvalidInput(f"{field} must be [length] or [height, width] of sizes >= 1 (got {list(grid)})", field=field)
    return (1, grid[0]) if len(grid) == 1 else (grid[0], grid[1])


def resolve_mode(mode: str | None, rank: int) -> InterpolationMode:
    """The interpolation for ``mode`` (``None``: the default for a grid of ``rank`` dimensions)."""
    name = mode or DEFAULT_MODES[rank]
    if name not in RESAMPLE_MODES:
        raise InvalidInput(f"unknown mode {name!r}; choose from {sorted(RESAMPLE_MODES)}", field="mode")
    return RESAMPLE_MODES[name]


def _check_table(table: torch.Tensor, grid_rows: int, prefix_rows: int) -> None:
    if table.dim() not in (2, 3) or (table.dim() == 3 and table.shape[0] != 1):
        raise InvalidInput(f"table must be [rows, D] or [1, rows, D] (got {list(table.shape)})", field="table")
    if not table.is_floating_point():
        raise InvalidInput(f"table must be a floating-point tensor (got {table.dtype})", field="table")
    if table.shape[-1] == 0:
        raise InvalidInput(f"table has no columns (shape {list(table.shape)}): D must be >= 1", field="table")
    if prefix_rows < 0:
        raise InvalidInput(f"prefix_rows must be >= 0 (got {prefix_rows})", field="prefix_rows")
    rows = table.shape[-2]
    if rows != prefix_rows + grid_rows:
        raise InvalidInput(
            f"table has {rows} rows but prefix_rows + source grid = {prefix_rows} + {grid_rows}", field="table"
        )
    if not bool(torch.isfinite(table).all()):
        raise InvalidInput("table contains NaN or infinite values", field="table")


def _check_options(interpolation: InterpolationMode, antialias: bool, align_corners: bool | None) -> None:
    if interpolation.smooth:
        return
    if antialias:
        raise InvalidInput(f"antialias needs bilinear or bicubic, not {interpolation.torch_mode}", field="antialias")
    if align_corners is not None:
        raise InvalidInput(f"align_corners does not apply to {interpolation.torch_mode}", field="align_corners")


def resample_table(
    table: torch.Tensor,
    source_grid: Sequence[int],
    target_grid: Sequence[int],
    *,
    prefix_rows: int = 0,
    mode: str | None = None,
    antialias: bool = False,
    align_corners: bool | None = None,
) -> torch.Tensor:
    """``table`` resampled from ``source_grid`` to ``target_grid`` (both ``[N]`` or ``[H, W]``, same rank).

    Shapes: [P + prod(source), D] -> [P + prod(target), D] (a leading batch dimension of 1 is kept); dtype kept.
    """
    if len(source_grid) != len(target_grid):
        raise InvalidInput("target_grid must have as many dimensions as source_grid", field="target_grid")
    source_h, source_w = grid_2d(source_grid, "source_grid")
    target_h, target_w = grid_2d(target_grid, "target_grid")
    interpolation = resolve_mode(mode, len(source_grid))
    _check_options(interpolation, antialias, align_corners)
    _check_table(table, source_h * source_w, prefix_rows)
    rows = table.reshape(table.shape[-2:])
    width = rows.shape[1]
    compute_dtype = torch.float64 if table.dtype == torch.float64 else torch.float32
    image = rows[prefix_rows:].to(compute_dtype).reshape(1, source_h, source_w, width).permute(0, 3, 1, 2)
    resized = F.interpolate(
        image,
        size=(target_h, target_w),
        mode=interpolation.torch_mode,
        align_corners=(align_corners or False) if interpolation.smooth else None,
        antialias=antialias,
    )
    grid_rows = resized.permute(0, 2, 3, 1).reshape(target_h * target_w, width).to(table.dtype)
    result = torch.cat([rows[:prefix_rows], grid_rows])
    return result.reshape(*table.shape[:-2], *result.shape)
