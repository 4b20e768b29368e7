"""Normalise every Hugging Face config form into ``RopeParams`` (torch-free).

Accepted forms, as seen in the wild (transformers 5.24 conversion rules, spec §3):

- v5 ``rope_parameters``, flat or keyed by layer type (``full_attention``/``sliding_attention``; ``None`` = NoPE);
- legacy ``rope_scaling`` (+ top-level ``rope_theta``); a truthy ``rope_scaling`` replaces ``rope_parameters``;
- ``type`` as an alias of ``rope_type``; ``mrope`` meaning default RoPE with ``mrope_section``;
- nested ``text_config`` / ``thinker_config.text_config`` (then the top-level rope keys are ignored, as the
  transformers wrapper configs ignore them; they only move flat hub keys into a text config they create);
- alias keys ``rotary_emb_base`` / ``rope_embedding_base`` (theta, THETA_ALIASES), ``rotary_pct`` / ``rope_pct``
  (``partial_rotary_factor``, ROTARY_FRACTION_ALIASES), explicit ``head_dim`` (or ``qk_rope_head_dim`` for
  DeepSeek), Gemma-3's ``rope_local_base_freq`` for sliding layers;
- explicit parameters (``from_explicit``).

A value inside the rope dict beats the top-level one (``setdefault`` semantics, as transformers does).
Every resolved value remembers where it came from as a JSON pointer (or ``default:...``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ropeserve.config.families import ModelFamily, MropeLayout, Pairing, attribute_map_of, family_of
from ropeserve.config.jsonsafe import INT64_MAX, INT64_MIN, check_json_numbers, is_json_object
from ropeserve.config.params import FIELD_NAMES, RopeParams
from ropeserve.config.rope_types import ALIASES, ROPE_TYPES, RopeType, lookup
from ropeserve.config.schema import COMMON_KEYS, KNOWN_KEYS, MROPE_KEYS, allowed_keys
from ropeserve.config.validate import MAX_HEAD_DIM, validate_params, window_problems
from ropeserve.errors import InvalidInput

LAYER_TYPE_LABELS = frozenset({"full_attention", "sliding_attention", "chunked_attention", "linear_attention"})
TEXT_CONFIG_PATHS: tuple[tuple[str, ...], ...] = (("thinker_config", "text_config"), ("text_config",))
ROPE_CONTAINERS = ("rope_scaling", "rope_parameters")
EXPLICIT_TOP_LEVEL_KEYS = ("head_dim", "max_position_embeddings", "model_type", "original_max_position_embeddings")
"""Explicit keys placed at the config's top level; ``original_max_position_embeddings`` goes there because a
top-level value is authoritative (a rope-dict one would lose to a class default such as Phi-3's 4096)."""
THETA_ALIASES = ("rotary_emb_base", "rope_embedding_base")
"""Top-level spellings of ``rope_theta``: GPT-NeoX's ``rotary_emb_base``; ``rope_embedding_base`` of the remote
Phi3SmallConfig (Phi-3-small: 1000000), which vLLM's phi3_small model reads as the rotary base."""
ROTARY_FRACTION_ALIASES = ("rotary_pct", "rope_pct")
"""Top-level spellings of ``partial_rotary_factor``: GPT-NeoX's ``rotary_pct``; ``rope_pct`` of the remote
StableLMEpochConfig (stablelm-3b-4e1t, stablelm-2 first releases), which vLLM's stablelm model reads first."""
EXPLICIT_ONLY_KEYS = frozenset({"rotary_dim", *EXPLICIT_TOP_LEVEL_KEYS})
"""Keys an explicit ``rope`` object may hold besides its rope type's own (``schema.allowed_keys``)."""
OWN_KEYS = {
    name: tuple(sorted(rope_type.keys - set(FIELD_NAMES) - COMMON_KEYS - MROPE_KEYS))
    for name, rope_type in ROPE_TYPES.items()
}
"""Rope type -> its numeric keys that no ``RopeParams`` field holds (kept in ``RopeParams.extras``), sorted."""


@dataclass(frozen=True)
class NormalizedConfig:
    """A config reduced to what position encodings need."""

    model_type: str | None
    layers: dict[str, RopeParams | None]
    sources: dict[str, dict[str, str]]
    text_pointer: str
    pairing: Pairing
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


def normalize_config(
    config: Mapping[str, Any], *, validate: bool = True, numbers_checked: bool = False
) -> NormalizedConfig:
    """Normalise a Hugging Face ``config.json`` dict (any form above) into per-layer-type ``RopeParams``.

    With ``validate=False`` (the linter's mode) unknown rope types, missing required keys and out-of-range
    values (rope parameters and ``sliding_window``, ``validate.window_problems``) are kept as found instead of
    raising, so each can be reported on its own; values that cannot be read at all (a non-numeric theta, no
    head_dim) still raise InvalidInput. ``numbers_checked`` says the caller has run ``check_json_numbers`` over
    ``config`` already (the linter checks each document once, naming the document in the error's pointer).
    """
    if not is_json_object(config):
        raise InvalidInput("config must be a JSON object", field="config")
    if not numbers_checked:
        check_json_numbers(config)
    section, pointer = text_section(config)
    model_type = checked_model_type(config, section, pointer)
    family = family_of(model_type)
    text, filled = complete_text(section, pointer, family)
    return normalize_text(text, pointer, model_type, family, filled, validate=validate)


def checked_model_type(config: Mapping[str, Any], section: Mapping[str, Any], pointer: str) -> str | None:
    """The ``model_type`` of ``config`` (its text ``section``'s first); InvalidInput when it is not a string."""
    model_type = section.get("model_type") or config.get("model_type")
    if model_type is not None and not isinstance(model_type, str):
        where = f"{pointer}/model_type" if "model_type" in section else "/model_type"
        raise InvalidInput(f"model_type must be a string, got {model_type!r}", field=where)
    return model_type


def normalize_text(
    text: Mapping[str, Any],
    pointer: str,
    model_type: str | None,
    family: ModelFamily,
    filled: Mapping[str, str] | None = None,
    *,
    validate: bool = True,
    found: RopeDicts | None = None,
) -> NormalizedConfig:
    """``normalize_config`` from the text section on: ``text`` (at ``pointer``) is completed already
    (``complete_text``, which filled ``filled``) and ``found`` is its strict ``rope_dicts`` when the caller has it,
    so the linter, which reads both itself, does not make the normaliser walk the document again."""
    filled = filled or {}
    if validate:
        for problem in window_problems(text):
            raise InvalidInput(problem.message, field=f"{pointer}/{problem.key}")
    entries, nested = _layer_entries(text, pointer, family, found)
    layers: dict[str, RopeParams | None] = {}
    sources: dict[str, dict[str, str]] = {}
    for layer_type, (entry, entry_pointer) in entries.items():
        if entry is None:
            layers[layer_type] = None
            continue
        resolver = _Resolver(text, pointer, entry, entry_pointer, family, nested=nested)
        try:
            layers[layer_type] = resolver.build(validate=validate)
        except InvalidInput as error:
            error.field = filled.get(error.field or "", error.field)
            raise
        sources[layer_type] = _real_sources(resolver.sources, filled)
    return NormalizedConfig(
        model_type=model_type,
        layers=layers,
        sources=sources,
        text_pointer=pointer,
        pairing=family.pairing,
        text_config=text,
    )


def _real_sources(sources: dict[str, str], filled: Mapping[str, str]) -> dict[str, str]:
    """``sources`` with each pointer that ``complete_text`` filled replaced by its real source (``/n_embd``);
    ``sources`` itself when nothing was filled (most configs)."""
    if not filled:
        return sources
    return {key: filled.get(source, source) for key, source in sources.items()}


def from_explicit(params: Mapping[str, Any]) -> RopeParams:
    """Build ``RopeParams`` from explicit parameters.

    ``params`` holds ``rope_type`` (default ``default``), ``rope_theta``, ``head_dim``, optionally
    ``rotary_dim`` or ``partial_rotary_factor``, ``max_position_embeddings`` and the type's own keys.
    An error names the offending key as ``rope.<key>``; a key that is no parameter (a typo such as
    ``rope_thetaa``) or not one of the rope type's is an error too, not silently ignored.
    """
    if not isinstance(params, Mapping):
        raise InvalidInput("rope parameters must be a JSON object", field="rope")
    _check_explicit_keys(params, KNOWN_KEYS)
    try:
        check_json_numbers(params)
        result = _from_explicit(dict(params))
    except InvalidInput as error:
        error.field = _explicit_field(error.field, rotary_dim_given="rotary_dim" in params)
        raise
    _check_explicit_keys(params, allowed_keys(result.rope_type) or KNOWN_KEYS, result.rope_type)
    return result


def _check_explicit_keys(params: Mapping[str, Any], allowed: frozenset[str], rope_type: str | None = None) -> None:
    """InvalidInput naming the first key of ``params`` outside ``allowed`` (plus the explicit-only keys)."""
    unknown = sorted(set(params) - allowed - EXPLICIT_ONLY_KEYS)
    if unknown:
        what = "an unknown key" if rope_type is None else f"not a parameter of rope_type {rope_type!r}"
        known = sorted(allowed | EXPLICIT_ONLY_KEYS)
        raise InvalidInput(f"{unknown[0]!r} is {what}; accepted: {known}", field=f"rope.{unknown[0]}")


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
    """Map a location in ``from_explicit``'s synthetic config, or in the explicit parameters themselves (a JSON
    pointer), to ``rope.<key>``, with ``[i]`` / ``.<key>`` for what lies inside it (``rope.short_factor[0]``)."""
    if field and field.startswith("rope."):
        return field
    field = field or ""
    parts = field.removeprefix("/rope_parameters").split("/")[1:] if field.startswith("/") else [field]
    key = parts[0] if parts else ""
    if key == "partial_rotary_factor" and rotary_dim_given:
        key = "rotary_dim"
    inner = "".join(f"[{part}]" if part.isdigit() else f".{part}" for part in parts[1:])
    return "rope" if not key or key.startswith("default") else f"rope.{key}{inner}"


def complete_text(text: Mapping[str, Any], pointer: str, family: ModelFamily) -> tuple[dict[str, Any], dict[str, str]]:
    """``text`` completed as the model's config class completes it: keys written under ``attribute_map``
    aliases (GPT-J's ``n_embd``; a remote config class's, see ``attribute_map_of``) and a top-level
    ``rotary_dim`` as ``partial_rotary_factor``. Returns the completed section and the pointers it filled -> where
    the value really came from (``/n_embd``)."""
    completed, filled = dict(text), {}
    for key, alias in attribute_map_of(family, text).items():
        if key not in text and alias in text:
            completed[key], filled[f"{pointer}/{key}"] = text[alias], f"{pointer}/{alias}"
    factor = _rotary_dim_factor(completed)
    if factor is not None:
        completed["partial_rotary_factor"] = factor
        filled[f"{pointer}/partial_rotary_factor"] = f"{pointer}/rotary_dim"
    return completed, filled


def _rotary_dim_factor(text: Mapping[str, Any]) -> float | None:
    """``partial_rotary_factor`` for a top-level ``rotary_dim`` (GPT-J, CodeGen, MixFormer), when the head size
    is known from ``head_dim`` or ``hidden_size / num_attention_heads`` and the width fits it; else None."""
    rotary_dim = _positive_int(text.get("rotary_dim"))
    if rotary_dim is None or any(key in text for key in ("partial_rotary_factor", *ROTARY_FRACTION_ALIASES)):
        return None
    head_dim = _positive_int(text.get("head_dim"))
    if head_dim is None:
        hidden, heads = _positive_int(text.get("hidden_size")), _positive_int(text.get("num_attention_heads"))
        head_dim = hidden // heads if hidden is not None and heads is not None else None
    if head_dim is None or not rotary_dim <= head_dim <= MAX_HEAD_DIM:
        return None
    return factor_for_rotary_dim(rotary_dim, head_dim)


def _positive_int(value: Any) -> int | None:
    """``value`` when it is an int in 1..INT64_MAX (bools excluded), else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 < value <= INT64_MAX else None


def text_section(config: Mapping[str, Any]) -> tuple[Mapping[str, Any], str]:
    """The text-model section and its JSON pointer (the whole config when it has none).

    A wrapper config (Qwen2-VL, Gemma-3, ...) builds its text model from ``text_config`` alone: rope keys left
    at the top level next to a ``text_config`` are ignored by transformers, so they are ignored here too.
    """
    for path in TEXT_CONFIG_PATHS:
        node: Any = config
        for key in path:
            node = node.get(key) if is_json_object(node) else None
            if node is None:
                break
        if is_json_object(node):
            return node, "/" + "/".join(path)
    return config, ""


@dataclass(frozen=True)
class RopeEntry:
    """One raw rope dict as written in the file (``data`` is None for a NoPE layer)."""

    layer_type: str
    pointer: str
    data: Mapping[str, Any] | None

    def get(self, key: str, default: Any = None) -> Any:
        return default if self.data is None else self.data.get(key, default)

    def has(self, key: str) -> bool:
        return self.data is not None and key in self.data

    def key_pointer(self, key: str) -> str:
        return f"{self.pointer}/{key}"


@dataclass(frozen=True)
class RopeDicts:
    """The rope dict(s) of a text section: ``pointer`` of the container (``rope_scaling`` or
    ``rope_parameters``; where one belongs when absent), its entries, and whether they are per layer type."""

    pointer: str
    entries: tuple[RopeEntry, ...]
    nested: bool


def rope_dicts(text: Mapping[str, Any], pointer: str, *, strict: bool = True) -> RopeDicts:
    """The text section's rope dict(s), split per layer type when keyed by layer-type labels (the one walker
    the normaliser and the linter share). A truthy legacy ``rope_scaling`` replaces ``rope_parameters``.

    ``strict`` raises InvalidInput for a container or entry that is not an object; otherwise such a container
    is skipped and such an entry read as NoPE, so the linter can report each on its own.
    """
    for key in ROPE_CONTAINERS:
        value = text.get(key)
        if not value:
            continue
        container = f"{pointer}/{key}"
        if not is_json_object(value):
            if strict:
                raise InvalidInput(f"{key} must be an object", field=container)
            continue
        labels = layer_type_labels(text)
        nested = [label for label in value if label in labels]
        if not nested:
            return RopeDicts(container, (RopeEntry("full_attention", container, value),), nested=False)
        return RopeDicts(container, tuple(_layer_entry(value, container, label, strict) for label in nested), True)
    return RopeDicts(f"{pointer}/rope_parameters", (), nested=False)


def _layer_entry(rope_dict: Mapping[str, Any], container: str, label: str, strict: bool) -> RopeEntry:
    value = rope_dict[label]
    if value is not None and not is_json_object(value):
        if strict:
            raise InvalidInput(f"rope entry {label!r} must be an object or null", field=f"{container}/{label}")
        value = None
    return RopeEntry(label, f"{container}/{label}", value)


def layer_type_labels(text: Mapping[str, Any]) -> frozenset[str]:
    """Keys that mark a per-layer-type rope dict: the known labels plus the config's ``layer_types``."""
    layer_types = text.get("layer_types")
    declared = {t for t in layer_types if isinstance(t, str)} if isinstance(layer_types, list | tuple) else set()
    return LAYER_TYPE_LABELS | declared


