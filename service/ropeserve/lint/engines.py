"""What each target engine does with a config: rope-kind support, required keys, derived length, cache rows.

Facts come from engines-and-config-lint.md (§1 vLLM stack, §2 length derivation, §6 support matrix) and are
pinned to the versions read there (vLLM @18ec6629, SGLang @eb047c16, TGI @db931fcf). vLLM PR #56446 (2026)
changes the yarn-alias handling of step 5; re-read it against the version you pin.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, TypeGuard

from ropeserve.config import RopeParams
from ropeserve.config.jsonsafe import INT64_MAX
from ropeserve.config.rope_types import effective_factor, finite_positive, lookup, lookup_for_engines, yarn
from ropeserve.config.rope_types.base import LengthRule
from ropeserve.config.validate import SLIDING_WINDOW
from ropeserve.lint.intent import ENGINES, DeploymentIntent, EngineTarget
from ropeserve.lint.lazy import lazy
from ropeserve.lint.model import ModelView
from ropeserve.lint.versions import Version

VLLM_ROPE_SOURCE = (
    "https://github.com/vllm-project/vllm/blob/0042be241b0fc66d2357ebf144bf870bfdff7f10/"
    "vllm/model_executor/layers/rotary_embedding.py"
)
"""vLLM's ``get_rope`` at this commit: indexes each type's required keys (KeyError), passes YaRN's ``attn_factor``
(not ``attention_factor``), raises ValueError for unknown types; Phi3LongRoPEScaledRotaryEmbedding raises for
GPT-J pairing."""
VLLM_MAX_LEN_SOURCE = (
    "https://github.com/vllm-project/vllm/blob/18ec6629253632af0a384f2ffbb8c6b28af322e7/vllm/config/model.py"
)
"""vLLM's ``_get_and_verify_max_len`` at this commit: the smallest length key, capped at ``sliding_window`` when the
window is disabled, times the rope factor (yarn from the original length; longrope, llama3 and Gemma-3 not), and
with no ``max_model_len`` longrope's default of the top-level ``original_max_position_embeddings``."""
VLLM_WINDOW_KEY_SOURCE = (
    "https://github.com/vllm-project/vllm/blob/0004438383ee731a6e44708609d175c48528a8d0/vllm/config.py"
)
"""vLLM's ModelConfig at this commit: ``get_hf_config_sliding_window`` returns None when ``use_sliding_window`` is
false (later versions read ``sliding_window`` from the transformers config class, which sets it to None then)."""
ENGINE_SOURCES: dict[str, dict[str, str]] = {
    "vllm": {
        "RS106": VLLM_ROPE_SOURCE,
        "RS108": VLLM_ROPE_SOURCE,
        "RS311": VLLM_MAX_LEN_SOURCE,
        "RS312": VLLM_MAX_LEN_SOURCE,
        "RS603": VLLM_ROPE_SOURCE,
    },
}
"""engine -> rule id -> the engine's own source for that rule's engine-specific findings, where the rule's
reference is not one (issue 14: a vLLM finding cites a vLLM source)."""

TOKENIZER_SENTINEL = 10**15
"""``tokenizer_config.model_max_length`` at or above this is transformers' "no limit" placeholder."""


@dataclass(frozen=True)
class Support:
    """One cell of the §6 matrix: Y, P (caveat, reported by its own rule), N (refused), ? (not verified),
    D (dropped: the engine ignores the scaling and runs the unscaled rope, right only inside the trained length)."""

    level: str
    since: str | None = None
    note: str = ""

    @lazy
    def since_version(self) -> Version | None:
        """``since`` parsed (once per matrix cell)."""
        return Version.parse(self.since) if self.since else None

    def refuses(self, target: EngineTarget) -> str | None:
        """Why ``target`` cannot run this kind (None when it can, or when it is only unverified)."""
        if self.level == "N":
            return self.note or "not supported"
        if self.since_version is not None and target.spec.may_predate(self.since_version):
            return f"needs {target.name} >= {self.since}" + (f" ({self.note})" if self.note else "")
        return None


