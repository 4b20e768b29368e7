"""Normalise every Hugging Face config form into ``RopeParams`` (torch-free).

Accepted forms, as seen in the wild (transformers 5.24 conversion rules, spec §3):

- v5 ``rope_parameters``, flat or keyed by layer type (``full_attention``/``sliding_attention``; ``None`` = NoPE);
- legacy ``rope_scaling`` (+ top-level ``rope_theta``); a truthy ``rope_scaling`` replaces ``rope_parameters``;
- ``type`` as an alias of ``rope_type``; ``mrope`` meaning default RoPE with ``mrope_section``;
- nested ``text_config`` / ``thinker_config.text_config`` (then the top-level rope keys are ignored, as the
  transformers wrapper configs ignore them; they only move flat hub keys into a text config they create);
- alias keys ``rotary_emb_base`` (theta), ``rotary_pct`` / ``partial_rotary_factor``, explicit ``head_dim``
  (or ``qk_rope_head_dim`` for DeepSeek), Gemma-3's ``rope_local_base_freq`` for sliding layers;
- explicit parameters (``from_explicit``).

A value inside the rope dict beats the top-level one (``setdefault`` semantics, as transformers does).
Every resolved value remembers where it came from as a JSON pointer (or ``default:...``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from ropeserve.config.families import ModelFamily, MropeLayout, family_of
from ropeserve.config.schema import ROPE_TYPE_ALIASES, ROPE_TYPE_KEYS
from ropeserve.errors import InvalidInput

LAYER_TYPE_LABELS = frozenset({"full_attention", "sliding_attention", "chunked_attention", "linear_attention"})
TEXT_CONFIG_PATHS: tuple[tuple[str, ...], ...] = (("thinker_config", "text_config"), ("text_config",))
MAX_HEAD_DIM = 16_384
"""Largest head size accepted (real models use 64-256; the bound keeps tables allocatable)."""
LONG_CONTEXT_TYPES = frozenset({"llama3", "yarn", "longrope"})
EXPLICIT_TOP_LEVEL_KEYS = ("head_dim", "max_position_embeddings", "model_type", "original_max_position_embeddings")
"""Explicit keys placed at the config's top level; ``original_max_position_embeddings`` goes there because a
top-level value is authoritative (a rope-dict one would lose to a class default such as Phi-3's 4096)."""


@dataclass(frozen=True)
class RopeParams:
    """Normalised rope parameters of one attention layer type; hashable, so usable as a cache key."""

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

    @property
    def rotary_dim(self) -> int:
        """Channels that rotate: ``int(head_dim * partial_rotary_factor)`` (truncated, as transformers); 0 when
        the product is not finite (only possible for unvalidated parameters)."""
        width = self.head_dim * self.partial_rotary_factor
        return int(width) if math.isfinite(width) else 0

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict of the set fields plus ``rotary_dim``."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}
        out["rotary_dim"] = self.rotary_dim
        return {k: list(v) if isinstance(v, tuple) else v for k, v in out.items()}


@dataclass(frozen=True)
class NormalizedConfig:
    """A config reduced to what position encodings need."""

    model_type: str | None
    layers: dict[str, RopeParams | None]
    sources: dict[str, dict[str, str]]
    text_pointer: str
    pairing: str
    text_config: Mapping[str, Any] = field(repr=False, default_factory=dict)

    def params(self, layer_type: str | None = None) -> RopeParams:
        """The parameters of ``layer_type`` (default: full attention, or the only RoPE layer type)."""
        rope_layers = {name: p for name, p in self.layers.items() if p is not None}
        if not rope_layers:
            raise InvalidInput("the config has no RoPE layer (every layer type is NoPE)", field="layer_type")
        if layer_type is None:
            layer_type = "full_attention" if "full_attention" in rope_layers else next(iter(rope_layers))
        if layer_type not in rope_layers:
            raise InvalidInput(
                f"layer type {layer_type!r} has no RoPE parameters; available: {sorted(rope_layers)}",
                field="layer_type",
            )
        return rope_layers[layer_type]


def normalize_config(config: Mapping[str, Any], *, validate: bool = True) -> NormalizedConfig:
    """Normalise a Hugging Face ``config.json`` dict (any form above) into per-layer-type ``RopeParams``.

    With ``validate=False`` (the linter's mode) unknown rope types, missing required keys and out-of-range
    values are kept as found instead of raising, so each can be reported on its own; values that cannot be
    read at all (a non-numeric theta, no head_dim) still raise InvalidInput.
    """
    if not isinstance(config, Mapping):
        raise InvalidInput("config must be a JSON object", field="config")
    text, pointer = _text_config(config)
    model_type = text.get("model_type") or config.get("model_type")
    if model_type is not None and not isinstance(model_type, str):
        where = f"{pointer}/model_type" if "model_type" in text else "/model_type"
        raise InvalidInput(f"model_type must be a string, got {model_type!r}", field=where)
    family = family_of(model_type)
    rope_dict, rope_pointer = _rope_dict(text, pointer)
    entries = _layer_entries(text, pointer, rope_dict, rope_pointer, family)
    nested = any(entry_pointer != rope_pointer for _, entry_pointer in entries.values())
    layers: dict[str, RopeParams | None] = {}
    sources: dict[str, dict[str, str]] = {}
    for layer_type, (entry, entry_pointer) in entries.items():
        if entry is None:
            layers[layer_type] = None
            continue
        resolver = _Resolver(text, pointer, entry, entry_pointer, family, nested=nested)
        layers[layer_type] = resolver.build(validate=validate)
        sources[layer_type] = resolver.sources
    return NormalizedConfig(
        model_type=model_type,
        layers=layers,
        sources=sources,
        text_pointer=pointer,
        pairing=family.pairing,
        text_config=text,
    )


def from_explicit(params: Mapping[str, Any]) -> RopeParams:
    """Build ``RopeParams`` from explicit parameters.

    ``params`` holds ``rope_type`` (default ``default``), ``rope_theta``, ``head_dim``, optionally
    ``rotary_dim`` or ``partial_rotary_factor``, ``max_position_embeddings`` and the type's own keys.
    An error names the offending key as ``rope.<key>``.
    """
    if not isinstance(params, Mapping):
        raise InvalidInput("rope parameters must be a JSON object", field="rope")
    try:
        return _from_explicit(dict(params))
    except InvalidInput as error:
        error.field = _explicit_field(error.field, rotary_dim_given="rotary_dim" in params)
        raise


def _from_explicit(rope: dict[str, Any]) -> RopeParams:
    text: dict[str, Any] = {}
    for key in EXPLICIT_TOP_LEVEL_KEYS:
        if key in rope:
            text[key] = rope.pop(key)
    rotary_dim = rope.pop("rotary_dim", None)
    if rotary_dim is not None:
        head_dim = text.get("head_dim")
        if not isinstance(head_dim, int) or not isinstance(rotary_dim, int) or isinstance(rotary_dim, bool):
            raise InvalidInput("rotary_dim needs an integer head_dim and rotary_dim", field="rope.rotary_dim")
        if not 0 < rotary_dim <= head_dim:
            raise InvalidInput(f"rotary_dim {rotary_dim} must be in 1..head_dim ({head_dim})", field="rope.rotary_dim")
        rope["partial_rotary_factor"] = factor_for_rotary_dim(rotary_dim, head_dim)
    text["rope_parameters"] = rope
    return normalize_config(text).params()


def factor_for_rotary_dim(rotary_dim: int, head_dim: int) -> float:
    """The smallest ``partial_rotary_factor`` with ``int(head_dim * factor) == rotary_dim``.

    ``rotary_dim / head_dim`` alone is not enough: for e.g. 30/44 the product rounds to 29.999… and truncates
    to 29, so the quotient is nudged up by ulps until transformers' ``int(head_dim * prf)`` gives it back.
    """
    factor = rotary_dim / head_dim
    while int(head_dim * factor) < rotary_dim:
        factor = math.nextafter(factor, math.inf)
    return factor


def _explicit_field(field: str | None, rotary_dim_given: bool) -> str:
    """Map a location in ``from_explicit``'s synthetic config (a JSON pointer) to ``rope.<key>``."""
    if field and field.startswith("rope."):
        return field
    key = (field or "").rsplit("/", 1)[-1]
    if key == "partial_rotary_factor" and rotary_dim_given:
        key = "rotary_dim"
    return "rope" if not key or key.startswith("default") else f"rope.{key}"


def _text_config(config: Mapping[str, Any]) -> tuple[dict[str, Any], str]:
    """The text-model section and its JSON pointer (the whole config when it has none).

    A wrapper config (Qwen2-VL, Gemma-3, ...) builds its text model from ``text_config`` alone: rope keys left
    at the top level next to a ``text_config`` are ignored by transformers, so they are ignored here too.
    """
    for path in TEXT_CONFIG_PATHS:
        node: Any = config
        for key in path:
            node = node.get(key) if isinstance(node, Mapping) else None
        if isinstance(node, Mapping):
            return dict(node), "/" + "/".join(path)
    return dict(config), ""


def _rope_dict(text: Mapping[str, Any], pointer: str) -> tuple[dict[str, Any], str]:
    """The rope dict: a truthy legacy ``rope_scaling`` replaces ``rope_parameters``."""
    for key in ("rope_scaling", "rope_parameters"):
        value = text.get(key)
        if value:
            if not isinstance(value, Mapping):
                raise InvalidInput(f"{key} must be an object", field=f"{pointer}/{key}")
            return dict(value), f"{pointer}/{key}"
    return {}, f"{pointer}/rope_parameters"


def layer_type_labels(text: Mapping[str, Any]) -> frozenset[str]:
    """Keys that mark a per-layer-type rope dict: the known labels plus the config's ``layer_types``."""
    layer_types = text.get("layer_types")
    declared = {t for t in layer_types if isinstance(t, str)} if isinstance(layer_types, list | tuple) else set()
    return LAYER_TYPE_LABELS | declared


def _layer_entries(
    text: Mapping[str, Any], pointer: str, rope_dict: dict[str, Any], rope_pointer: str, family: ModelFamily
) -> dict[str, tuple[dict[str, Any] | None, str]]:
    """Split a rope dict into per-layer-type entries (``None`` = NoPE layer)."""
    layer_labels = layer_type_labels(text)
    nested_keys = [key for key in rope_dict if key in layer_labels]
    if nested_keys:
        entries: dict[str, tuple[dict[str, Any] | None, str]] = {}
        for key in nested_keys:
            value = rope_dict[key]
            if value is not None and not isinstance(value, Mapping):
                raise InvalidInput(f"rope entry {key!r} must be an object or null", field=f"{rope_pointer}/{key}")
            entries[key] = (dict(value) if value is not None else None, f"{rope_pointer}/{key}")
        return entries
    local_base = text.get("rope_local_base_freq", family.class_defaults.get("rope_local_base_freq"))
    if local_base is not None:
        sliding = {"rope_type": "default", "rope_theta": local_base}
        explicit = "rope_local_base_freq" in text
        local_pointer = f"{pointer}/rope_local_base_freq" if explicit else "default:class:rope_local_base_freq"
        return {
            "full_attention": (rope_dict, rope_pointer),
            "sliding_attention": (sliding, local_pointer),
        }
    return {"full_attention": (rope_dict, rope_pointer)}


class _Resolver:
    """Resolves one layer entry's values, recording the JSON pointer each came from."""

    def __init__(
        self,
        text: Mapping[str, Any],
        pointer: str,
        entry: dict[str, Any],
        entry_pointer: str,
        family: ModelFamily,
        nested: bool,
    ) -> None:
        self.text, self.pointer, self.entry, self.entry_pointer = text, pointer, entry, entry_pointer
        self.family, self.nested = family, nested
        self.sources: dict[str, str] = {}

    def first(self, name: str, *candidates: tuple[str, Any]) -> Any:
        """First candidate that is present (not None); records its source under ``name``."""
        for source, value in candidates:
            if value is not None:
                self.sources[name] = source
                return value
        return None

    def from_entry(self, key: str) -> tuple[str, Any]:
        return f"{self.entry_pointer}/{key}", self.entry.get(key)

    def from_text(self, key: str) -> tuple[str, Any]:
        return f"{self.pointer}/{key}", self.text.get(key)

    def from_class(self, key: str) -> tuple[str, Any]:
        return f"default:class:{key}", self.family.class_defaults.get(key)

    def build(self, validate: bool = True) -> RopeParams:
        rope_type = self.rope_type()
        keys = ROPE_TYPE_KEYS.get(rope_type)
        if keys is None and validate:
            raise InvalidInput(
                f"unknown rope_type {rope_type!r}; known: {sorted(ROPE_TYPE_KEYS)}",
                field=self.sources["rope_type"],
            )
        max_pos = self.first(
            "max_position_embeddings",
            self.from_text("max_position_embeddings"),
            self.from_class("max_position_embeddings"),
        )
        params = RopeParams(
            rope_type=rope_type,
            rope_theta=self.theta(),
            head_dim=self.head_dim(),
            partial_rotary_factor=_as_float(
                self.first(
                    "partial_rotary_factor",
                    self.from_entry("partial_rotary_factor"),
                    self.from_text("partial_rotary_factor"),
                    self.from_text("rotary_pct"),
                    self.from_class("partial_rotary_factor"),
                    ("default", 1.0),
                ),
                "partial_rotary_factor",
                self.sources,
            ),
            max_position_embeddings=_as_int(max_pos, "max_position_embeddings", self.sources),
            factor=self.number("factor"),
            original_max_position_embeddings=_as_int(
                self.original_max(rope_type, max_pos), "original_max_position_embeddings", self.sources
            ),
            attention_factor=self.number("attention_factor"),
            beta_fast=self.number("beta_fast"),
            beta_slow=self.number("beta_slow"),
            mscale=self.number("mscale"),
            mscale_all_dim=self.number("mscale_all_dim"),
            truncate=bool(self.entry.get("truncate", True)),
            short_factor=self.factor_list("short_factor"),
            long_factor=self.factor_list("long_factor"),
            low_freq_factor=self.number("low_freq_factor"),
            high_freq_factor=self.number("high_freq_factor"),
            mrope_section=self.mrope_section(),
            mrope_layout=None,
        )
        params = _with_mrope_layout(params, self.entry, self.family)
        if validate:
            self.check_required(params, keys.required)
            validate_params(params, self.locations())
        return params

    def locations(self) -> dict[str, str]:
        """Where each value came from, or, for a value that was not given, where it belongs (for errors)."""
        missing = {f.name: f"{self.entry_pointer}/{f.name}" for f in fields(RopeParams)}
        missing.update({key: f"{self.pointer}/{key}" for key in ("head_dim", "max_position_embeddings")})
        return {**missing, **self.sources}

    def rope_type(self) -> str:
        raw = self.first("rope_type", self.from_entry("rope_type"), self.from_entry("type"), ("default", "default"))
        if not isinstance(raw, str):
            raise InvalidInput("rope_type must be a string", field=self.sources["rope_type"])
        if raw in self.family.legacy_longrope_aliases:
            return "longrope"
        return ROPE_TYPE_ALIASES.get(raw, raw)

    def theta(self) -> float:
        value = self.first(
            "rope_theta",
            self.from_entry("rope_theta"),
            self.from_text("rope_theta"),
            self.from_text("rotary_emb_base"),
            self.from_class("rope_theta"),
            ("default:family", self.family.default_theta),
        )
        return _as_float(value, "rope_theta", self.sources)

    def head_dim(self) -> int:
        candidates = [self.from_text("head_dim"), self.from_class("head_dim")]
        if self.family.head_dim_key:
            key = self.family.head_dim_key
            candidates = [self.from_text(key), self.from_class(key), *candidates]
        value = self.first("head_dim", *[(src, v) for src, v in candidates if v])
        if value is None:
            hidden = self.text.get("hidden_size")
            heads = self.text.get("num_attention_heads") or self.family.class_defaults.get("num_attention_heads")
            if isinstance(hidden, int) and isinstance(heads, int) and heads > 0:
                self.sources["head_dim"] = f"{self.pointer}/hidden_size"
                value = hidden // heads
        if value is None:
            raise InvalidInput(
                "cannot derive head_dim: give head_dim, or hidden_size and num_attention_heads",
                field=f"{self.pointer}/head_dim",
            )
        return _as_int(value, "head_dim", self.sources) or 0

    def original_max(self, rope_type: str, max_pos: Any) -> Any:
        """transformers' rule: for llama3/yarn/longrope a config attribute ``original_max_position_embeddings``
        (a top-level key, or a class default such as Phi-3's 4096) overwrites a flat rope dict's value; a
        per-layer-type entry only falls back to ``max_position_embeddings``.
        """
        key = "original_max_position_embeddings"
        candidates = [self.from_entry(key)]
        if rope_type in LONG_CONTEXT_TYPES:
            if not self.nested:
                candidates = [self.from_text(key), self.from_class(key), *candidates]
            candidates.append(("default:max_position_embeddings", max_pos))
        return self.first(key, *candidates)

    def number(self, key: str) -> float | None:
        value = self.first(key, self.from_entry(key))
        return None if value is None else _as_float(value, key, self.sources)

    def factor_list(self, key: str) -> tuple[float, ...] | None:
        value = self.first(key, self.from_entry(key))
        if value is None:
            return None
        if not isinstance(value, list | tuple) or not all(_is_number(v) for v in value):
            raise InvalidInput(f"{key} must be a list of numbers", field=self.sources[key])
        return tuple(float(v) for v in value)

    def mrope_section(self) -> tuple[int, ...] | None:
        value = self.first("mrope_section", self.from_entry("mrope_section"))
        if value is None:
            if self.family.mrope_section is not None:
                self.sources["mrope_section"] = "default:family"
            return self.family.mrope_section
        if not isinstance(value, list | tuple) or not all(isinstance(v, int) and v >= 0 for v in value):
            raise InvalidInput(
                "mrope_section must be a list of non-negative integers", field=self.sources["mrope_section"]
            )
        if len(value) != 3:
            raise InvalidInput(
                f"mrope_section must have 3 entries (T, H, W), got {len(value)}",
                field=self.sources["mrope_section"],
            )
        return tuple(value)

    def check_required(self, params: RopeParams, required: frozenset[str]) -> None:
        present = {key for key in required if getattr(params, key) is not None}
        if params.rope_type == "yarn" and "factor" in self.entry:
            present.add("factor")  # an explicit null factor means max_position_embeddings / original
        missing = sorted(required - present)
        if missing:
            raise InvalidInput(
                f"rope_type {params.rope_type!r} requires {missing}",
                field=f"{self.entry_pointer}/{missing[0]}",
            )


def _with_mrope_layout(params: RopeParams, entry: Mapping[str, Any], family: ModelFamily) -> RopeParams:
    if params.mrope_section is None:
        return params
    layout = family.mrope_layout or ("interleaved" if entry.get("mrope_interleaved") else "chunked")
    return _replace(params, mrope_layout=layout)


def _replace(params: RopeParams, **changes: Any) -> RopeParams:
    values = {f.name: getattr(params, f.name) for f in fields(params)}
    values.update(changes)
    return RopeParams(**values)


def validate_params(params: RopeParams, sources: Mapping[str, str] | None = None) -> None:
    """Reject parameters no rope computation can serve (each error names the offending field)."""
    where = dict(sources or {})

    def fail(key: str, message: str) -> None:
        raise InvalidInput(message, field=where.get(key, key))

    if not math.isfinite(params.rope_theta) or params.rope_theta <= 0:
        fail("rope_theta", f"rope_theta must be a finite number > 0, got {params.rope_theta}")
    if not 0 < params.head_dim <= MAX_HEAD_DIM:
        fail("head_dim", f"head_dim must be in 1..{MAX_HEAD_DIM}, got {params.head_dim}")
    if not 0 < params.partial_rotary_factor <= 1:
        fail(
            "partial_rotary_factor",
            f"partial_rotary_factor must be in (0, 1], got {params.partial_rotary_factor}",
        )
    if params.rope_type == "proportional":  # full-width cos/sin with a zero tail: only the head must pair up
        if params.head_dim < 2 or params.head_dim % 2:
            fail("head_dim", f"proportional RoPE rotates the full head: head_dim {params.head_dim} must be even")
    elif params.rotary_dim < 2 or params.rotary_dim % 2:
        fail(
            "partial_rotary_factor" if params.partial_rotary_factor != 1.0 else "head_dim",
            f"rotary dimension int(head_dim*partial_rotary_factor) = {params.rotary_dim} must be even and >= 2",
        )
    for key in (
        "factor",
        "attention_factor",
        "beta_fast",
        "beta_slow",
        "mscale",
        "mscale_all_dim",
        "low_freq_factor",
        "high_freq_factor",
    ):
        value = getattr(params, key)
        if value is not None and (not math.isfinite(value) or value < 0):
            fail(key, f"{key} must be a finite number >= 0, got {value}")
    if params.factor is not None and params.factor <= 0:
        fail("factor", f"factor must be > 0, got {params.factor}")
    for key in ("max_position_embeddings", "original_max_position_embeddings"):
        value = getattr(params, key)
        if value is not None and value <= 0:
            fail(key, f"{key} must be > 0, got {value}")
    _validate_type_specific(params, fail)


def _validate_type_specific(params: RopeParams, fail: Any) -> None:
    half = params.rotary_dim // 2
    if params.rope_type == "longrope":
        for key in ("short_factor", "long_factor"):
            values = getattr(params, key)
            if len(values) != half:
                fail(key, f"{key} has {len(values)} entries; rotary_dim/2 = {half} are needed")
            if not all(math.isfinite(v) and v > 0 for v in values):
                fail(key, f"{key} entries must be finite and > 0")
    if params.rope_type == "llama3" and params.high_freq_factor <= params.low_freq_factor:  # type: ignore[operator]
        fail("high_freq_factor", "high_freq_factor must be greater than low_freq_factor")
    if params.rope_type in {"yarn", "longrope"} and params.factor is None and not params.max_position_embeddings:
        fail("factor", f"{params.rope_type} without factor needs max_position_embeddings")
    if params.rope_type == "dynamic" and not params.max_position_embeddings:
        fail("max_position_embeddings", "dynamic NTK needs max_position_embeddings")
    if params.mrope_section is not None and sum(params.mrope_section) != half:
        fail(
            "mrope_section",
            f"mrope_section {list(params.mrope_section)} sums to {sum(params.mrope_section)}; "
            f"rotary_dim/2 = {half} is needed",
        )


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _as_float(value: Any, key: str, sources: Mapping[str, str]) -> float:
    if not _is_number(value):
        raise InvalidInput(f"{key} must be a number, got {value!r}", field=sources.get(key, key))
    try:
        return float(value)
    except OverflowError:  # an int beyond float range, e.g. 10**400
        raise InvalidInput(f"{key} = {value} is beyond float range", field=sources.get(key, key)) from None


def _as_int(value: Any, key: str, sources: Mapping[str, str]) -> int | None:
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidInput(f"{key} must be an integer, got {value!r}", field=sources.get(key, key))
    return value
