"""Vision-tower 2-D rotary position ids (Qwen2-VL ViT; the same scheme in Qwen2.5-VL, Qwen3-VL and GLM-4V)."""

from __future__ import annotations

import torch

from ropeserve.errors import InvalidInput
from ropeserve.positions._common import IntsLike, as_long_tensor, check_element_limit

__all__ = ["vision_position_ids"]


def vision_position_ids(
    grid_thw: IntsLike,
    spatial_merge_size: int | IntsLike,
    *,
    max_tokens: int | None = None,
) -> torch.Tensor:
    """``(h, w)`` patch coordinates of every ViT token -> ``[N, 2]`` int64, ``N = sum(t * h * w)``.

    For each grid ``(t, h, w)`` (patch units) the ``h x w`` patches are ordered by merge blocks: the ``m x m`` blocks
    in raster order, raster order inside each block. The frame is repeated ``t`` times (no temporal axis in the
    ViT); grids are concatenated in order. Matches ``transformers.vision_utils.get_vision_position_ids``.

    Args:
        grid_thw: ``[G, 3]`` patch grids.
        spatial_merge_size: ``m``, one int or ``[G]`` (one per grid); must divide every ``h`` and ``w``.
        max_tokens: optional limit on ``N`` (raises ``LimitExceeded`` before allocating).

    Raises:
        InvalidInput naming ``grid_thw[i]`` for an empty grid or one that ``m`` does not divide.
    """
    grid = as_long_tensor(grid_thw, "grid_thw")
    if grid.numel() == 0:
        return torch.zeros((0, 2), dtype=torch.long, device=grid.device)
    if grid.dim() != 2 or grid.shape[1] != 3:
        raise InvalidInput(f"grid_thw must have shape [G, 3], got {tuple(grid.shape)}", field="grid_thw")
    merge = _merge_per_grid(spatial_merge_size, grid.shape[0], grid.device)
    _check_grids(grid, merge)
    total = sum(t * h * w for t, h, w in grid.tolist())  # Python ints: no overflow before the limit check
    check_element_limit(total, max_tokens, "vision positions", field="grid_thw")
    t, h, w = grid.unbind(dim=1)
    tokens_per_grid = t * h * w

    grid_of_token = torch.repeat_interleave(torch.arange(grid.shape[0], device=grid.device), tokens_per_grid)
    grid_first_token = tokens_per_grid.cumsum(0) - tokens_per_grid
    offset = torch.arange(grid_of_token.numel(), device=grid.device) - grid_first_token[grid_of_token]
    m = merge[grid_of_token]
    frame_size = (h * w)[grid_of_token]
    blocks_per_row = (w // merge)[grid_of_token]
    in_frame = offset % frame_size
    block, in_block = in_frame // (m * m), in_frame % (m * m)
    block_row, block_col = block // blocks_per_row, block % blocks_per_row
    rows = block_row * m + in_block // m
    cols = block_col * m + in_block % m
    return torch.stack([rows, cols], dim=1)


def _merge_per_grid(spatial_merge_size: int | IntsLike, count: int, device: torch.device) -> torch.Tensor:
    if isinstance(spatial_merge_size, int) and not isinstance(spatial_merge_size, bool):
        return torch.full((count,), spatial_merge_size, dtype=torch.long, device=device)
    merge = as_long_tensor(spatial_merge_size, "spatial_merge_size", device=device).reshape(-1)
    if merge.numel() != count:
        raise InvalidInput(
            f"spatial_merge_size needs one value per grid ({count}), got {merge.numel()}", field="spatial_merge_size"
        )
    return merge


def _check_grids(grid: torch.Tensor, merge: torch.Tensor) -> None:
    bad_merge = merge < 1
    if bool(bad_merge.any()):
        index = int(bad_merge.nonzero()[0, 0])
        raise InvalidInput(
            f"spatial_merge_size[{index}] is {int(merge[index])}; it must be >= 1",
            field=f"spatial_merge_size[{index}]",
        )
    empty = (grid < 1).any(dim=1)
    if bool(empty.any()):
        index = int(empty.nonzero()[0, 0])
        raise InvalidInput(
            f"grid_thw[{index}] = {grid[index].tolist()} has a zero or negative size", field=f"grid_thw[{index}]"
        )
    ragged = (grid[:, 1] % merge != 0) | (grid[:, 2] % merge != 0)
    if bool(ragged.any()):
        index = int(ragged.nonzero()[0, 0])
        raise InvalidInput(
            f"grid_thw[{index}] = {grid[index].tolist()}: h and w must be multiples of the merge size "
            f"{int(merge[index])}",
            field=f"grid_thw[{index}]",
        )
