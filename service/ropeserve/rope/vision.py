"""2-D rotary of the Qwen-VL vision towers (spec §6): h and w angles side by side, NeoX-duplicated.

For head size ``D``: ``q = D/2`` rotary slots per axis pair, ``inv_i = 1/θ^(2i/q)`` for ``i < q/2``;
cos = ``cat(cos(h·inv), cos(w·inv))`` duplicated to ``D`` channels. Always float32, attention factor 1.
"""

from __future__ import annotations

import torch

from ropeserve.config.validate import MAX_HEAD_DIM
from ropeserve.errors import InvalidInput
from ropeserve.rope.registry import base_inv_freq


def vision_cos_sin(hw_ids: torch.Tensor, head_dim: int, theta: float = 10_000.0) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin [N, head_dim] float32 for patch ids ``hw_ids`` [N, 2] (row, column)."""
    if not 0 < head_dim <= MAX_HEAD_DIM or head_dim % 4:
        raise InvalidInput(
            f"vision head_dim must be a multiple of 4 in 4..{MAX_HEAD_DIM}, got {head_dim}", field="head_dim"
        )
    if not theta > 0:
        raise InvalidInput(f"theta must be > 0, got {theta}", field="theta")
    inv_freq = base_inv_freq(theta, head_dim // 2)
    angles = (hw_ids.to(torch.float32)[..., None] * inv_freq).flatten(-2)
    emb = torch.cat((angles, angles), dim=-1)
    return emb.cos(), emb.sin()