def _layer_entries(
    text: Mapping[str, Any], pointer: str, family: ModelFamily, found: RopeDicts | None = None
) -> tuple[dict[str, tuple[dict[str, Any] | None, str]], bool]:
    """Per-layer-type entries (``None`` = NoPE layer) of the strict ``rope_dicts`` (``found`` when given), and
    whether they are per layer type; Gemma-3's ``rope_local_base_freq`` adds a default-RoPE ``sliding_attention``
    entry next to a flat dict (then they are: transformers 5 standardises such a config into per-layer-type
    ``rope_parameters``)."""
    found = rope_dicts(text, pointer) if found is None else found
    if found.nested:
        entries = {e.layer_type: (dict(e.data) if e.data is not None else None, e.pointer) for e in found.entries}
        return entries, True
    rope_dict = dict(found.entries[0].data or {}) if found.entries else {}
    full = (rope_dict, found.pointer)
    local_base = text.get("rope_local_base_freq", family.class_defaults.get("rope_local_base_freq"))
    if local_base is None:
        return {"full_attention": full}, False
    sliding = {"rope_type": "default", "rope_theta": local_base}
    explicit = "rope_local_base_freq" in text
    local_pointer = f"{pointer}/rope_local_base_freq" if explicit else "default:class:rope_local_base_freq"
    return {"full_attention": full, "sliding_attention": (sliding, local_pointer)}, True