def _row(transformers: Support, vllm: Support, sglang: Support, tgi: Support, llama_cpp: Support) -> dict[str, Support]:
    return dict(zip(ENGINES, (transformers, vllm, sglang, tgi, llama_cpp), strict=True))


Y, P, N, UNKNOWN = Support("Y"), Support("P"), Support("N"), Support("?")
VLLM_ONLY = _row(N, Y, N, N, N)
SUPPORT: dict[str, dict[str, Support]] = {
    "default": _row(Y, Y, Y, Y, Y),
    "linear": _row(Y, Y, Y, P, Y),
    "dynamic": _row(
        Y, P, P, Y, Support("D", note="llama.cpp's converter drops dynamic NTK scaling; the GGUF runs unscaled rope")
    ),
    "yarn": _row(Y, Y, Y, P, Y),
    "longrope": _row(Y, P, Y, P, P),
    "llama3": _row(
        Support("Y", "4.43.0", "llama3 rope type"), Support("Y", "0.5.3", "Llama 3.1 rope scaling"), Y, Y, Y
    ),
    "mrope_chunked": _row(Support("Y", "4.45.0", "Qwen2-VL M-RoPE"), Y, Y, Y, Y),
    "mrope_interleaved": _row(
        Support("Y", "4.57.0", "Qwen3-VL interleaved M-RoPE"),
        Y,
        Y,
        Support("N", note="TGI has no interleaved M-RoPE (no Qwen3-VL model)"),
        Y,
    ),
    "deepseek_yarn": _row(
        Support("N", note="transformers has no 'deepseek_yarn' type; DeepSeek configs say 'yarn'"),
        Y,
        Y,
        Support("N", note="TGI raises NotImplementedError for unknown rope types"),
        UNKNOWN,
    ),
    "deepseek_llama_scaling": _row(N, Y, Y, N, UNKNOWN),
    "proportional": _row(Y, UNKNOWN, UNKNOWN, UNKNOWN, UNKNOWN),
    "ntk": VLLM_ONLY,
    "xdrope": VLLM_ONLY,
    "mllama4": VLLM_ONLY,
}


def rope_kinds(params: RopeParams) -> tuple[str, ...]:
    """The §6 rows a layer's parameters fall under: its type, plus the M-RoPE layout when sectioned."""
    kinds = [params.rope_type]
    if params.mrope_section is not None:
        kinds.append(f"mrope_{params.mrope_layout or 'chunked'}")
    return tuple(kinds)


def support(kind: str, engine: str) -> Support:
    row = SUPPORT.get(kind)
    if row is None:
        return Support("N", note=f"unknown rope type {kind!r}")
    return row[engine]


Requirement = tuple[str, ...]
"""Alternative keys, one of which must be present."""

_LLAMA3_KEYS: tuple[Requirement, ...] = (
    ("factor",),
    ("low_freq_factor",),
    ("high_freq_factor",),
    ("original_max_position_embeddings",),
)
_VLLM_REQUIRED: dict[str, tuple[Requirement, ...]] = {
    "linear": (("factor",),),
    "dynamic": (("factor", "alpha"),),
    "yarn": (("factor",), ("original_max_position_embeddings",)),
    "deepseek_yarn": (("factor",), ("original_max_position_embeddings",)),
    "llama3": _LLAMA3_KEYS,
    "longrope": (("short_factor",), ("long_factor",), ("original_max_position_embeddings",)),
}
REQUIRED_KEYS: dict[str, dict[str, tuple[Requirement, ...]]] = {
    # transformers fills original_max_position_embeddings from max_position_embeddings (standardisation).
    "transformers": {
        "linear": (("factor",),),
        "dynamic": (("factor",),),
        "yarn": (("factor",),),
        "llama3": _LLAMA3_KEYS[:3],
        "longrope": (("short_factor",), ("long_factor",)),
    },
    # get_rope indexes the dict directly: KeyError at model init.
    "vllm": _VLLM_REQUIRED,
    # SGLang's factory reads ``factor`` for dynamic even when ``alpha`` is given.
    "sglang": {**_VLLM_REQUIRED, "dynamic": (("factor",),)},
}
TOP_LEVEL_FOLDED = frozenset({"original_max_position_embeddings", "rope_theta", "partial_rotary_factor"})
"""Keys vLLM's ``patch_rope_parameters`` (and SGLang's config loader) copy from the top level into the dict."""


