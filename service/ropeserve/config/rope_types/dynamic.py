"""``dynamic``: NTK-aware scaling of the base once the sequence outgrows ``max_position_embeddings``.

``θ' = θ·(factor·L/M − (factor − 1))^(d/(d−2))`` with ``L = max(seq_len, M)`` (transformers 5.24
``_compute_dynamic_ntk_parameters`` and ``dynamic_rope_update``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from ropeserve.config.params import RopeParams
from ropeserve.config.rope_types.base import (
    Problem,
    RopeType,
    Spectrum,
    Torch,
    base_frequencies,
    base_inv_freq,
    effective_factor,
)

if TYPE_CHECKING:
    from torch import Tensor


def scaled_theta(theta: float, factor: float, length: float | Tensor, limit: int, dim: int) -> float | Tensor:
    """The NTK base at length ``length`` (a Python number: float64; an int64 tensor: float32 arithmetic)."""
    return theta * ((factor * length / limit) - (factor - 1)) ** (dim / (dim - 2))


def inv_freq(torch: Torch, params: RopeParams, seq_len: int | None) -> tuple[Tensor, float]:
    """transformers evaluates θ' in two precisions, and both are reproduced here: at init (``L = M``) in Python
    float64; at run time ``dynamic_rope_update`` passes ``seq_len = max(position_ids) + 1`` as an int64 tensor,
    so for ``L > M`` the whole expression is float32 tensor arithmetic (a float64 θ' differs by an ulp)."""
    dim, factor, limit = params.rotary_dim, params.factor, params.max_position_embeddings
    assert factor is not None and limit is not None  # validated: required
    length: int | Tensor = limit
    if seq_len is not None and seq_len > limit:
        length = torch.tensor(seq_len, dtype=torch.int64)
    return base_inv_freq(torch, scaled_theta(params.rope_theta, factor, length, limit, dim), dim), 1.0


def spectrum(params: RopeParams, base: list[float], seq_len: int | None) -> Spectrum:
    limit = params.max_position_embeddings or 0
    length = max(seq_len or limit, limit)
    dim = params.rotary_dim
    if not limit or length <= limit or dim <= 2:
        return Spectrum(tuple(base), tuple(base))
    theta = scaled_theta(params.rope_theta, effective_factor(params), length, limit, dim)
    assert isinstance(theta, float)
    return Spectrum(tuple(base), tuple(base_frequencies(theta, dim)))


def problems(params: RopeParams) -> Iterator[Problem]:
    if params.rotary_dim <= 2:
        yield Problem(
            "head_dim",
            f"dynamic NTK raises to rotary_dim/(rotary_dim-2): rotary_dim {params.rotary_dim} must be > 2",
            "formula",
        )
    if not params.max_position_embeddings:
        yield Problem("max_position_embeddings", "dynamic NTK needs max_position_embeddings", "formula")


def run_length(params: RopeParams, max_position: int, seq_len_cached: int | None) -> int | None:
    """transformers recomputes when ``L = max_position + 1`` exceeds its cached length ``c`` (default
    ``max_position_embeddings``), restores the original below ``max_position_embeddings``, and otherwise keeps
    ``c`` (hysteresis)."""
    length, original = max_position + 1, params.max_position_embeddings or 0
    cached = max(seq_len_cached or original, original)
    if length > cached:
        return length
    return original if length < original else cached


def length_class(params: RopeParams, seq_len: int) -> int:
    """Every length up to ``max_position_embeddings`` gives the init frequencies."""
    return max(seq_len, params.max_position_embeddings or 0)


ROPE_TYPE = RopeType(
    "dynamic",
    inv_freq,
    spectrum,
    required=frozenset({"factor"}),
    problems=problems,
    extended_length="max_x_factor",
    run_length=run_length,
    length_class=length_class,
)
