"""Ports of vLLM rotary-embedding code, as references for the rope types transformers lacks.

Ported from vLLM at commit 03587f553db4139402cc19f424c488c8e2fe25d1:
- ``RotaryEmbedding._compute_inv_freq`` (vllm/model_executor/layers/rotary_embedding/base.py);
- ``NTKScalingRotaryEmbedding._compute_inv_freq`` (vllm/model_executor/layers/rotary_embedding/ntk_scaling_rope.py),
  which ``get_rope`` builds for ``rope_type: "ntk"`` from ``factor`` and the optional ``mixed_b``;
- ``RotaryEmbedding._compute_cos_sin_cache`` (base.py), for the table rows.
The structure follows vLLM's (a class holding the constructor arguments) so the two can be read side by side.
"""

from __future__ import annotations

import torch


class VllmNtkRope:
    """vLLM's ``NTKScalingRotaryEmbedding`` reduced to its frequency and cache computations (CPU, float32)."""

    def __init__(
        self, rotary_dim: int, max_position_embeddings: int, base: float, scaling_factor: float, mixed_b: float | None
    ) -> None:
        self.rotary_dim = rotary_dim
        self.max_position_embeddings = max_position_embeddings
        self.base = base
        self.scaling_factor = scaling_factor
        self.mixed_b = mixed_b

    def _base_compute_inv_freq(self, base: float) -> torch.Tensor:
        return 1.0 / (base ** (torch.arange(0, self.rotary_dim, 2, dtype=torch.float) / self.rotary_dim))

    def compute_inv_freq(self) -> torch.Tensor:
        base = self.base * (self.scaling_factor if self.mixed_b is None else 1)
        inv_freq = self._base_compute_inv_freq(base)
        if self.mixed_b is None:
            inv_freq = inv_freq / self.scaling_factor ** (2 / self.rotary_dim)
        else:
            a = torch.tensor(self.scaling_factor).log() / (self.rotary_dim / 2) ** self.mixed_b
            lambda_1_m = (a * torch.arange(1, self.rotary_dim // 2 + 1).float() ** self.mixed_b).exp()
            inv_freq = inv_freq / lambda_1_m
        return inv_freq

    def cos_sin_cache(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(cos, sin)`` [max_position_embeddings, rotary_dim/2] float32, as ``_compute_cos_sin_cache``."""
        inv_freq = self.compute_inv_freq()
        t = torch.arange(self.max_position_embeddings, dtype=torch.float)
        freqs = torch.einsum("i,j -> ij", t, inv_freq)
        return freqs.cos(), freqs.sin()