@dataclass(frozen=True)
class WindowCap:
    """vLLM serving a model with its sliding window disabled: ``_get_and_verify_max_len`` then caps the derived
    length at the window (``derived = min(derived, sliding_window)``), because every layer attends globally."""

    window: int
    reason: str
    fix: str


VLLM_GEMMA2_FULL_LENGTH = Version.parse("0.6.5")
"""vLLM 0.5.1 (PR #5908) disabled Gemma-2's interleaved window and capped the length at 4,096; PR #10584,
released in 0.6.5, serves the full 8,192 (the XFORMERS backend kept the cap)."""


def declared_window(view: ModelView) -> int | None:
    """The window vLLM reads (``ModelConfig.get_hf_config_sliding_window``): ``sliding_window`` unless
    ``use_sliding_window`` is false; the smallest of a per-layer list. None when absent or invalid (RS208)."""
    if view.text.get("use_sliding_window") is False or view.window_problems:
        return None
    value = view.text.get(SLIDING_WINDOW)
    values = [int(v) for v in (value if isinstance(value, list) else [value]) if v is not None]
    return min(values, default=None)


def vllm_window_cap(view: ModelView, target: EngineTarget, intent: DeploymentIntent) -> WindowCap | None:
    """Whether ``target`` (vLLM) disables the config's sliding window, capping the length at it."""
    window = declared_window(view)
    if window is None:
        return None
    if intent.disable_sliding_window:
        return WindowCap(
            window,
            "--disable-sliding-window",
            "Drop --disable-sliding-window (vLLM's attention backends run the window), or serve at most the window.",
        )
    if view.model_type == "gemma2" and target.spec.may_predate(VLLM_GEMMA2_FULL_LENGTH):
        return WindowCap(
            window,
            "vLLM 0.5.1-0.6.4 disables Gemma-2's interleaved window",
            "Use vLLM >= 0.6.5 (PR #10584) with a backend other than XFORMERS for Gemma-2's full length.",
        )
    return None


@dataclass(frozen=True)
class EngineLength:
    """Per-engine length facts (§2): what it derives, serves by default, and how many cos/sin rows it caches."""

    engine: str
    derived: int | None
    derived_from: str
    default: int | None
    check: str
    override_env: str | None = None
    notes: tuple[str, ...] = ()
    cache_rows_by_layer: Mapping[str, int] = field(default_factory=dict)
    window_cap: WindowCap | None = None
    """Set when the engine disables the sliding window and so caps ``derived`` at it (vLLM)."""

    @lazy
    def cache_rows(self) -> int | None:
        """The binding cache size: the smallest over the RoPE layer types (None when the engine has no cache)."""
        return min(self.cache_rows_by_layer.values(), default=None)

    def served(self, requested: int | None) -> int | None:
        return requested if requested is not None else self.default

    def as_dict(self) -> dict[str, Any]:
        return {
            "engine": self.engine,
            "derived_max_len": self.derived,
            "derived_from": self.derived_from,
            "default_max_len": self.default,
            "rope_cache_rows": self.cache_rows,
            "rope_cache_rows_by_layer": dict(self.cache_rows_by_layer),
            "length_check": self.check,
            "override_env": self.override_env,
            "notes": list(self.notes),
        }


VLLM_LENGTH_KEYS = (
    "max_position_embeddings",
    "n_positions",
    "max_seq_len",
    "seq_length",
    "model_max_length",
    "max_target_positions",
    "max_sequence_length",
    "max_seq_length",
    "seq_len",
)
SGLANG_LENGTH_KEYS = ("max_sequence_length", "seq_length", "max_seq_len", "model_max_length", "max_position_embeddings")
TGI_LENGTH_KEYS = ("max_position_embeddings", "max_seq_len", "n_positions")
ENGINE_DEFAULT_LENGTH = 2048
LENGTH_CEILING = INT64_MAX
"""Derived lengths and cache rows saturate here, so absurd factors cannot overflow the arithmetic and every length
the report states fits the int64 of its consumers (2**63 once came out of ``2**63 - 1`` times a float 1.0)."""