Candidate = tuple[str, str, Any]
"""Where a value may come from, as ``(prefix, key, value)``: its source is ``prefix + key`` (a JSON pointer or
``default:...``), joined only for the candidate chosen."""


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
        self.entry_prefix, self.text_prefix = f"{entry_pointer}/", f"{pointer}/"
        self.sources: dict[str, str] = {}

    def first(self, name: str, *candidates: Candidate) -> Any:
        """First candidate that is present (not None); records its source (``prefix + key``) under ``name``."""
        for prefix, key, value in candidates:
            if value is not None:
                self.sources[name] = prefix + key
                return value
        return None

    def from_entry(self, key: str) -> Candidate:
        return self.entry_prefix, key, self.entry.get(key)

    def from_text(self, key: str) -> Candidate:
        return self.text_prefix, key, self.text.get(key)

    def from_class(self, key: str) -> Candidate:
        return "default:class:", key, self.family.class_defaults.get(key)

    def build(self, validate: bool = True) -> RopeParams:
        rope_type = self.rope_type()
        definition = lookup(rope_type)
        if definition is None and validate:
            raise InvalidInput(
                f"unknown rope_type {rope_type!r}; known: {sorted(ROPE_TYPES)}",
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
                    *(self.from_text(alias) for alias in ROTARY_FRACTION_ALIASES),
                    self.from_class("partial_rotary_factor"),
                    ("default", "", 1.0),
                ),
                "partial_rotary_factor",
                self.sources,
            ),
            max_position_embeddings=_as_int(max_pos, "max_position_embeddings", self.sources),
            factor=self.number("factor"),
            original_max_position_embeddings=_as_int(
                self.original_max(definition, max_pos), "original_max_position_embeddings", self.sources
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
            mrope_section=(section := self.mrope_section()),
            mrope_layout=self.mrope_layout(section),
            extras=self.extras(definition),
        )
        if validate and definition is not None:
            self.check_required(params, definition)
            validate_params(params, self.locations())
        return params

    def locations(self) -> dict[str, str]:
        """Where each value came from, or, for a value that was not given, where it belongs (for errors)."""
        missing = {key: f"{self.entry_pointer}/{key}" for key in (*FIELD_NAMES, *KNOWN_KEYS)}
        missing.update({key: f"{self.pointer}/{key}" for key in ("head_dim", "max_position_embeddings")})
        return {**missing, **self.sources}

    def rope_type(self) -> str:
        raw = self.first("rope_type", self.from_entry("rope_type"), self.from_entry("type"), ("default", "", "default"))
        if not isinstance(raw, str):
            raise InvalidInput("rope_type must be a string", field=self.sources["rope_type"])
        if raw in self.family.legacy_longrope_aliases:
            return "longrope"
        return ALIASES.get(raw, raw)

    def theta(self) -> float:
        value = self.first(
            "rope_theta",
            self.from_entry("rope_theta"),
            self.from_text("rope_theta"),
            *(self.from_text(alias) for alias in THETA_ALIASES),
            self.from_class("rope_theta"),
            ("default:family", "", self.family.default_theta),
        )
        return _as_float(value, "rope_theta", self.sources)

    def head_dim(self) -> int:
        candidates = [self.from_text("head_dim"), self.from_class("head_dim")]
        if self.family.head_dim_key:
            key = self.family.head_dim_key
            candidates = [self.from_text(key), self.from_class(key), *candidates]
        value = self.first("head_dim", *[candidate for candidate in candidates if candidate[2]])
        if value is None:
            hidden = self.text.get("hidden_size") or self.family.class_defaults.get("hidden_size")
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

    def original_max(self, definition: RopeType | None, max_pos: Any) -> Any:
        """transformers' rule: for the types that read it (llama3/yarn/longrope) a config attribute
        ``original_max_position_embeddings`` (a top-level key, or a class default such as Phi-3's 4096)
        overwrites a flat rope dict's value; a per-layer-type entry only falls back to ``max_position_embeddings``.
        """
        key = "original_max_position_embeddings"
        candidates = [self.from_entry(key)]
        if definition is not None and definition.original_from_config:
            if not self.nested:
                candidates = [self.from_text(key), self.from_class(key), *candidates]
            candidates.append(("default:max_position_embeddings", "", max_pos))
        return self.first(key, *candidates)

    def entry_value(self, key: str) -> Any:
        """``first(key, from_entry(key))`` without formatting the pointer of an absent key."""
        value = self.entry.get(key)
        if value is not None:
            self.sources[key] = self.entry_prefix + key
        return value

    def number(self, key: str) -> float | None:
        if key not in self.entry:  # most numeric keys are absent: answered without the entry_value call
            return None
        value = self.entry_value(key)
        return None if value is None else _as_float(value, key, self.sources)

    def factor_list(self, key: str) -> tuple[float, ...] | None:
        value = self.entry_value(key)
        if value is None:
            return None
        if not isinstance(value, list | tuple) or not _all_numbers(value):
            raise InvalidInput(f"{key} must be a list of numbers", field=self.sources[key])
        return tuple(map(float, value))

    def mrope_section(self) -> tuple[int, ...] | None:
        value = self.entry_value("mrope_section")
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

    def mrope_layout(self, section: tuple[int, ...] | None) -> MropeLayout | None:
        """The family's M-RoPE layout, else the entry's ``mrope_interleaved`` flag's (None without sections)."""
        if section is None:
            return None
        return self.family.mrope_layout or ("interleaved" if self.entry.get("mrope_interleaved") else "chunked")

    def extras(self, definition: RopeType | None) -> tuple[tuple[str, float], ...]:
        """The type's numeric keys that no ``RopeParams`` field holds, as ``(key, value)`` pairs."""
        if definition is None:
            return ()
        own = OWN_KEYS[definition.name]
        return tuple((key, value) for key in own if (value := self.number(key)) is not None)

    def check_required(self, params: RopeParams, definition: RopeType) -> None:
        required = definition.required
        present = {key for key in required if params.value(key) is not None}
        if definition.null_factor_allowed and "factor" in self.entry:
            present.add("factor")  # an explicit null factor means max_position_embeddings / original
        missing = sorted(required - present)
        if missing:
            raise InvalidInput(
                f"rope_type {params.rope_type!r} requires {missing}",
                field=f"{self.entry_pointer}/{missing[0]}",
            )


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _all_numbers(values: list[Any] | tuple[Any, ...]) -> bool:
    """Whether every value ``_is_number``: lists of the exact ``int``/``float`` types told by one C-level pass."""
    return set(map(type, values)) <= _NUMBER_TYPES or all(map(_is_number, values))


_NUMBER_TYPES = frozenset({int, float})


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
    if not INT64_MIN <= value <= INT64_MAX:  # 1e308 (an integral float) or 2**64: no engine stores it
        raise InvalidInput(f"{key} is beyond int64 (a {value.bit_length()}-bit integer)", field=sources.get(key, key))
    return value
