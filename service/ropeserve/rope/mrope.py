"""M-RoPE cos/sin: per-axis (T, H, W) angles merged slot by slot (spec §5.5).

Chunked layout (Qwen2-VL, Qwen2.5-VL, GLM-4V): slots ``[0, s0)`` take T, ``[s0, s0+s1)`` H, the rest W.
Interleaved layout (Qwen3-VL): slot ``i`` takes H if ``i % 3 == 1 and i < 3·s1``, W if ``i % 3 == 2 and
i < 3·s2``, else T. Works with any rope type of the registry (e.g. YaRN + sections).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from ropeserve.config import RopeParams
from ropeserve.config.families import MropeLayout
from ropeserve.rope.tables import (
    DEFAULT_CACHE,
    CosSin,
    Pairing,
    RopeTable,
    TableCache,
    cast_with_error,
    effective_length,
    expand_pairing,
)


def _chunked_axes(section: Sequence[int], slots: int) -> torch.Tensor:
    return torch.repeat_interleave(torch.arange(3), torch.tensor(list(section)))[:slots]


def _interleaved_axes(section: Sequence[int], slots: int) -> torch.Tensor:
    index = torch.arange(slots)
    axes = torch.zeros(slots, dtype=torch.int64)
    axes[(index % 3 == 1) & (index < 3 * section[1])] = 1
    axes[(index % 3 == 2) & (index < 3 * section[2])] = 2
    return axes


SLOT_LAYOUTS: dict[str, Callable[[Sequence[int], int], torch.Tensor]] = {
    "chunked": _chunked_axes,
    "interleaved": _interleaved_axes,
}


def slot_axes(section: Sequence[int], layout: MropeLayout, slots: int) -> torch.Tensor:
    """Axis id (0=T, 1=H, 2=W) of each of the ``slots`` frequency slots: [slots] int64."""
    return SLOT_LAYOUTS[layout](section, slots)


def mrope_cos_sin(
    params: RopeParams,
    position_ids: torch.Tensor,
    *,
    pairing: Pairing = "neox",
    dtype: torch.dtype = torch.float32,
    cache: TableCache | None = DEFAULT_CACHE,
    device: torch.device | str = "cpu",
) -> CosSin:
    """cos/sin for 3-row positions ``position_ids`` [3, *shape] -> [*shape, rotary_dim].

    Requires ``params.mrope_section``; each slot's value comes from its axis' positions.
    """
    if params.mrope_section is None or params.mrope_layout is None:
        raise ValueError("mrope_cos_sin needs params with mrope_section")
    device = torch.device(device)
    max_position = int(position_ids.max()) if position_ids.numel() else 0
    seq_len = effective_length(params, max_position)
    table = cache.get(params, seq_len, device) if cache is not None else RopeTable.build(params, seq_len, device)
    cos_axes, sin_axes = table.compute_half(position_ids)
    slots = cos_axes.shape[-1]
    axes = slot_axes(params.mrope_section, params.mrope_layout, slots).to(device)
    pick = axes.view(1, *([1] * (cos_axes.dim() - 2)), slots).expand(1, *cos_axes.shape[1:])
    cos_half = cos_axes.gather(0, pick)[0]
    sin_half = sin_axes.gather(0, pick)[0]
    cos, sin, error = cast_with_error(expand_pairing(cos_half, pairing), expand_pairing(sin_half, pairing), dtype)
    return CosSin(cos, sin, table.attention_factor, table.inv_freq, error)
