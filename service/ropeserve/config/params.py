"""``RopeParams``: the normalised rope parameters of one attention layer type (torch-free)."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

from ropeserve.config.families import MropeLayout


@dataclass(frozen=True)
class RopeParams:
    """Normalised rope parameters of one attention layer type; hashable, so usable as a cache key.

    ``extras`` holds the numeric keys of a rope type that no other type shares (``(key, value)`` pairs,
    sorted by key), so a new type's keys need no new field here; read any key with ``value(key)``.
    """

    rope_type: str
    rope_theta: float
    head_dim: int
    partial_rotary_factor: float = 1.0
    max_position_embeddings: int | None = None
    factor: float | None = None
    original_max_position_embeddings: int | None = None
    attention_factor: float | None = None
    beta_fast: float | None = None
    beta_slow: float | None = None
    mscale: float | None = None
    mscale_all_dim: float | None = None
    truncate: bool = True
    short_factor: tuple[float, ...] | None = None
    long_factor: tuple[float, ...] | None = None
    low_freq_factor: float | None = None
    high_freq_factor: float | None = None
    mrope_section: tuple[int, ...] | None = None
    mrope_layout: MropeLayout | None = None
    extras: tuple[tuple[str, float], ...] = ()

    @property
    def rotary_dim(self) -> int:
        """Channels that rotate: ``int(head_dim * partial_rotary_factor)`` (truncated, as transformers); 0 when
        the product is not finite (only possible for unvalidated parameters)."""
        width = self.head_dim * self.partial_rotary_factor
        return int(width) if math.isfinite(width) else 0

    def value(self, key: str) -> Any:
        """The value of parameter ``key``: a field, else an entry of ``extras`` (None when absent)."""
        if key in _FIELDS:
            return getattr(self, key)
        return dict(self.extras).get(key)

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict of the set fields (extras flattened) plus ``rotary_dim``."""
        out = {name: getattr(self, name) for name in FIELD_NAMES if getattr(self, name) is not None}
        out.pop("extras")
        out.update(self.extras)
        out["rotary_dim"] = self.rotary_dim
        return {k: list(v) if isinstance(v, tuple) else v for k, v in out.items()}


FIELD_NAMES: tuple[str, ...] = tuple(f.name for f in fields(RopeParams))
_FIELDS = frozenset(FIELD_NAMES)