def scaled_length(length: float, factor: float) -> int:
    """``int(length * factor)``, saturating at 0 and LENGTH_CEILING (a NaN product is 0): callers pass positive
    values, and a value that slipped through unchecked (a negative length, -1e308) gives a bound, never an
    OverflowError. An integer length past the float range (``4 * int(1e308)``: vLLM's M-RoPE cache rows of a
    1e308 length) is scaled exactly, as a fraction."""
    try:
        product: float | Fraction = length * factor
    except OverflowError:
        product = Fraction(length) * Fraction(factor) if math.isfinite(factor) else math.copysign(math.inf, factor)
    if not product > 0:  # negative, zero or NaN
        return 0
    return int(min(product, LENGTH_CEILING))


def length_value(view: ModelView, key: str) -> int | None:
    """``key`` of the text section (class default included) as a length: a finite positive number, truncated
    (an int exactly: float(2**63 - 1) is 2**63), at most LENGTH_CEILING."""
    if key not in view.text and key not in view.family.class_defaults:
        return None  # most length keys are absent: answered without the calls below
    raw = view.text_value(key)
    value = finite_positive(raw)
    if value is None:
        return None
    return min(raw if type(raw) is int else int(value), LENGTH_CEILING)


def length_keys(view: ModelView, keys: tuple[str, ...]) -> dict[str, int]:
    """The positive length keys of the text section that appear in ``keys`` (class defaults included)."""
    return {key: value for key in _written(view, keys) if (value := length_value(view, key)) is not None}


def first_length_key(view: ModelView, keys: tuple[str, ...]) -> tuple[str, int] | None:
    """The first of ``keys`` that ``length_keys`` would return, with its length (None when there is none)."""
    for key in _written(view, keys):
        if (value := length_value(view, key)) is not None:
            return key, value
    return None


def _written(view: ModelView, keys: tuple[str, ...]) -> list[str]:
    """The keys of ``keys`` that the text section or the class defaults hold: most length keys are absent, and
    telling them apart here costs no ``length_value`` call each (the nine vLLM keys are scanned per lint run)."""
    text, defaults = view.text, view.family.class_defaults
    return [key for key in keys if key in text or key in defaults]


def tokenizer_limit(tokenizer_config: Mapping[str, Any] | None) -> int | None:
    if tokenizer_config is None:
        return None
    value = finite_positive(tokenizer_config.get("model_max_length"))
    return int(value) if value is not None and value < TOKENIZER_SENTINEL else None


def cache_rows_by_layer(view: ModelView, engine: str) -> dict[str, int]:
    """Rows of the engine's precomputed cos/sin cache per RoPE layer type (vLLM, SGLang; empty otherwise)."""
    if engine not in ("vllm", "sglang"):
        return {}
    rows = {name: cache_rows_for(params, engine) for name, params in view.layers.items()}
    return {name: count for name, count in rows.items() if count is not None}


def cache_rows_for(params: RopeParams, engine: str) -> int | None:
    """Cache rows vLLM/SGLang allocate for one layer type's parameters (None without a positive length: a
    negative ``max_position_embeddings`` is a range finding, not a cache of negative size)."""
    base = params.max_position_embeddings
    if base is None or finite_positive(base) is None:
        return None
    factor = effective_factor(params)
    original = int(finite_positive(params.original_max_position_embeddings) or base)
    mrope_rows = 4 if engine == "vllm" and params.mrope_section is not None else 1
    rule = _length_rule(params)
    if rule == "original_x_factor":
        return scaled_length(mrope_rows * original, factor)
    if rule == "max_x_factor":
        return scaled_length(base, factor)
    return min(mrope_rows * base, LENGTH_CEILING)


def _length_rule(params: RopeParams) -> LengthRule:
    """How the rope type extends the context (``max`` for a type no registry entry describes)."""
    definition = lookup_for_engines(params.rope_type)
    return "max" if definition is None else definition.extended_length


