"""Which rope_parameters keys each rope type requires or accepts (torch-free).

This is the validation half of the rope-type registry: ``ropeserve.rope.registry`` holds the compute
functions under the same names, and a test keeps the two in step. Key sets follow transformers 5.24
(`_validate_<type>_rope_parameters`), with ``rope_theta`` and ``partial_rotary_factor`` always allowed.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RopeTypeKeys:
    required: frozenset[str]
    optional: frozenset[str] = frozenset()


COMMON_KEYS = frozenset({"rope_type", "type", "rope_theta", "partial_rotary_factor"})
MROPE_KEYS = frozenset({"mrope_section", "mrope_interleaved"})

ROPE_TYPE_KEYS: dict[str, RopeTypeKeys] = {
    "default": RopeTypeKeys(frozenset()),
    "linear": RopeTypeKeys(frozenset({"factor"})),
    "dynamic": RopeTypeKeys(frozenset({"factor"})),
    "yarn": RopeTypeKeys(
        frozenset({"factor", "original_max_position_embeddings"}),
        frozenset({"attention_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim", "truncate"}),
    ),
    "longrope": RopeTypeKeys(
        frozenset({"short_factor", "long_factor", "original_max_position_embeddings"}),
        frozenset({"attention_factor", "factor"}),
    ),
    "llama3": RopeTypeKeys(
        frozenset({"factor", "original_max_position_embeddings", "low_freq_factor", "high_freq_factor"})
    ),
    "proportional": RopeTypeKeys(frozenset(), frozenset({"factor"})),
}


def allowed_keys(rope_type: str) -> frozenset[str] | None:
    """Every key a rope dict of ``rope_type`` may hold (None for an unknown type)."""
    keys = ROPE_TYPE_KEYS.get(rope_type)
    return None if keys is None else COMMON_KEYS | MROPE_KEYS | keys.required | keys.optional


KNOWN_KEYS = (
    COMMON_KEYS | MROPE_KEYS | frozenset().union(*(keys.required | keys.optional for keys in ROPE_TYPE_KEYS.values()))
)

ROPE_TYPE_ALIASES: dict[str, str] = {"mrope": "default"}
"""Legacy names that mean another type everywhere (Qwen2-VL's ``mrope`` is plain RoPE + sections)."""
