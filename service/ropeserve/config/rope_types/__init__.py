"""The rope-type registry: each rope type's one definition, by name (torch-free).

Every fact about a rope type lives in its own module here: its rope-dict keys, its checks and their
messages, its exact float32 ``inv_freq`` (written against the ``torch`` module that ``ropeserve.rope``
passes in), the same formula in float64 for the linter (``spectrum``), its attention factor and how it
extends the context. The normaliser, the validator, the cos/sin tables, ``/v1/health`` and the linter all
read them from here.

How to add a rope type:

1. Write ``ropeserve/config/rope_types/<name>.py`` ending in ``ROPE_TYPE = RopeType(...)`` (see
   ``base.RopeType`` for every attribute, and ``ntk.py`` for a complete small example). A key no field of
   ``RopeParams`` holds needs nothing more: the normaliser stores it in ``RopeParams.extras``.
2. Add the module to ``MODULES`` below: that line is the registration.
3. Add its tests: parity of ``inv_freq`` and the attention factor with the reference implementation
   (tests/unit/rope/test_rope_registry.py drives transformers' types; for another reference, port it to
   tests/support and test against it as tests/unit/rope/test_rope_ntk.py does), its own checks and their
   fields, and a typical rope dict in ``example()`` of tests/unit/test_one_source.py, which then checks that
   the service and the linter agree on the type for every fixture config.

The linter's engine support matrix (``ropeserve.lint.engines.SUPPORT``) says which engines run each type; a
type missing there is reported as unverified, not refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from ropeserve.config.params import RopeParams
from ropeserve.config.rope_types import default, dynamic, linear, llama3, longrope, ntk, proportional, yarn
from ropeserve.config.rope_types.base import Problem, Ramp, RopeType, Spectrum, base_frequencies, finite_positive
from ropeserve.config.rope_types.base import effective_factor as _effective_factor

MODULES = (default, linear, dynamic, yarn, longrope, llama3, proportional, ntk)
ROPE_TYPES: Mapping[str, RopeType] = MappingProxyType({module.ROPE_TYPE.name: module.ROPE_TYPE for module in MODULES})
"""Type name -> its definition."""
ALIASES: Mapping[str, str] = MappingProxyType({"mrope": "default"})
"""Legacy names that mean another type everywhere (Qwen2-VL's ``mrope`` is plain RoPE + sections)."""
LEGACY_NAMES: Mapping[str, str] = MappingProxyType({"su": "longrope"})
"""Older names of a type: vLLM maps them everywhere, transformers only for some families (Phi-3's ``su``)."""
ENGINE_ALIASES: Mapping[str, str] = MappingProxyType({"deepseek_yarn": "yarn", **LEGACY_NAMES})
"""Names some engines (vLLM, SGLang) accept for a registered type's formula; transformers and the service
refuse them, the linter computes their spectrum with that type."""


_BY_NAME: dict[str | None, RopeType | None] = {
    name: ROPE_TYPES.get(ALIASES.get(name, name)) for name in (*ROPE_TYPES, *ALIASES)
}
"""Every name ``lookup`` resolves, with its type (one dict read per call; the rules ask often)."""
_FOR_ENGINES: dict[str | None, RopeType | None] = {
    name: _BY_NAME.get(ENGINE_ALIASES.get(name, name)) for name in (*ROPE_TYPES, *ALIASES, *ENGINE_ALIASES)
}
"""Every name ``lookup_for_engines`` resolves, with its type."""


def lookup(name: str | None) -> RopeType | None:
    """The registered type ``name`` (after ``ALIASES``), or None."""
    return _BY_NAME.get(name)


def lookup_for_engines(name: str | None) -> RopeType | None:
    """``lookup``, also resolving ``ENGINE_ALIASES`` (what an engine computes for the name)."""
    return _FOR_ENGINES.get(name)


def effective_factor(params: RopeParams) -> float:
    """``factor``, or ``max / original`` where the type infers it (yarn, longrope); 1.0 when unusable."""
    rope_type = lookup_for_engines(params.rope_type)
    return _effective_factor(params, from_lengths=rope_type is not None and rope_type.factor_from_lengths)


def rotated_width(params: RopeParams) -> int:
    """Channels covered by cos/sin: ``head_dim`` for a full-width type (zero tail), else ``rotary_dim``."""
    rope_type = lookup(params.rope_type)
    return params.head_dim if rope_type is not None and rope_type.full_width else params.rotary_dim


def spectrum(params: RopeParams, seq_len: int | None = None) -> Spectrum:
    """Float64 frequencies of ``params`` at ``seq_len`` (``None``: at initialisation); an unknown type gets
    the unscaled frequencies, marked approximate."""
    base = base_frequencies(params.rope_theta, params.rotary_dim)
    rope_type = lookup_for_engines(params.rope_type)
    if rope_type is None:
        return Spectrum(tuple(base), tuple(base), approximate=True)
    return rope_type.spectrum(params, base, seq_len)


__all__ = [
    "ALIASES",
    "ENGINE_ALIASES",
    "LEGACY_NAMES",
    "MODULES",
    "ROPE_TYPES",
    "Problem",
    "Ramp",
    "RopeType",
    "Spectrum",
    "effective_factor",
    "finite_positive",
    "lookup",
    "lookup_for_engines",
    "rotated_width",
    "spectrum",
]
