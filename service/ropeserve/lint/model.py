"""A config as the linter sees it: the raw rope entries (tolerant) next to the lenient normalisation."""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ropeserve.config import ModelFamily, NormalizedConfig, RopeParams, family_of, validate_params
from ropeserve.config.jsonsafe import check_json_numbers, is_json_object
from ropeserve.config.normalize import (
    RopeDicts,
    RopeEntry,
    checked_model_type,
    complete_text,
    normalize_text,
    rope_dicts,
    text_section,
)
from ropeserve.config.rope_types import Problem, lookup
from ropeserve.config.validate import problems, window_problems
from ropeserve.errors import InvalidInput
from ropeserve.lint import pointers
from ropeserve.lint.lazy import lazy

TEXT_LEVEL_KEYS = frozenset({"max_position_embeddings", "head_dim", "hidden_size", "num_attention_heads"})
MAX_HEAD_DIM = 4096
"""Larger heads are treated as a config error (RS206); real models use at most 512."""


@dataclass(frozen=True)
class ModelView:
    """``document`` is the config the engines see (after any rope override); ``text`` its text-model section."""

    document: Mapping[str, Any]
    text: Mapping[str, Any]
    text_pointer: str
    model_type: str | None
    family: ModelFamily
    entries: tuple[RopeEntry, ...]
    normalized: NormalizedConfig | None = None
    error: InvalidInput | None = None
    layers: dict[str, RopeParams] = field(default_factory=dict)
    filled: Mapping[str, str] = field(default_factory=dict)
    """Pointers of keys the linter filled in as the config class does (``/hidden_size`` from ``n_embd``, a
    class default) -> where the value really came from (``/n_embd``, ``default:class:hidden_size``)."""

    @classmethod
    def build(
        cls, config: Mapping[str, Any], rope_override: Mapping[str, Any] | None = None, *, numbers_checked: bool = False
    ) -> ModelView:
        """The view of ``config`` (with ``rope_override`` as its rope dict); ``numbers_checked``: ``config`` and the
        override have passed ``check_json_numbers`` (``normalize_config``'s argument)."""
        if not is_json_object(config):
            raise InvalidInput("config must be a JSON object", field="/config")
        document = _with_override(config, rope_override) if rope_override is not None else config
        raw_text, text_pointer = text_section(document)
        model_type = raw_text.get("model_type") or document.get("model_type")
        family = family_of(model_type if isinstance(model_type, str) else None)
        document, text, filled = _as_config_class(document, raw_text, text_pointer, family)
        strict = _strict_rope_dicts(text, text_pointer)
        try:
            normalized, error = _normalized(document, text, text_pointer, family, strict, numbers_checked), None
        except InvalidInput as failure:
            normalized, error = None, failure
        layers = {} if normalized is None else {k: p for k, p in normalized.layers.items() if p is not None}
        return cls(
            document=document,
            text=text,
            text_pointer=text_pointer,
            model_type=model_type if isinstance(model_type, str) else None,
            family=family,
            entries=(strict or rope_dicts(text, text_pointer, strict=False)).entries,
            normalized=normalized,
            error=error if error is None or not error.field else _refiled(error, filled),
            layers=layers,
            filled=filled,
        )

    @lazy
    def main_layer_type(self) -> str | None:
        """The layer type of ``main``: full attention, or the first RoPE layer type (None without one)."""
        if not self.layers:
            return None
        return "full_attention" if "full_attention" in self.layers else next(iter(self.layers))

    @lazy
    def main(self) -> RopeParams | None:
        """Full-attention parameters (or the only RoPE layer type's)."""
        return None if self.main_layer_type is None else self.layers[self.main_layer_type]

    @lazy
    def computable_main(self) -> RopeParams | None:
        """``main`` when its frequencies are defined: a known rope type with its required keys, within
        MAX_HEAD_DIM, passing the normaliser's strict validation."""
        main, layer_type = self.main, self.main_layer_type
        if main is None or layer_type is None:
            return None
        try:
            check_computable(main, found=self.layer_problems[layer_type])
        except InvalidInput:
            return None
        return main

    @lazy
    def written_entries(self) -> tuple[RopeEntry, ...]:
        """The rope entries that hold a dict (a NoPE layer's ``null`` left out)."""
        return tuple(entry for entry in self.entries if entry.data is not None)

    @lazy
    def mrope_layers(self) -> dict[str, RopeParams]:
        """The RoPE layer types with M-RoPE sections."""
        return {name: params for name, params in self.layers.items() if params.mrope_section is not None}

    @lazy
    def layer_problems(self) -> dict[str, tuple[Problem, ...]]:
        """What the service's validator (``validate.problems``) finds in each RoPE layer type's parameters."""
        return {layer_type: tuple(problems(params)) for layer_type, params in self.layers.items()}

    @lazy
    def window_problems(self) -> tuple[Problem, ...]:
        """``validate.window_problems`` of the text section (an invalid ``sliding_window``)."""
        return tuple(window_problems(self.text))

    @lazy
    def main_entry(self) -> RopeEntry | None:
        return next((e for e in self.entries if e.layer_type == "full_attention"), None) or (
            self.entries[0] if self.entries else None
        )

    def source(self, layer_type: str, key: str) -> str:
        """Where ``key`` of ``layer_type`` came from: a JSON pointer, or ``default:...``."""
        if self.normalized is None:
            return "default"
        source = self.normalized.sources.get(layer_type, {}).get(key, "default")
        return self.filled.get(source, source)

    def pointer(self, layer_type: str, key: str) -> str:
        """A JSON pointer for ``key``: its source, or where it belongs in the rope dict when defaulted."""
        source = self.source(layer_type, key)
        if source.startswith("/"):
            return source
        if key in TEXT_LEVEL_KEYS:
            return pointers.join(self.text_pointer, key)
        entry = next((e for e in self.entries if e.layer_type == layer_type), self.main_entry)
        base = entry.pointer if entry is not None else pointers.join(self.text_pointer, "rope_parameters")
        return pointers.join(base, key)

    def text_value(self, key: str) -> Any:
        """``key`` from the text section, else the model class default (as transformers fills it in)."""
        value = self.text.get(key)
        return self.family.class_defaults.get(key) if value is None else value

    @property
    def is_gemma3(self) -> bool:
        return "gemma3" in (self.model_type or "")


