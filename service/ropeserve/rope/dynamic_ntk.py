"""Dynamic NTK scaling as transformers or as vLLM does it (``dynamic_ntk`` choice of the cos/sin endpoints).

transformers (``dynamic_rope_update``) rescales θ from the length seen so far: ``θ' = θ·(f·L/M − (f − 1))^(d/(d−2))``
with ``L = max(position) + 1`` once it exceeds ``M = max_position_embeddings`` (identity below; both rules evaluate
:func:`ropeserve.config.rope_types.dynamic.scaled_theta`). vLLM
(``DynamicNTKScalingRotaryEmbedding._compute_cos_sin_cache``) scales once, at start-up, to its serving length
``L = M·f``: ``θ' = θ·(f·(M·f)/M − (f − 1))^(d/(d−2))`` in Python float64, the same for every position (short
prompts included), and its table has ``ceil(M·f)`` rows.
"""

from __future__ import annotations

import math
from dataclasses import replace
from enum import StrEnum

from ropeserve.config import RopeParams
from ropeserve.config.rope_types.dynamic import scaled_theta
from ropeserve.errors import InvalidInput
from ropeserve.rope.tables import MAX_POSITION

__all__ = ["DynamicNtkRule", "resolve_dynamic_ntk", "vllm_serving_length", "vllm_static_theta"]


class DynamicNtkRule(StrEnum):
    TRANSFORMERS = "transformers"
    """Per-length rescaling (transformers 5.24 ``dynamic_rope_update``); the default."""
    VLLM = "vllm"
    """Static: scaled once to ``max_position_embeddings × factor`` (vLLM ``DynamicNTKScalingRotaryEmbedding``)."""


def vllm_serving_length(params: RopeParams) -> float:
    """``M·f``: vLLM's ``max_len`` (a float; its table holds ``ceil(M·f)`` rows)."""
    assert params.max_position_embeddings is not None and params.factor is not None
    return params.max_position_embeddings * params.factor


def vllm_static_theta(params: RopeParams) -> float:
    """vLLM's scaled base, in its operation order (Python float64); raises when it is not a finite positive."""
    factor, max_pos, dim = params.factor, params.max_position_embeddings, params.rotary_dim
    assert factor is not None and max_pos is not None
    try:
        theta = scaled_theta(params.rope_theta, factor, vllm_serving_length(params), max_pos, dim)
    except (OverflowError, ZeroDivisionError) as exc:
        raise InvalidInput(f"vLLM's dynamic NTK base overflows: {exc}", field="dynamic_ntk") from None
    if isinstance(theta, complex) or not math.isfinite(theta) or theta <= 0:
        raise InvalidInput(f"vLLM's dynamic NTK base is {theta}, not a finite positive number", field="dynamic_ntk")
    return float(theta)


def resolve_dynamic_ntk(params: RopeParams, rule: DynamicNtkRule | str, max_position: int) -> RopeParams:
    """The parameters whose cos/sin the chosen rule gives for positions up to ``max_position``.

    ``vllm`` turns a ``dynamic`` layer into a plain one at vLLM's static base (so tables are cached under it) and
    refuses positions past vLLM's table; other rope types and the ``transformers`` rule pass through unchanged.
    """
    chosen = DynamicNtkRule(rule)
    if params.rope_type != "dynamic" or chosen is DynamicNtkRule.TRANSFORMERS:
        return params
    length = vllm_serving_length(params)
    if not math.isfinite(length) or length > MAX_POSITION + 1:
        raise InvalidInput(
            f"max_position_embeddings × factor = {length}: vLLM's table would exceed {MAX_POSITION + 1} rows",
            field="dynamic_ntk",
        )
    rows = math.ceil(length)
    if max_position >= rows:
        raise InvalidInput(
            f"position {max_position} is past vLLM's dynamic NTK table (max_position_embeddings × factor = {rows} "
            "rows); vLLM cannot serve it",
            field="positions",
        )
    return replace(params, rope_type="default", rope_theta=vllm_static_theta(params), factor=None)
