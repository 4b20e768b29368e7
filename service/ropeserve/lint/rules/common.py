"""Small helpers shared by rule modules."""

from __future__ import annotations

from ropeserve.config.normalize import RopeEntry
from ropeserve.config.rope_types import ALIASES, LEGACY_NAMES, RopeType, lookup_for_engines, yarn
from ropeserve.lint.versions import Version

LEGACY_TYPE_NAMES = {**LEGACY_NAMES, **ALIASES}


def written_type(entry: RopeEntry) -> str | None:
    """The type an entry declares (``rope_type`` first, then legacy ``type``), as written."""
    value = entry.get("rope_type", entry.get("type"))
    return value if isinstance(value, str) else None


def canonical_type(entry: RopeEntry) -> str | None:
    """The declared type with legacy names mapped (``su`` -> longrope, ``mrope`` -> default)."""
    declared = written_type(entry)
    return LEGACY_TYPE_NAMES.get(declared, declared) if declared is not None else None


def definition_of(rope_type: str | None) -> RopeType | None:
    """The registered definition an engine computes for ``rope_type`` (legacy and engine aliases resolved)."""
    return lookup_for_engines(rope_type)


def is_yarn(rope_type: str | None) -> bool:
    """``rope_type`` computes YaRN (``yarn``, or an engine's ``deepseek_yarn``)."""
    return definition_of(rope_type) is yarn.ROPE_TYPE


def fmt(value: float | int | None) -> str:
    """Integers with thousands separators, other numbers compactly."""
    if value is None:
        return "unknown"
    if isinstance(value, int):  # exact, also past the float range (vLLM's 4 x rows of a 1e308 length)
        return f"{value:,}"
    if value.is_integer():
        return f"{int(value):,}"
    return f"{value:.3g}"


TRANSFORMERS_5 = Version.parse("5.0.0")
"""transformers 5 changed rope standardisation and validation (rope_parameters)."""