def check_computable(
    params: RopeParams, sources: Mapping[str, str] | None = None, found: Iterable[Problem] | None = None
) -> None:
    """Raise InvalidInput unless ``params`` define frequencies the linter can tabulate (``found``: the
    ``validate.problems`` of ``params``, when the caller has them already)."""
    definition = lookup(params.rope_type)
    if definition is None:
        raise InvalidInput(f"no frequency model for rope_type {params.rope_type!r}", field="rope_type")
    missing = sorted(key for key in definition.required if params.value(key) is None)
    if missing:
        raise InvalidInput(f"rope_type {params.rope_type!r} requires {missing}", field=missing[0])
    validate_params(params, sources, found)
    if params.rope_theta <= 1:
        raise InvalidInput(f"rope_theta {params.rope_theta:g} must exceed 1", field="rope_theta")
    if params.head_dim > MAX_HEAD_DIM:
        raise InvalidInput(f"head_dim {params.head_dim} exceeds {MAX_HEAD_DIM}", field="head_dim")


def _as_config_class(
    document: Mapping[str, Any], text: Mapping[str, Any], text_pointer: str, family: ModelFamily
) -> tuple[Mapping[str, Any], Mapping[str, Any], dict[str, str]]:
    """``document`` with its text section completed as the config class completes it (``complete_text``, the
    normaliser's own step), so the engine rules read the same keys; ``document`` itself when nothing is missing.
    Returns it, its text section and the pointers filled -> their real source."""
    section, filled = complete_text(text, text_pointer, family)
    if not filled:
        return document, text, filled
    completed = copy.deepcopy(dict(document))
    completed_text = pointers.resolve(completed, text_pointer)
    completed_text.update(section)
    return completed, completed_text, filled


def _strict_rope_dicts(text: Mapping[str, Any], text_pointer: str) -> RopeDicts | None:
    """``rope_dicts`` of the text section, None where the strict reading refuses it (a rope container or entry that
    is no object: the lenient reading, which the view reports, differs only then)."""
    try:
        return rope_dicts(text, text_pointer)
    except InvalidInput:
        return None


def _normalized(
    document: Mapping[str, Any],
    text: Mapping[str, Any],
    text_pointer: str,
    family: ModelFamily,
    strict: RopeDicts | None,
    numbers_checked: bool,
) -> NormalizedConfig:
    """``normalize_config(document, validate=False, numbers_checked=numbers_checked)`` from the view's own reading:
    ``text`` is ``document``'s text section completed already (so nothing is filled again) and ``strict`` its
    strict ``rope_dicts`` (None: the normaliser reads them again and raises its error)."""
    if not numbers_checked:
        check_json_numbers(document)
    model_type = checked_model_type(document, text, text_pointer)
    return normalize_text(text, text_pointer, model_type, family, validate=False, found=strict)


def _refiled(error: InvalidInput, filled: Mapping[str, str]) -> InvalidInput:
    """``error`` pointing at the key the file wrote rather than at one the linter filled in."""
    source = filled.get(error.field or "")
    if source is None or not source.startswith("/"):
        return error
    error.field = source
    return error


def _with_override(config: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """The config with its rope dict replaced by ``override`` (as ``--hf-overrides rope_parameters`` does)."""
    document = copy.deepcopy(dict(config))
    _, text_pointer = text_section(document)
    section = pointers.resolve(document, text_pointer)
    section.pop("rope_scaling", None)
    section["rope_parameters"] = dict(override)
    return document
