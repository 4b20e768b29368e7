"""Native reference rotation: the oracle every faster kernel is tested against.

Formula (transformers ``apply_rotary_pos_emb``, spec §4.2–4.4): ``x' = x·cos + rot(x)·sin`` computed in x's
dtype, with cos/sin cast to that dtype first. ``rot`` is rotate-half for NeoX pairing (``j ↔ j + d/2``)
and the adjacent-pair rotation for GPT-J (``2j ↔ 2j+1``). With ``rotary_dim < head_dim`` only the first
``rotary_dim`` channels rotate; the rest pass through.
"""

from __future__ import annotations

from typing import Literal

import torch

from ropeserve.errors import InvalidInput
from ropeserve.rope.tables import Pairing

Layout = Literal["bhtd", "bthd", "flat", "batched_flat"]
LAYOUTS: dict[str, str] = {
    "bhtd": "[batch, heads, tokens, head_dim] (transformers)",
    "bthd": "[batch, tokens, heads, head_dim] (flash-attn)",
    "flat": "[tokens, heads*head_dim] (vLLM)",
    "batched_flat": "[batch, tokens, heads*head_dim] (vLLM batched)",
}
FLAT_DIMS: dict[str, int] = {"flat": 2, "batched_flat": 3}
"""Dimensions of the layouts that merge heads and head_dim into one last axis."""
FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
"""The dtypes rotated tensors (q, k) and a caller's cos/sin table may have."""


def check_float(x: torch.Tensor, name: str) -> None:
    """InvalidInput naming ``name`` unless ``x`` has one of ``FLOAT_DTYPES``."""
    if x.dtype not in FLOAT_DTYPES:
        raise InvalidInput(f"{name} must be float32, bfloat16 or float16, got {x.dtype}", field=name)


def rotate_neox(x: torch.Tensor) -> torch.Tensor:
    """``[-x2, x1]`` for halves ``x1 = x[..., :d/2]``, ``x2 = x[..., d/2:]``."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def rotate_gptj(x: torch.Tensor) -> torch.Tensor:
    """``(-x[2j+1], x[2j])`` interleaved, for adjacent channel pairs."""
    return torch.stack((-x[..., 1::2], x[..., 0::2]), dim=-1).flatten(-2)


ROTATIONS = {"neox": rotate_neox, "gptj": rotate_gptj}


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, pairing: Pairing = "neox") -> torch.Tensor:
    """Rotate the first ``cos.shape[-1]`` channels of ``x``; cos/sin broadcast against x[..., :rotary_dim]."""
    rotary_dim = cos.shape[-1]
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    if rotary_dim == x.shape[-1]:
        return x * cos + ROTATIONS[pairing](x) * sin
    x_rot, x_pass = x[..., :rotary_dim], x[..., rotary_dim:]
    return torch.cat((x_rot * cos + ROTATIONS[pairing](x_rot) * sin, x_pass), dim=-1)


def token_major(x: torch.Tensor, layout: Layout, head_dim: int, name: str) -> torch.Tensor:
    """View ``x`` as [batch, tokens, heads, head_dim] (flat: batch 1); no copy."""
    if layout in FLAT_DIMS:
        if x.dim() != FLAT_DIMS[layout] or x.shape[-1] % head_dim:
            raise InvalidInput(
                f"{name} in layout {layout!r} must be {LAYOUTS[layout]} with a multiple of head_dim "
                f"{head_dim} in its last dim, got {list(x.shape)}",
                field=name,
            )
        leading = x.shape[:-1] if x.dim() == 3 else (1, x.shape[0])
        return x.view(*leading, x.shape[-1] // head_dim, head_dim)
    if x.dim() != 4 or x.shape[-1] != head_dim:
        raise InvalidInput(
            f"{name} in layout {layout!r} must be 4-D {LAYOUTS[layout]} with head_dim {head_dim}, got {list(x.shape)}",
            field=name,
        )
    return x.transpose(1, 2) if layout == "bhtd" else x


def from_token_major(x: torch.Tensor, layout: Layout, like: torch.Tensor) -> torch.Tensor:
    """[batch, tokens, heads, head_dim] back in ``layout``, shaped like ``like``."""
    if layout in FLAT_DIMS:
        return x.reshape(like.shape)
    return x.transpose(1, 2) if layout == "bhtd" else x


def apply_rotary(
    q: torch.Tensor,
    k: torch.Tensor | None,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    head_dim: int,
    layout: Layout = "bhtd",
    pairing: Pairing = "neox",
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Rotate q (and k) by per-token cos/sin; returns new tensors in the input shapes and dtypes.

    q: per ``layout``; k: the same layout and tokens, any head count (GQA/MQA).
    cos, sin: [tokens, rotary_dim] or [batch, tokens, rotary_dim] (full width, in the pairing's layout);
    ``rotary_dim ≤ head_dim``.
    """
    rotary_dim = cos.shape[-1]
    if cos.shape != sin.shape or rotary_dim > head_dim or rotary_dim % 2:
        raise InvalidInput(
            f"cos/sin must share a shape with an even last dim ≤ head_dim {head_dim}, "
            f"got {list(cos.shape)} and {list(sin.shape)}",
            field="cos",
        )
    q_tokens = token_major(q, layout, head_dim, "q")
    batch, tokens = q_tokens.shape[:2]
    if cos.dim() not in (2, 3) or cos.shape[-2] != tokens:
        raise InvalidInput(
            f"cos/sin must be [tokens={tokens}, d] or [batch, tokens, d], got {list(cos.shape)}", field="cos"
        )
    per_token = cos if cos.dim() == 3 else cos[None]
    per_token_sin = sin.reshape(per_token.shape)
    if per_token.shape[0] not in (1, batch):
        raise InvalidInput(f"cos batch {per_token.shape[0]} does not match q batch {batch}", field="cos")
    cos4, sin4 = per_token[:, :, None, :], per_token_sin[:, :, None, :]
    q_out = from_token_major(rotate(q_tokens, cos4, sin4, pairing), layout, q)
    if k is None:
        return q_out, None
    k_tokens = token_major(k, layout, head_dim, "k")
    if k_tokens.shape[:2] != q_tokens.shape[:2]:
        raise InvalidInput(
            f"k has batch/tokens {list(k_tokens.shape[:2])}, q has {list(q_tokens.shape[:2])}", field="k"
        )
    return q_out, from_token_major(rotate(k_tokens, cos4, sin4, pairing), layout, k)
