"""Which rope_parameters keys each rope type accepts (torch-free), derived from the rope-type registry.

Each type's own keys are its module's (``ropeserve.config.rope_types``); ``rope_theta`` and
``partial_rotary_factor`` are always allowed (transformers 5.24 ``_validate_<type>_rope_parameters``), and so
are the M-RoPE keys.
"""

from __future__ import annotations

from collections.abc import Mapping

from ropeserve.config.rope_types import ROPE_TYPES, RopeType

COMMON_KEYS = frozenset({"rope_type", "type", "rope_theta", "partial_rotary_factor"})
MROPE_KEYS = frozenset({"mrope_section", "mrope_interleaved"})
ROPE_TYPE_KEYS: Mapping[str, RopeType] = ROPE_TYPES
"""The registry itself: each ``RopeType`` carries its ``required`` and ``optional`` keys."""


def allowed_keys(rope_type: str) -> frozenset[str] | None:
    """Every key a rope dict of ``rope_type`` may hold (None for an unknown type)."""
    definition = ROPE_TYPES.get(rope_type)
    return None if definition is None else COMMON_KEYS | MROPE_KEYS | definition.keys


KNOWN_KEYS = COMMON_KEYS | MROPE_KEYS | frozenset().union(*(definition.keys for definition in ROPE_TYPES.values()))
