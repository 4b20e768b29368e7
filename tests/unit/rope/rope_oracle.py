"""transformers 5.24 as the oracle for the rope math: config builders, rotary modules, cos/sin and rotation.

Helpers only (no tests). Every config is built twice from one dict: by transformers' own config class (the
oracle) and by ``normalize_config`` (ours), so both sides see exactly the same inputs.
"""

from __future__ import annotations

from typing import Any

import torch
from hf_oracle import ROTARY_BY_TEXT_MODEL_TYPE, hf_rotary, hf_text_config, load_fixture, with_rope_scaling
from transformers import PreTrainedConfig

from ropeserve.config import NormalizedConfig, normalize_config

__all__ = [
    "ROTARY_BY_TEXT_MODEL_TYPE",
    "both",
    "gptj_from_neox",
    "hf_cos_sin",
    "hf_rotary",
    "load_fixture",
    "with_rope_scaling",
]


def both(config: dict[str, Any]) -> tuple[NormalizedConfig, PreTrainedConfig]:
    """``(ours, transformers')`` for one config dict."""
    return normalize_config(config), hf_text_config(config)


def hf_cos_sin(
    module: torch.nn.Module,
    position_ids: torch.Tensor,
    dtype: torch.dtype = torch.float32,
    layer_type: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The module's forward for ``position_ids`` ([B, T], or [3, B, T] for M-RoPE); x only carries the dtype."""
    x = torch.zeros(1, dtype=dtype)
    if layer_type is not None:
        return module(x, position_ids, layer_type=layer_type)
    return module(x, position_ids)


def gptj_from_neox(cos: torch.Tensor) -> torch.Tensor:
    """GLM's conversion of a NeoX-layout cos/sin to its interleaved layout (keep half, repeat each entry)."""
    return cos[..., : cos.shape[-1] // 2].repeat_interleave(2, dim=-1)
