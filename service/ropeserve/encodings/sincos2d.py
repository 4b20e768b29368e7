"""Fixed 2-D sin-cos position tables for ViT/MAE patch grids.

For a grid of ``H x W`` patches and width ``d`` (a multiple of 4), patch ``(h, w)`` sits at row ``h·W + w``
(row-major, height outer) of a [H·W, d] table. With ``ω_i = 1 / base^(i / (d/4))``, ``i < d/4``, and ``a``/``b``
the first/second axis coordinate, each row is ``[sin(a·ω) | cos(a·ω) | sin(b·ω) | cos(b·ω)]``: half the
channels for one axis, half for the other. Computed in float64 (MAE's numpy, transformers' helper), then cast.

``first_axis`` picks which coordinate takes the first half:

* ``h`` (default): transformers 5.24 ``vit_mae.build_2d_sinusoidal_position_embedding``.
* ``w``: the original MAE code (facebookresearch/mae ``get_2d_sincos_pos_embed``), whose
  ``np.meshgrid(grid_w, grid_h)`` puts the column coordinate first; its released checkpoints carry this table.

``cls_token`` prepends one row of zeros (the class token has no grid position): [1 + H·W, d].
"""

from __future__ import annotations

from typing import Literal

import torch

from ropeserve.errors import InvalidInput

GridAxis = Literal["h", "w"]


def _sin_cos(coordinates: torch.Tensor, frequencies: torch.Tensor) -> torch.Tensor:
    """``[sin(c·ω) | cos(c·ω)]`` for coordinates [M] and frequencies [F]: [M, 2F]."""
    angles = coordinates[:, None] * frequencies[None, :]
    return torch.cat([torch.sin(angles), torch.cos(angles)], dim=1)


def sincos_2d_table(
    grid_h: int,
    grid_w: int,
    dim: int,
    *,
    base: float = 10000.0,
    cls_token: bool = False,
    first_axis: GridAxis = "h",
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """The 2-D sin-cos table: [(1 if cls_token) + grid_h·grid_w, dim] in ``dtype`` (see the module docstring)."""
    if dim < 4 or dim % 4:
        raise InvalidInput(f"dim must be a positive multiple of 4 (got {dim})", field="dim")
    if base <= 0:
        raise InvalidInput(f"base must be > 0 (got {base})", field="base")
    quarter = dim // 4
    frequencies = 1.0 / base ** (torch.arange(quarter, dtype=torch.float64) / quarter)
    rows, columns = torch.meshgrid(
        torch.arange(grid_h, dtype=torch.float64), torch.arange(grid_w, dtype=torch.float64), indexing="ij"
    )
    coordinates = {"h": rows.flatten(), "w": columns.flatten()}
    second_axis = "w" if first_axis == "h" else "h"
    halves = [_sin_cos(coordinates[axis], frequencies) for axis in (first_axis, second_axis)]
    if cls_token:
        halves = [torch.cat([torch.zeros(1, dim // 2, dtype=torch.float64), half]) for half in halves]
    return torch.cat(halves, dim=1).to(dtype)
