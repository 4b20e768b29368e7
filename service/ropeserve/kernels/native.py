"""The reference kernel: gather cos/sin, expand them to full width, then ``rope.apply_rotary``."""

from __future__ import annotations

import torch

from ropeserve.kernels.prep import half_cos_sin, prepare
from ropeserve.kernels.spec import RotationSpec
from ropeserve.rope.apply import apply_rotary
from ropeserve.rope.tables import RopeTable, expand_pairing


def rotate_native(
    q: torch.Tensor,
    k: torch.Tensor | None,
    positions: torch.Tensor,
    table: RopeTable,
    spec: RotationSpec,
    *,
    inplace: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Eager transformers formula (the oracle); ``inplace`` copies the results back into q and k."""
    inputs = prepare(q, k, positions, table, spec)
    cos_half, sin_half = half_cos_sin(table, inputs.positions, spec.mrope)
    cos, sin = expand_pairing(cos_half, spec.pairing), expand_pairing(sin_half, spec.pairing)
    q_out, k_out = apply_rotary(q, k, cos, sin, head_dim=spec.head_dim, layout=spec.layout, pairing=spec.pairing)
    if not inplace:
        return q_out, k_out
    q.copy_(q_out)
    if k is not None and k_out is not None:
        k.copy_(k_out)
    return q, k
