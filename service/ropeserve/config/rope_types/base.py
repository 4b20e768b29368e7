"""What a rope type module defines (``RopeType``), and the helpers its formulas share (torch-free).

A type's formulas come in two precisions, side by side in its module: ``inv_freq`` is the exact float32
computation (transformers 5.24 bit for bit, or the named reference), written against the ``torch`` module that
``ropeserve.rope`` passes in, so this package never imports torch; ``spectrum`` is the same formula in Python
float64 for the linter. Scalar parts (attention factor, ramp bounds, inferred factor) are defined once and
used by both.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from ropeserve.config.params import RopeParams

if TYPE_CHECKING:
    from torch import Tensor

Torch = Any
"""The ``torch`` module, handed to ``RopeType.inv_freq`` by ``ropeserve.rope`` (this package stays torch-free)."""
ProblemKind = Literal["shape", "range", "order", "length", "formula"]
LengthRule = Literal["max", "max_x_factor", "original_x_factor"]


@dataclass(frozen=True)
class Problem:
    """One reason parameters cannot be served: the key at fault, the message (the API's 422 detail and the
    linter's finding text), and its kind (``range``: RS207, ``order``: RS203, ``length``: RS205; ``shape``:
    theta, head size, rotary width, sections, which the linter reports by its own rules; ``formula``: a value
    inside its range that the formula still cannot take. The service refuses every kind; the linter skips the
    rules that need frequencies for any of them)."""

    key: str
    message: str
    kind: ProblemKind


@dataclass(frozen=True)
class Ramp:
    """Frequency indices where a scaling blends from "kept" (below ``low``) to "fully scaled" (above ``high``)."""

    kind: str
    low: float
    high: float
    detail: str


@dataclass(frozen=True)
class Spectrum:
    """Unscaled and scaled inverse frequencies in float64, with the attention factor and any blending ramp."""

    base: tuple[float, ...]
    scaled: tuple[float, ...]
    attention_factor: float = 1.0
    ramp: Ramp | None = None
    approximate: bool = False

    @property
    def scale(self) -> tuple[float, ...]:
        """Per-index ratio base/scaled (1 = unchanged, ``factor`` = fully interpolated; inf for zero bands)."""
        return tuple(b / s if s else math.inf for b, s in zip(self.base, self.scaled, strict=True))


InvFreq = Callable[[Torch, RopeParams, "int | None"], "tuple[Tensor, float]"]
"""``(torch, params, seq_len) -> (inv_freq [n] float32 CPU, attention_factor)``."""
Scaler = Callable[[RopeParams, list[float], "int | None"], Spectrum]
"""``(params, base float64 frequencies, seq_len) -> Spectrum``."""
ProblemCheck = Callable[[RopeParams], Iterator[Problem]]
RunLength = Callable[[RopeParams, int, "int | None"], "int | None"]
LengthClass = Callable[[RopeParams, int], int]


def no_problems(params: RopeParams) -> Iterator[Problem]:
    yield from ()


def unit_attention(params: RopeParams) -> float:
    return 1.0


@dataclass(frozen=True)
class RopeType:
    """Everything the service, the tables and the linter know about one rope type.

    ``required``/``optional``: its rope-dict keys besides the common ones (a key no field of ``RopeParams``
    holds lands in ``RopeParams.extras``). ``problems``: its own checks (the generic ranges are
    ``ropeserve.config.validate``'s). ``factor_from_lengths``: a missing factor means ``max / original``.
    ``original_from_config``: a config attribute ``original_max_position_embeddings`` (top level or class
    default) beats the rope dict's, and it defaults to ``max_position_embeddings``. ``null_factor_allowed``: an
    explicit ``"factor": null`` counts as given. ``full_width``: cos/sin cover the whole head (zero tail) and the
    exponent divides by ``head_dim``. ``extended_length``: the longest context the parameters are scaled for
    (``max``: max_position_embeddings already includes it; ``max_x_factor``; ``original_x_factor``).
    ``length_includes_extension``: vLLM does not multiply its derived length by the factor.
    ``run_length``/``length_class``: for length-dependent types, the ``seq_len`` the frequencies use for
    positions up to a maximum (given the cached length), and a key collapsing lengths with equal frequencies.
    ``reference``: the implementation ``inv_freq`` reproduces.
    """

    name: str
    inv_freq: InvFreq
    spectrum: Scaler
    required: frozenset[str] = frozenset()
    optional: frozenset[str] = frozenset()
    problems: ProblemCheck = no_problems
    attention_factor: Callable[[RopeParams], float] = unit_attention
    factor_from_lengths: bool = False
    original_from_config: bool = False
    null_factor_allowed: bool = False
    full_width: bool = False
    scales: bool = True
    extended_length: LengthRule = "max"
    length_includes_extension: bool = False
    run_length: RunLength | None = None
    length_class: LengthClass | None = None
    reference: str = "transformers 5.24"

    @property
    def keys(self) -> frozenset[str]:
        return self.required | self.optional


def finite_positive(value: Any) -> float | None:
    """``value`` as a float when it is a finite number > 0 (bools excluded), else None."""
    if type(value) is float:  # the parsed-JSON types first, without the isinstance calls
        return value if 0 < value < math.inf else None
    if type(value) is int:
        return float(value) if math.isfinite(value) and value > 0 else None
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value > 0:
        return float(value)
    return None


def base_frequencies(theta: float, rotary_dim: int) -> list[float]:
    """``theta ** (-2i / rotary_dim)`` for ``i < rotary_dim // 2``, in float64."""
    return [theta ** (-(2 * i) / rotary_dim) for i in range(rotary_dim // 2)]


def exponent(torch: Torch, dim: int, count: int | None = None) -> Tensor:
    """``2i/dim`` for ``i < count`` (default ``dim/2``): an int64 arange cast to float32, divided in float32."""
    stop = dim if count is None else 2 * count
    result: Tensor = torch.arange(0, stop, 2, dtype=torch.int64).to(torch.float32) / dim
    return result


def base_inv_freq(torch: Torch, theta: float | Tensor, dim: int) -> Tensor:
    """``1 / θ^(2i/dim)`` for ``i < dim/2``: float32 exponent, float32 pow, float32 reciprocal.  [dim/2]"""
    inv_freq: Tensor = 1.0 / (theta ** exponent(torch, dim))
    return inv_freq


def effective_factor(params: RopeParams, from_lengths: bool = False) -> float:
    """``factor``, or ``max_position_embeddings / original`` when ``from_lengths`` (the type infers it); 1.0
    when neither is a finite positive number (the range check reports such a factor)."""
    if params.factor is not None:
        return finite_positive(params.factor) or 1.0
    limit = finite_positive(params.max_position_embeddings)
    original = finite_positive(params.original_max_position_embeddings)
    return limit / original if from_lengths and limit and original else 1.0


def divided(base: list[float], factor: float) -> Spectrum:
    """``base`` with every frequency divided by ``factor``."""
    return Spectrum(tuple(base), tuple(v / factor for v in base))