def _vllm_length(
    view: ModelView, tokenizer_config: Mapping[str, Any] | None, window_cap: WindowCap | None
) -> EngineLength:
    derived, source = _vllm_rope_scaling(view, *_vllm_key_length(view, tokenizer_config, window_cap))
    return EngineLength(
        engine="vllm",
        derived=derived,
        derived_from=source,
        default=_vllm_default_length(view, derived),
        check="refuse",
        override_env="VLLM_ALLOW_LONG_MAX_MODEL_LEN",
        cache_rows_by_layer=cache_rows_by_layer(view, "vllm"),
        window_cap=window_cap if source.startswith(SLIDING_WINDOW) else None,
    )


def _vllm_key_length(
    view: ModelView, tokenizer_config: Mapping[str, Any] | None, window_cap: WindowCap | None = None
) -> tuple[int, str]:
    """Steps 1-4: the smallest length key (``model_max_length`` replaces them all), capped at the sliding window
    when vLLM disables it, then by the tokenizer's."""
    found = length_keys(view, VLLM_LENGTH_KEYS)
    if not found:
        return ENGINE_DEFAULT_LENGTH, "no length key: vLLM assumes 2048"
    if "model_max_length" in found:
        derived, source = found["model_max_length"], "model_max_length (replaces the other keys)"
    else:
        key = min(found, key=found.__getitem__)
        derived, source = found[key], f"{key} (smallest length key)"
    if window_cap is not None and window_cap.window < derived:
        derived, source = window_cap.window, f"{SLIDING_WINDOW} ({window_cap.reason})"
    limit = tokenizer_limit(tokenizer_config)
    if limit is not None and limit < derived:
        return limit, "tokenizer_config model_max_length"
    return derived, source


def _vllm_rope_scaling(view: ModelView, derived: int, source: str) -> tuple[int, str]:
    """Step 5: times the rope factor (yarn restarts from the original length); llama3, longrope and Gemma-3
    keep the length, which already includes their extension."""
    if view.is_gemma3:
        return derived, f"{source} (gemma3: rope factor not applied)"
    factor = 1.0
    for params in view.layers.values():
        definition = lookup_for_engines(params.rope_type)
        if definition is not None and definition.length_includes_extension:
            continue
        factor = finite_positive(params.factor) or factor
        original = finite_positive(params.original_max_position_embeddings)
        if lookup(params.rope_type) is yarn.ROPE_TYPE and original:
            derived, source = int(original), "original_max_position_embeddings"
    if factor == 1.0:
        return derived, source
    return scaled_length(derived, factor), f"{source} x factor {factor:g}"


def _vllm_default_length(view: ModelView, derived: int) -> int:
    """Step 7: with no max_model_len, longrope serves the top-level original length, others the derived one."""
    main, original = view.main, finite_positive(view.text.get("original_max_position_embeddings"))
    if main is not None and main.rope_type == "longrope" and original:
        return int(original)
    return derived


def _sglang_length(view: ModelView, tokenizer_config: Mapping[str, Any] | None, _: WindowCap | None) -> EngineLength:
    entry = view.main_entry
    written = finite_positive(entry.get("factor", 1) if entry is not None else 1) or 1
    dropped = entry is not None and (
        entry.has("original_max_position_embeddings") or entry.get("rope_type") == "llama3"
    )
    per_layer_type = len(view.layers) > 1
    factor = 1 if dropped or per_layer_type else written
    first = first_length_key(view, SGLANG_LENGTH_KEYS)
    base, source = (first[1], first[0]) if first else (ENGINE_DEFAULT_LENGTH, "no length key: SGLang assumes 2048")
    derived = scaled_length(base, factor)
    if factor != 1:
        source += f" x factor {factor:g}"
    elif per_layer_type and written != 1:
        source += (
            " (factor not applied: under transformers 5 rope_scaling is the per-layer-type rope_parameters, "
            "which has no top-level factor)"
        )
    elif written != 1:
        source += " (factor dropped: the rope dict has original_max_position_embeddings or is llama3)"
    return EngineLength(
        engine="sglang",
        derived=derived,
        derived_from=source,
        default=derived,
        check="refuse",
        override_env="SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN",
        cache_rows_by_layer=cache_rows_by_layer(view, "sglang"),
    )


