"""RoPE math in pure torch (no web imports): rope-type registry, cos/sin tables, native rotation."""

from ropeserve.rope.apply import LAYOUTS, Layout, apply_rotary, rotate
from ropeserve.rope.mrope import mrope_cos_sin, slot_axes
from ropeserve.rope.registry import ROPE_TYPES, base_inv_freq, compute_inv_freq, rotated_width
from ropeserve.rope.tables import (
    DEFAULT_CACHE,
    PAIRINGS,
    CosSin,
    Pairing,
    TableCache,
    effective_length,
    expand_pairing,
    rope_cos_sin,
)
from ropeserve.rope.vision import vision_cos_sin

__all__ = [
    "DEFAULT_CACHE",
    "LAYOUTS",
    "PAIRINGS",
    "ROPE_TYPES",
    "CosSin",
    "Layout",
    "Pairing",
    "TableCache",
    "apply_rotary",
    "base_inv_freq",
    "compute_inv_freq",
    "effective_length",
    "expand_pairing",
    "mrope_cos_sin",
    "rope_cos_sin",
    "rotate",
    "rotated_width",
    "slot_axes",
    "vision_cos_sin",
]
