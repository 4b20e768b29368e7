"""Validation and cos/sin lookup shared by every kernel (one place, so kernels differ only in the math)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from ropeserve.errors import InvalidInput
from ropeserve.kernels.spec import MropeSpec, RotationSpec
from ropeserve.rope.apply import check_float, from_token_major, token_major
from ropeserve.rope.tables import RopeTable

__all__ = [
    "RotationInputs",
    "from_token_major",
    "half_cos_sin",
    "position_grid",
    "prepare",
    "rotary_dim_of",
    "row_blocks",
    "token_major",
    "upload",
]


@dataclass(frozen=True)
class RotationInputs:
    """Validated token-major views of one rotation call.

    q4: [B, T, Hq, D] and k4: [B, T, Hk, D] (views of q and k); positions: [A, B, T] int64, where A is 3
    for M-RoPE and 1 otherwise (a broadcast view when the request gave one row for all of B).
    """

    q4: torch.Tensor
    k4: torch.Tensor | None
    positions: torch.Tensor
    rotary_dim: int


def rotary_dim_of(table: RopeTable) -> int:
    """Channels the table rotates: twice its frequency count."""
    return 2 * table.inv_freq.numel()


def prepare(
    q: torch.Tensor,
    k: torch.Tensor | None,
    positions: torch.Tensor,
    table: RopeTable,
    spec: RotationSpec,
    *,
    positions_to_device: bool = True,
) -> RotationInputs:
    """Check shapes, dtypes and widths; InvalidInput names the tensor at fault. The position grid is moved
    to q's device (``upload``) unless ``positions_to_device`` is False."""
    q4 = token_major(q, spec.layout, spec.head_dim, "q")
    check_float(q, "q")
    k4 = None
    if k is not None:
        k4 = token_major(k, spec.layout, spec.head_dim, "k")
        if k.dtype != q.dtype:
            raise InvalidInput(f"k has dtype {k.dtype}, q has {q.dtype}", field="k")
        if k4.shape[:2] != q4.shape[:2]:
            raise InvalidInput(f"k has batch/tokens {list(k4.shape[:2])}, q has {list(q4.shape[:2])}", field="k")
    rotary_dim = rotary_dim_of(table)
    if rotary_dim > spec.head_dim:
        raise InvalidInput(f"rotary dim {rotary_dim} exceeds head_dim {spec.head_dim}", field="rotary_dim")
    if positions_to_device:
        positions = upload(positions, q.device)
    grid = position_grid(positions, q4.shape[0], q4.shape[1], spec.mrope is not None)
    return RotationInputs(q4, k4, grid, rotary_dim)


def upload(x: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``x`` on ``device`` without stalling the host: host tensors go to a CUDA device through pinned memory
    (an asynchronous copy on the current stream; a copy from pageable memory would synchronise the stream).
    ``x`` itself when already there."""
    if x.device == device:
        return x
    if x.device.type == "cpu" and device.type == "cuda":
        return x.pin_memory().to(device, non_blocking=True)
    return x.to(device)


def position_grid(positions: torch.Tensor, batch: int, tokens: int, mrope: bool) -> torch.Tensor:
    """Positions as [A, B, T] int64: [T] or [B, T] (A=1), or [3, T] or [3, B, T] with ``mrope``."""
    rows = 3 if mrope else 1
    expected = "[3, T] or [3, B, T]" if mrope else "[T] or [B, T]"
    if positions.dtype.is_floating_point or positions.dtype.is_complex or positions.dtype == torch.bool:
        raise InvalidInput(f"positions must be integers, got {positions.dtype}", field="positions")
    grid = positions if mrope else positions[None]
    if grid.dim() == 2:
        grid = grid[:, None]
    if grid.dim() != 3 or grid.shape[0] != rows or grid.shape[2] != tokens or grid.shape[1] not in (1, batch):
        raise InvalidInput(
            f"positions must be {expected} with T={tokens} and B={batch}, got {list(positions.shape)}",
            field="positions",
        )
    return grid.to(torch.int64).expand(rows, batch, tokens)


def half_cos_sin(table: RopeTable, grid: torch.Tensor, mrope: MropeSpec | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Scaled float32 cos/sin per token: [B, T, n_freq] for ``grid`` [A, B, T].

    M-RoPE takes slot ``i`` from the position row ``mrope.slot_axes[i]`` (T, H or W).
    """
    cos, sin = table.gather_half(grid)
    if mrope is None:
        return cos[0], sin[0]
    slots = cos.shape[-1]
    pick = mrope.slot_axes(slots).to(cos.device).expand(1, *cos.shape[1:])
    return cos.gather(0, pick)[0], sin.gather(0, pick)[0]


def row_blocks(
    x4: torch.Tensor, out4: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]]:
    """[B, T, H, D] views as blocks of rows [N, H, D] with cos/sin [N, r]: one block when B·T merges."""
    if _merges_batch(x4) and _merges_batch(out4):
        yield x4.flatten(0, 1), out4.flatten(0, 1), cos.flatten(0, 1), sin.flatten(0, 1)
        return
    yield from zip(x4.unbind(0), out4.unbind(0), cos.unbind(0), sin.unbind(0), strict=True)


def _merges_batch(x4: torch.Tensor) -> bool:
    """Whether batch and token dims of a [B, T, H, D] view flatten into one strided dim without a copy."""
    batch, tokens = x4.shape[:2]
    return batch == 1 or tokens == 1 or x4.stride(0) == tokens * x4.stride(1)