def _tgi_length(view: ModelView, tokenizer_config: Mapping[str, Any] | None, _: WindowCap | None) -> EngineLength:
    written = ((k, view.document.get(k)) for k in TGI_LENGTH_KEYS)
    top = {k: value for k, value in written if _positive_int(value)}
    key = next(iter(top), None)
    notes = ["cos/sin grow with the longest sequence seen; no startup length check"]
    if key is None:
        notes.append("the launcher reads top-level keys only and found none (not verified)")
        return EngineLength("tgi", None, "no top-level length key", None, "none", None, tuple(notes))
    derived: int = min(top[key], LENGTH_CEILING)
    source = key
    limit = tokenizer_limit(tokenizer_config)
    if limit is not None and limit < derived:
        derived, source = limit, "tokenizer_config model_max_length"
    return EngineLength("tgi", derived, source, derived, "none", None, tuple(notes))


def _positive_int(value: object) -> TypeGuard[int]:
    """A length TGI's launcher can read (an unsigned JSON integer; not a bool, not zero or negative)."""
    return type(value) is int and value > 0


def _llama_cpp_length(view: ModelView, tokenizer_config: Mapping[str, Any] | None, _: WindowCap | None) -> EngineLength:
    n_ctx_train = length_value(view, "max_position_embeddings")
    notes = ("n_ctx_train = GGUF context_length, converted from max_position_embeddings",)
    return EngineLength("llama.cpp", n_ctx_train, "max_position_embeddings", n_ctx_train, "cap", None, notes)


def _transformers_length(
    view: ModelView, tokenizer_config: Mapping[str, Any] | None, _: WindowCap | None
) -> EngineLength:
    max_positions = length_value(view, "max_position_embeddings")
    notes = ("cos/sin computed per forward in float32; no cache, no length check",)
    return EngineLength("transformers", max_positions, "max_position_embeddings", max_positions, "none", None, notes)


LengthDeriver = Callable[[ModelView, Mapping[str, Any] | None, WindowCap | None], EngineLength]
"""(config, tokenizer_config, the window cap when the engine disables the sliding window) -> its lengths."""
LENGTH_DERIVERS: dict[str, LengthDeriver] = {
    "transformers": _transformers_length,
    "vllm": _vllm_length,
    "sglang": _sglang_length,
    "tgi": _tgi_length,
    "llama.cpp": _llama_cpp_length,
}


def derive_length(
    view: ModelView,
    engine: str,
    tokenizer_config: Mapping[str, Any] | None = None,
    window_cap: WindowCap | None = None,
) -> EngineLength:
    return LENGTH_DERIVERS[engine](view, tokenizer_config, window_cap)


def position_capacity(view: ModelView) -> int | None:
    """The longest context the rope config is trained or scaled for, engine-independent.

    ``max_position_embeddings``, except yarn (``original x factor`` when larger) and linear/dynamic scaling
    of an unscaled length (``max_position_embeddings x factor``; Gemma-3 stores the scaled length already).
    A larger ``model_max_length`` written in config.json itself is the author's statement of the trained context
    (Command-R v01: 131,072 next to max_position_embeddings 8,192, reached by rope_theta 8e6 alone).
    """
    main = view.main
    limit = finite_positive(main.max_position_embeddings) if main is not None else None
    if main is None or limit is None:
        return None
    declared = finite_positive(view.text.get("model_max_length"))
    if declared is not None and limit < declared < TOKENIZER_SENTINEL:
        limit = declared
    limit, factor = int(limit), effective_factor(main)
    original = finite_positive(main.original_max_position_embeddings)
    rule = _length_rule(main)
    if rule == "original_x_factor" and original:
        return max(limit, scaled_length(original, factor))
    if rule == "max_x_factor" and not view.is_gemma3:
        return scaled_length(limit, factor)
    return limit
