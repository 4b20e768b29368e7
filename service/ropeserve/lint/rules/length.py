"""RS3xx: requested context length against what each engine derives and caches (§2)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import replace
from typing import Any

from ropeserve.config import RopeParams
from ropeserve.config.rope_types import effective_factor, finite_positive
from ropeserve.config.validate import SLIDING_WINDOW
from ropeserve.lint import pointers
from ropeserve.lint.context import LintContext
from ropeserve.lint.engines import (
    SGLANG_LENGTH_KEYS,
    TGI_LENGTH_KEYS,
    VLLM_LENGTH_KEYS,
    VLLM_MAX_LEN_SOURCE,
    VLLM_WINDOW_KEY_SOURCE,
    WindowCap,
    cache_rows_for,
    derive_length,
    first_length_key,
    position_capacity,
    scaled_length,
    tokenizer_limit,
)
from ropeserve.lint.findings import NOTE, Hit, Severity, rule
from ropeserve.lint.rules.common import TRANSFORMERS_5, definition_of, fmt, is_yarn
from ropeserve.lint.versions import Version

ERROR, WARNING, INFO = Severity.ERROR, Severity.WARNING, Severity.INFO
ALL_LENGTH_KEYS = tuple(dict.fromkeys(VLLM_LENGTH_KEYS + SGLANG_LENGTH_KEYS + TGI_LENGTH_KEYS))
_IS_LENGTH_KEY = frozenset(ALL_LENGTH_KEYS)
ENGINE_LENGTH_FLAG = {"vllm": "--max-model-len", "sglang": "--context-length", "llama.cpp": "-c/--ctx-size"}


def _length_pointer(ctx: LintContext) -> str:
    return ctx.model.pointer("full_attention", "max_position_embeddings")


def _refused(ctx: LintContext, engine: str) -> bool:
    """Whether ``engine`` refuses the requested length at startup (derived maximum exceeded, no override)."""
    length, requested = ctx.lengths[engine], ctx.requested
    if requested is None or length.derived is None or requested <= length.derived:
        return False
    return not (length.override_env and ctx.intent.env_flag(length.override_env))


@rule(
    "RS301",
    "engine-refuses-length",
    family="length",
    severity=ERROR,
    summary="The requested length exceeds the engine's derived maximum and no override flag is set.",
    reference="https://github.com/sgl-project/sglang/issues/2943",
    catalogue="LEN-001",
)
def engine_refuses_length(ctx: LintContext) -> Iterator[Hit]:
    for engine in ctx.targeted("vllm", "sglang"):
        if not _refused(ctx, engine):
            continue
        length, requested = ctx.lengths[engine], ctx.requested or 0
        if length.window_cap is not None:
            yield _refused_at_window(ctx, engine, length.window_cap, requested)
            continue
        short_cache = length.cache_rows is not None and length.cache_rows < requested
        override = (
            f"{length.override_env}=1 would start it but positions past its {fmt(length.cache_rows)} cache rows "
            "break (vllm#17924)"
            if short_cache
            else f"{length.override_env}=1 lifts the check (its rope cache covers the length)"
        )
        hit = replace(
            ctx.hit(
                _derived_pointer(ctx, length.derived_from),
                f"{engine} derives a maximum of {fmt(length.derived)} ({length.derived_from}) and refuses "
                f"{ENGINE_LENGTH_FLAG[engine]} {fmt(requested)} at startup",
                f"Lower the requested length to {fmt(length.derived)}, or make the config state the extended "
                f"length; {override}.",
                engine=engine,
            ),
            reference=ENGINE_LENGTH_REFERENCE[engine],
        )
        yield replace(hit, artifact="tokenizer_config") if hit.pointer == "/model_max_length" else hit


def _refused_at_window(ctx: LintContext, engine: str, cap: WindowCap, requested: int) -> Hit:
    hit = ctx.hit(
        pointers.join(ctx.model.text_pointer, SLIDING_WINDOW),
        f"{engine} caps its maximum at sliding_window {fmt(cap.window)} ({cap.reason}) and refuses "
        f"{ENGINE_LENGTH_FLAG[engine]} {fmt(requested)} at startup{_scaling_refused(ctx)}",
        f"{cap.fix} VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 would start it, with every layer attending past the window.",
        engine=engine,
    )
    return replace(hit, reference=WINDOW_CAP_REFERENCE)


def _scaling_refused(ctx: LintContext) -> str:
    """What vLLM versions such as @0004438 do instead of the cap when the config has a legacy ``rope_scaling``
    other than longrope/llama3: ``_get_and_verify_max_len`` raises NotImplementedError (vllm#7593)."""
    entry, main = ctx.model.main_entry, ctx.model.main
    legacy = entry is not None and entry.data is not None and "/rope_scaling" in entry.pointer
    if not legacy or main is None or main.rope_type in ("longrope", "llama3"):
        return ""
    return (
        f"; vLLM versions that refuse rope scaling with the window disabled (e.g. @0004438, vllm#7593) stop at "
        f"startup with NotImplementedError for this {main.rope_type} rope_scaling instead"
    )


WINDOW_CAP_REFERENCE = "https://github.com/vllm-project/vllm/issues/6253"
"""vLLM's startup refusal at "the derived max_model_len (sliding_window=4096 ...)" with the window disabled."""

ENGINE_LENGTH_REFERENCE = {
    "vllm": "https://github.com/vllm-project/vllm/issues/17924",
    "sglang": "https://github.com/sgl-project/sglang/issues/2943",
}
"""Each engine's own report of its startup length check and the override variable."""


def _derived_pointer(ctx: LintContext, derived_from: str) -> str:
    """The key that set an engine's derived length (``derived_from`` starts with it), as a JSON pointer."""
    key = derived_from.split(" ")[0]
    if key == "tokenizer_config":
        return "/model_max_length"
    if key in ctx.model.text:
        return pointers.join(ctx.model.text_pointer, key)
    if key == "original_max_position_embeddings":
        return ctx.model.pointer("full_attention", key)
    return _length_pointer(ctx)


@rule(
    "RS302",
    "length-exceeds-rope-cache",
    family="length",
    severity=ERROR,
    summary="The engine starts with a served length beyond its precomputed cos/sin rows (override flags included).",
    reference="https://github.com/vllm-project/vllm/issues/17924",
    catalogue="LEN-002",
)
def length_exceeds_rope_cache(ctx: LintContext) -> Iterator[Hit]:
    for engine in ctx.targeted("vllm", "sglang"):
        rows, served = ctx.lengths[engine].cache_rows, ctx.served(engine)
        if rows is None or served is None or served <= rows or _refused(ctx, engine):
            continue  # a refused length is RS301's
        yield ctx.hit(
            _length_pointer(ctx),
            f"{engine} builds a cos/sin cache of {fmt(rows)} rows but serves {fmt(served)} positions: positions "
            f">= {fmt(rows)} index past the cache (out-of-bounds or NaN)",
            f"Serve at most {fmt(rows)} tokens, or raise max_position_embeddings / the rope factor so the cache "
            "covers the length.",
            engine=engine,
        )


@rule(
    "RS303",
    "yarn-length-mismatch",
    family="length",
    severity=WARNING,
    summary="YaRN with `max_position_embeddings` different from `original x factor`: engines derive different lengths.",
    reference="https://github.com/huggingface/transformers/issues/38224",
    catalogue="LEN-003",
)
def yarn_length_mismatch(ctx: LintContext) -> Iterator[Hit]:
    for params in ctx.model.layers.values():
        if not is_yarn(params.rope_type):
            continue
        original, limit = params.original_max_position_embeddings, params.max_position_embeddings
        factor = finite_positive(params.factor)
        if factor is None or original is None or finite_positive(original) is None or not limit:  # -1e308: none
            continue
        extended = scaled_length(original, factor)
        if limit == extended:
            continue
        per_engine = ", ".join(
            f"{engine} {fmt(length.derived)}" for engine, length in ctx.lengths.items() if length.derived
        )
        transformers = ctx.intent.target("transformers")
        recompute = (
            f"; some transformers 4.x versions recompute factor = {limit / original:g} from the two lengths (#38224)"
            if transformers is not None and transformers.spec.may_predate(TRANSFORMERS_5)
            else ""
        )
        yield ctx.hit(
            _length_pointer(ctx),
            f"max_position_embeddings {fmt(limit)} != original {fmt(original)} x factor {factor:g} = "
            f"{fmt(extended)}; derived lengths: {per_engine}{recompute}",
            f"Set max_position_embeddings to {fmt(extended)} (the length the yarn factor targets).",
        )


def _scales_length(params: RopeParams) -> bool:
    """The type multiplies ``max_position_embeddings`` by its factor (linear, dynamic)."""
    definition = definition_of(params.rope_type)
    return definition is not None and definition.extended_length == "max_x_factor"


@rule(
    "RS304",
    "factor-on-extended-length",
    family="length",
    severity=WARNING,
    summary="A linear/dynamic factor multiplies a max_position_embeddings that already includes the extension.",
    reference="https://github.com/vllm-project/vllm/pull/33958",
    catalogue="LEN-004",
)
def factor_on_extended_length(ctx: LintContext) -> Iterator[Hit]:
    params, trained = ctx.model.main, ctx.original.main
    if params is None or not _scales_length(params) or effective_factor(params) <= 1:
        return
    limit, factor = params.max_position_embeddings or 0, effective_factor(params)
    if ctx.model.is_gemma3:
        yield from _gemma3_cache(ctx, params, limit, factor)
        return
    original = params.original_max_position_embeddings or (trained and trained.original_max_position_embeddings)
    if not (original and limit > original):
        return
    caches = [f"{engine} {fmt(cache_rows_for(params, engine))} rows" for engine in ctx.targeted("vllm", "sglang")]
    yield ctx.hit(
        ctx.model.pointer("full_attention", "factor"),
        f"max_position_embeddings {fmt(limit)} is already the extended length, and factor {factor:g} scales it "
        f"again to {fmt(limit * factor)}" + (f"; rope caches: {', '.join(caches)}" if caches else ""),
        "Keep the trained scaling of the checkpoint; to extend further, base the factor on the original length.",
    )


def _gemma3_cache(ctx: LintContext, params: RopeParams, limit: int, factor: float) -> Iterator[Hit]:
    """Gemma-3's factor is its trained scaling and every engine keeps its length; only vLLM's cache for the
    full-attention layers grows by the factor (vllm#33958): an engine-specific finding."""
    for engine in ctx.targeted("vllm"):
        rows = cache_rows_for(params, engine)
        if rows is None or rows <= limit:
            continue
        yield ctx.hit(
            ctx.model.pointer("full_attention", "factor"),
            f"vllm sizes the full-attention cos/sin cache by the trained factor {factor:g}: {fmt(rows)} rows for "
            f"a {fmt(limit)}-token model (memory only; positions stay right)",
            "Nothing to change in the config: the factor is the checkpoint's; use a vLLM with PR #33958.",
            engine=engine,
        )


@rule(
    "RS305",
    "tokenizer-limit-lower",
    family="length",
    severity=WARNING,
    summary="`tokenizer_config.model_max_length` is below the model's length: vLLM and TGI take the minimum.",
    reference=f"{NOTE} §2.1 step 3, §2.3",
    catalogue="LEN-005",
)
def tokenizer_limit_lower(ctx: LintContext) -> Iterator[Hit]:
    limit = tokenizer_limit(ctx.tokenizer_config)
    capacity = None if limit is None else position_capacity(ctx.model)
    if limit is None or capacity is None or limit >= capacity:
        return
    yield Hit(
        "/model_max_length",
        f"tokenizer model_max_length {fmt(limit)} < model length {fmt(capacity)}: vLLM and TGI silently cap at "
        f"{fmt(limit)}",
        f"Raise tokenizer_config.json model_max_length to {fmt(capacity)} (or remove it).",
        artifact="tokenizer_config",
    )


@rule(
    "RS306",
    "several-length-keys",
    family="length",
    severity=INFO,
    summary="Several length keys with different values: each engine picks a different one.",
    reference="https://github.com/vllm-project/vllm/issues/3676",
    catalogue="LEN-006",
)
def several_length_keys(ctx: LintContext) -> Iterator[Hit]:
    if len(_IS_LENGTH_KEY.intersection(ctx.model.text)) < 2:
        return  # one length key at most (most configs): found in C, without a pass over the whole section
    present = {k: v for k, v in ctx.model.text.items() if k in _IS_LENGTH_KEY and isinstance(v, int)}
    if len(set(present.values())) < 2:
        return
    picks = "; ".join(f"{engine}: {length.derived_from}" for engine, length in ctx.lengths.items())
    listed = ", ".join(f"{k}={v:,}" for k, v in present.items())
    yield ctx.hit(
        pointers.join(ctx.model.text_pointer, next(iter(present))),
        f"length keys {listed}; engines pick: {picks}",
        "Keep one length key (max_position_embeddings) unless an engine needs another on purpose.",
    )


@rule(
    "RS307",
    "no-length-key",
    family="length",
    severity=WARNING,
    summary="No length key at all: vLLM and SGLang assume 2048.",
    reference=f"{NOTE} §2.1 step 4, §2.2",
    catalogue="LEN-007",
)
def no_length_key(ctx: LintContext) -> Iterator[Hit]:
    if ctx.model.error is None and first_length_key(ctx.model, ALL_LENGTH_KEYS) is None:
        yield ctx.hit(
            pointers.join(ctx.model.text_pointer, "max_position_embeddings"),
            "no max_position_embeddings (or other length key): vLLM and SGLang assume 2048 tokens",
            "Add max_position_embeddings with the trained context length.",
        )


@rule(
    "RS308",
    "draft-shorter-than-target",
    family="length",
    severity=ERROR,
    summary="The speculative draft model's rope cache or length is shorter than the served length (vLLM).",
    reference="https://github.com/vllm-project/vllm/issues/57941",
    catalogue="LEN-008",
)
def draft_shorter_than_target(ctx: LintContext) -> Iterator[Hit]:
    served = ctx.served("vllm")
    if ctx.draft is None or served is None or "vllm" not in ctx.target_names:
        return
    draft = derive_length(ctx.draft, "vllm")
    rows = draft.cache_rows
    limit = min(n for n in (draft.derived, rows) if n is not None) if (draft.derived or rows) else None
    if limit is not None and limit < served:
        yield Hit(
            ctx.draft.pointer("full_attention", "max_position_embeddings"),
            f"the draft model covers {fmt(limit)} positions (derived {fmt(draft.derived)}, cache {fmt(rows)} rows) "
            f"but the target serves {fmt(served)}: vLLM's drafter indexes past its cos/sin cache (illegal memory "
            "access); SGLang rewrites the draft's max_position_embeddings",
            f"Use a draft with max_position_embeddings >= {fmt(served)}, or cap the served length at {fmt(limit)}.",
            engine="vllm",
            artifact="draft_config",
        )


@rule(
    "RS309",
    "length-beyond-rope-capacity",
    family="length",
    severity=ERROR,
    summary="The requested length exceeds what the rope config is trained or scaled for, on any engine.",
    reference=f"{NOTE} §4 items 1-4",
)
def length_beyond_rope_capacity(ctx: LintContext) -> Iterator[Hit]:
    requested = ctx.requested
    capacity = None if requested is None else position_capacity(ctx.model)
    if capacity is None or requested is None or requested <= capacity:
        return
    main = ctx.model.main
    definition = None if main is None else definition_of(main.rope_type)
    unscaled = main is None or (definition is not None and not definition.scales)
    scaling = "no rope scaling" if unscaled or main is None else f"{main.rope_type} scaling"
    extend = "add the model's documented long-context scaling" + (
        f" (e.g. yarn, factor {requested / capacity:.3g})" if capacity else ""  # 0: a factor of 5e-324 scaled it
    )
    yield ctx.hit(
        _length_pointer(ctx),
        f"requested {fmt(requested)} positions but the config ({scaling}) covers {fmt(capacity)}: positions "
        "beyond it were never trained or scaled for",
        f"Request at most {fmt(capacity)}" + (f", or {extend}." if unscaled else "."),
    )


@rule(
    "RS310",
    "llama-cpp-slot-capped",
    family="length",
    severity=WARNING,
    summary="llama.cpp caps the server slot at n_ctx_train (max_position_embeddings) even with rope scaling.",
    reference="https://github.com/ggml-org/llama.cpp/issues/17459",
    catalogue="LEN-010",
)
def llama_cpp_slot_capped(ctx: LintContext) -> Iterator[Hit]:
    length = ctx.lengths.get("llama.cpp")
    if length is None or length.derived is None or ctx.requested is None or ctx.requested <= length.derived:
        return
    yield ctx.hit(
        _length_pointer(ctx),
        f"n_ctx {fmt(ctx.requested)} > n_ctx_train {fmt(length.derived)}: llama-server caps the slot at "
        f"{fmt(length.derived)} ('possible training context overflow')",
        "Write the extended length into max_position_embeddings before converting to GGUF (or override "
        "context_length in the GGUF metadata).",
        engine="llama.cpp",
    )


@rule(
    "RS311",
    "vllm-longrope-default-length",
    family="length",
    severity=WARNING,
    summary="LongRoPE on vLLM with no requested length serves only original_max_position_embeddings.",
    reference=f"{NOTE} §2.1 step 7, §2.5",
)
def vllm_longrope_default_length(ctx: LintContext) -> Iterator[Hit]:
    length = ctx.lengths.get("vllm")
    main = ctx.model.main
    if length is None or main is None or main.rope_type != "longrope" or ctx.requested is not None:
        return
    if length.default is not None and length.derived is not None and length.default < length.derived:
        yield ctx.hit(
            pointers.join(ctx.model.text_pointer, "original_max_position_embeddings"),
            f"vLLM defaults max_model_len to {fmt(length.default)} for longrope (derived maximum "
            f"{fmt(length.derived)})",
            f"Pass --max-model-len {fmt(length.derived)} to serve the long context.",
            engine="vllm",
        )


@rule(
    "RS312",
    "length-scaled-by-factor",
    family="length",
    severity=WARNING,
    summary="A linear/dynamic factor without an original length: vLLM/SGLang serve max_position_embeddings x factor.",
    reference=f"{NOTE} §2.1 step 5, §2.2",
)
def length_scaled_by_factor(ctx: LintContext) -> Iterator[Hit]:
    main = ctx.model.main
    if main is None or not _scales_length(main) or ctx.model.is_gemma3:
        return
    limit, factor = main.max_position_embeddings, effective_factor(main)
    if not limit or factor <= 1 or _original_length_given(ctx):
        return
    for engine in ctx.targeted("vllm", "sglang"):
        length, served = ctx.lengths[engine], ctx.served(engine)
        if length.derived is None or length.derived <= limit or served is None or served <= limit:
            continue
        yield ctx.hit(
            ctx.model.pointer("full_attention", "factor"),
            f"{engine} derives {fmt(length.derived)} = max_position_embeddings {fmt(limit)} x factor {factor:g} "
            f"and serves {fmt(served)} positions, while transformers, TGI and llama.cpp take {fmt(limit)} as the "
            f"model's length; if {fmt(limit)} already includes the extension, positions past it were never trained",
            "State the pre-extension length as original_max_position_embeddings in the rope dict (then every "
            f"engine agrees), or serve at most {fmt(limit)} tokens on {engine}.",
            engine=engine,
        )


def _original_length_given(ctx: LintContext) -> bool:
    entry = ctx.model.main_entry
    in_dict = entry is not None and entry.has("original_max_position_embeddings")
    return in_dict or ctx.model.text.get("original_max_position_embeddings") is not None


@rule(
    "RS313",
    "sliding-window-unused",
    family="length",
    severity=INFO,
    summary="`sliding_window` is declared but no layer uses it (`use_sliding_window` false, or Qwen2's "
    "`max_window_layers` covering every layer).",
    reference=VLLM_WINDOW_KEY_SOURCE,
)
def sliding_window_unused(ctx: LintContext) -> Iterator[Hit]:
    window, text = _written_window(ctx), ctx.model.text
    if window is None:
        return
    pointer = pointers.join(ctx.model.text_pointer, SLIDING_WINDOW)
    if text.get("use_sliding_window") is False:
        yield ctx.hit(
            pointer,
            f"sliding_window {fmt(window)} with use_sliding_window false: transformers' config class sets the window "
            "to None, which is what vLLM reads (older vLLM checked use_sliding_window itself), so every layer "
            "attends over the full context and --disable-sliding-window caps nothing",
            "Nothing to change for transformers or vLLM; set sliding_window to null so that tools reading it "
            "without use_sliding_window agree.",
        )
        return
    layering = _no_windowed_layer(text)
    if text.get("use_sliding_window") is True and layering is not None:
        first_windowed, layers = layering
        yield ctx.hit(
            pointers.join(ctx.model.text_pointer, "max_window_layers"),
            f"use_sliding_window is true but max_window_layers {first_windowed} >= num_hidden_layers {layers}: "
            "transformers windows only the layers from index max_window_layers on, so none uses the "
            f"{fmt(window)}-token window (transformers#35896)",
            "To window layers, set max_window_layers to the number of leading full-attention layers; otherwise "
            "set use_sliding_window to false.",
        )
        yield from _vllm_partial_window(ctx, first_windowed, layers)


VLLM_QWEN2_PARTIAL_WINDOW_REFUSED = Version.parse("0.8.5")
"""vLLM 0.7.3 and 0.8.4 refuse a Qwen2 window with max_window_layers at model init (vllm#15705, vllm#17306);
PR #17772 lifts it (its release is not recorded here, so only versions up to 0.8.4 are flagged)."""


def _vllm_partial_window(ctx: LintContext, first_windowed: int, layers: int) -> Iterator[Hit]:
    if ctx.model.model_type not in ("qwen2", "qwen2_moe"):
        return
    for target in ctx.targets("vllm"):
        if target.spec.may_predate(VLLM_QWEN2_PARTIAL_WINDOW_REFUSED):
            hit = ctx.hit(
                pointers.join(ctx.model.text_pointer, "use_sliding_window"),
                f"vLLM up to 0.8.4 raises ValueError at model init: 'Sliding window for some but all layers is not "
                f"supported ... max_window_layers = {first_windowed} is less than num_hidden_layers = {layers}'",
                "Set use_sliding_window to false (transformers windows no layer here anyway), or use a vLLM with "
                "PR #17772.",
                engine="vllm",
            )
            yield replace(hit, severity=ERROR, reference="https://github.com/vllm-project/vllm/issues/17306")


def _no_windowed_layer(text: Mapping[str, Any]) -> tuple[int, int] | None:
    """``(max_window_layers, num_hidden_layers)`` when Qwen2's layer_types give no layer the window: layer i
    uses it iff i >= max_window_layers, so none does when that covers every layer."""
    first, layers = text.get("max_window_layers"), text.get("num_hidden_layers")
    if isinstance(first, bool) or isinstance(layers, bool) or not isinstance(first, int) or not isinstance(layers, int):
        return None
    return (first, layers) if first >= layers else None


def _written_window(ctx: LintContext) -> int | None:
    """The config's ``sliding_window`` when it is one valid window (a per-layer list or an invalid value: None)."""
    value = ctx.model.text.get(SLIDING_WINDOW)
    if isinstance(value, list) or value is None or ctx.model.window_problems:
        return None
    return int(value)


@rule(
    "RS314",
    "engine-caps-length-at-window",
    family="length",
    severity=WARNING,
    summary="The engine disables the sliding window and caps the served length at it (vLLM "
    "--disable-sliding-window; Gemma-2 on vLLM 0.5.1-0.6.4).",
    reference="https://github.com/vllm-project/vllm/issues/6220",
)
def engine_caps_length_at_window(ctx: LintContext) -> Iterator[Hit]:
    for engine in ctx.targeted("vllm"):
        length = ctx.lengths[engine]
        cap, served = length.window_cap, ctx.served(engine)
        if cap is None or served is None or _refused(ctx, engine):
            continue  # a refused length is RS301's
        full = derive_length(ctx.model, engine, ctx.tokenizer_config).derived
        if ctx.requested is None and full is not None and full > cap.window:
            message = (
                f"{engine} serves at most {fmt(cap.window)} tokens: {cap.reason}, which caps max_model_len at "
                f"sliding_window {fmt(cap.window)} below the model's {fmt(full)}{_scaling_refused(ctx)}"
            )
        elif served > cap.window:
            message = (
                f"{engine} serves {fmt(served)} tokens with the sliding window disabled ({cap.reason}): the windowed "
                f"layers attend past the {fmt(cap.window)} tokens they were trained to see{_scaling_refused(ctx)}"
            )
        else:
            continue
        yield ctx.hit(pointers.join(ctx.model.text_pointer, SLIDING_WINDOW), message, cap.fix, engine=engine)


@rule(
    "RS315",
    "sliding-window-no-effect",
    family="length",
    severity=INFO,
    summary="`sliding_window` is at least `max_position_embeddings`: the window never drops a token.",
    reference=VLLM_MAX_LEN_SOURCE,
)
def sliding_window_no_effect(ctx: LintContext) -> Iterator[Hit]:
    window, limit = _written_window(ctx), ctx.model.text_value("max_position_embeddings")
    if window is None or ctx.model.text.get("use_sliding_window") is False or not isinstance(limit, int):
        return
    if window >= limit:
        yield ctx.hit(
            pointers.join(ctx.model.text_pointer, SLIDING_WINDOW),
            f"sliding_window {fmt(window)} >= max_position_embeddings {fmt(limit)}: every layer attends over the "
            "whole context, so the window has no effect (and vLLM's window cap changes nothing)",
            "Nothing to change; null would say the same.",
        )
