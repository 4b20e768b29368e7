"""The one validator of rope parameters: every reason ``RopeParams`` cannot be served, as ``Problem``s.

The service raises the first as a 422 (``validate_params``); the linter reports the ``range``, ``order`` and
``length`` problems as RS207, RS203 and RS205 with the same messages. Generic checks live here; each rope
type's own live in its module (``ropeserve.config.rope_types``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from ropeserve.config.params import RopeParams
from ropeserve.config.rope_types import Problem, lookup
from ropeserve.errors import InvalidInput

MAX_HEAD_DIM = 16_384
"""Largest head size accepted (real models use 64-256; the bound keeps tables allocatable)."""
POSITIVE = ("factor", "max_position_embeddings", "original_max_position_embeddings")
NON_NEGATIVE = ("attention_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim")
SLIDING_WINDOW = "sliding_window"
"""The text-config key of the attention window (tokens); ``null`` means none, a list one value per layer."""


def problems(params: RopeParams) -> Iterator[Problem]:
    """Every problem of ``params``, generic checks first, then the rope type's own, then the M-RoPE sections."""
    yield from shape_problems(params)
    yield from range_problems(params)
    rope_type = lookup(params.rope_type)
    if rope_type is not None:
        yield from rope_type.problems(params)
    half = params.rotary_dim // 2
    if params.mrope_section is not None and sum(params.mrope_section) != half:
        yield Problem(
            "mrope_section",
            f"mrope_section {list(params.mrope_section)} sums to {sum(params.mrope_section)}; "
            f"rotary_dim/2 = {half} is needed",
            "shape",
        )


def shape_problems(params: RopeParams) -> Iterator[Problem]:
    """Theta, head size, partial rotary factor and the rotated width."""
    if not math.isfinite(params.rope_theta) or params.rope_theta <= 0:
        yield Problem("rope_theta", f"rope_theta must be a finite number > 0, got {params.rope_theta}", "shape")
    if not 0 < params.head_dim <= MAX_HEAD_DIM:
        yield Problem("head_dim", f"head_dim must be in 1..{MAX_HEAD_DIM}, got {params.head_dim}", "shape")
    if not 0 < params.partial_rotary_factor <= 1:
        message = f"partial_rotary_factor must be in (0, 1], got {params.partial_rotary_factor}"
        yield Problem("partial_rotary_factor", message, "shape")
    rope_type = lookup(params.rope_type)
    if rope_type is not None and rope_type.full_width:  # cos/sin cover the head (zero tail): it must pair up
        if params.head_dim < 2 or params.head_dim % 2:
            message = f"{params.rope_type} RoPE rotates the full head: head_dim {params.head_dim} must be even"
            yield Problem("head_dim", message, "shape")
    elif params.rotary_dim < 2 or params.rotary_dim % 2:
        yield Problem(
            "partial_rotary_factor" if params.partial_rotary_factor != 1.0 else "head_dim",
            f"rotary dimension int(head_dim*partial_rotary_factor) = {params.rotary_dim} must be even and >= 2",
            "shape",
        )


def range_problems(params: RopeParams) -> Iterator[Problem]:
    """Scaling and length parameters that are not finite, or zero/negative where a formula divides by them."""
    for key in POSITIVE:  # fields of RopeParams, read directly
        value = getattr(params, key)
        if value is not None and not (math.isfinite(value) and value > 0):
            yield Problem(key, f"{key} = {value!r} must be finite and > 0", "range")
    for key in NON_NEGATIVE:
        value = getattr(params, key)
        if value is not None and not (math.isfinite(value) and value >= 0):
            yield Problem(key, f"{key} = {value!r} must be finite and >= 0", "range")


def window_problems(text: Mapping[str, Any]) -> Iterator[Problem]:
    """A ``sliding_window`` that is not a positive integer (``null`` is none; a list holds one per layer, each
    a positive integer or ``null``): an attention window of 0, -1 or 4096.5 tokens is no window any engine runs."""
    value = text.get(SLIDING_WINDOW)
    values = value if isinstance(value, list) else [value]
    if not all(item is None or _positive_integer(item) for item in values):
        message = f"{SLIDING_WINDOW} = {value!r} must be a positive integer number of tokens (or null)"
        yield Problem(SLIDING_WINDOW, message, "range")


def _positive_integer(value: Any) -> bool:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return math.isfinite(value) and value > 0 and float(value).is_integer()


def validate_params(
    params: RopeParams, sources: Mapping[str, str] | None = None, found: Iterable[Problem] | None = None
) -> None:
    """Raise InvalidInput for the first problem of ``params`` (``found``: its ``problems``, when the caller has
    them already), its field taken from ``sources`` (key -> where the value came from) when given."""
    for problem in problems(params) if found is None else found:
        raise InvalidInput(problem.message, field=(sources or {}).get(problem.key, problem.key))
