"""RS4xx: long-context scaling that engines implement differently."""

from __future__ import annotations

from collections.abc import Iterator

from ropeserve.config.rope_types.yarn import BETA_FAST as YARN_BETA_FAST
from ropeserve.config.rope_types.yarn import BETA_SLOW as YARN_BETA_SLOW
from ropeserve.lint import pointers
from ropeserve.lint.context import LintContext
from ropeserve.lint.findings import NOTE, SPEC, Hit, Severity, rule
from ropeserve.lint.rules.common import canonical_type, fmt, is_yarn

WARNING, INFO = Severity.WARNING, Severity.INFO
TRAINED_SCALING = frozenset({"llama3", "yarn", "longrope"})
LLAMA_CPP_LLAMA3_ORIGINAL = 8192
LONGROPE_SWITCH = {
    "transformers": "switches the whole sequence to long factors once it exceeds the original length "
    "(cached keys keep their short-factor rotation)",
    "vllm": "chooses once per engine: max_model_len > original puts every request, short ones too, on long factors",
    "sglang": "picks long factors for sequences beyond the original length",
    "tgi": "uses short factors for positions below the original length and long ones beyond, per position",
    "llama.cpp": "chooses the factors from the configured context size n_ctx, not the prompt length",
}
DYNAMIC_SEMANTICS = {
    "transformers": "recomputes the base per forward from the current length (hysteresis above max_position)",
    "vllm": "computes the base once for max_position x factor and applies it to every length",
    "sglang": "reads factor like vLLM (even when alpha is given)",
    "tgi": "recomputes the base for lengths above max_position_embeddings",
    "llama.cpp": "has no dynamic NTK: the conversion drops it",
}


@rule(
    "RS401",
    "longrope-switching",
    family="extension",
    severity=INFO,
    summary="LongRoPE beyond the original length: engines switch short/long factors differently.",
    reference="https://github.com/ggml-org/llama.cpp/issues/8995",
    catalogue="EXT-001",
)
def longrope_switching(ctx: LintContext) -> Iterator[Hit]:
    main = ctx.model.main
    original = main.original_max_position_embeddings if main is not None else None
    if main is None or main.rope_type != "longrope" or not original or (ctx.longest or 0) <= original:
        return
    behaviour = "; ".join(f"{engine} {LONGROPE_SWITCH[engine]}" for engine in ctx.target_names)
    yield ctx.hit(
        ctx.model.pointer("full_attention", "long_factor"),
        f"serving {fmt(ctx.longest)} > original {fmt(original)} tokens: {behaviour}",
        "Expect quality differences on short prompts between engines; compare outputs per engine.",
    )


@rule(
    "RS402",
    "dynamic-ntk-semantics",
    family="extension",
    severity=INFO,
    summary="Dynamic NTK means a different base per engine.",
    reference="https://github.com/huggingface/text-generation-inference/issues/782",
    catalogue="EXT-002",
)
def dynamic_ntk_semantics(ctx: LintContext) -> Iterator[Hit]:
    for layer_type, params in ctx.model.layers.items():
        if params.rope_type == "dynamic":
            behaviour = "; ".join(f"{engine} {DYNAMIC_SEMANTICS[engine]}" for engine in ctx.target_names)
            yield ctx.hit(
                ctx.model.pointer(layer_type, "rope_type"),
                f"dynamic NTK: {behaviour}",
                "Prefer a static scheme (yarn) if outputs must agree across engines.",
            )


@rule(
    "RS403",
    "yarn-truncate-ignored",
    family="extension",
    severity=WARNING,
    summary="YaRN `truncate: false` is ignored by engines that always round the correction range.",
    reference=f"{SPEC} §2.4",
    catalogue="EXT-003",
)
def yarn_truncate_ignored(ctx: LintContext) -> Iterator[Hit]:
    for entry in ctx.model.written_entries:
        if not is_yarn(canonical_type(entry)) or entry.get("truncate", True) is not False:
            continue
        for engine in ctx.targeted("tgi", "llama.cpp"):
            yield ctx.hit(
                entry.key_pointer("truncate"),
                f"truncate=false keeps the fractional YaRN correction range in transformers, vLLM and SGLang; "
                f"{engine} has no such switch and rounds it (floor/ceil), shifting the ramp",
                f"Validate {engine} outputs against transformers, or drop {engine} for this checkpoint.",
                engine=engine,
            )


@rule(
    "RS404",
    "yarn-mscale-generic-path",
    family="extension",
    severity=WARNING,
    summary="YaRN with `mscale`/`mscale_all_dim` outside DeepSeek models: generic engine paths ignore them.",
    reference="https://github.com/vllm-project/vllm/pull/56446",
    catalogue="EXT-004",
)
def yarn_mscale_generic_path(ctx: LintContext) -> Iterator[Hit]:
    if (ctx.model.model_type or "").startswith("deepseek"):
        return
    for layer_type, params in ctx.model.layers.items():
        if params.rope_type == "yarn" and (params.mscale or params.mscale_all_dim):
            key = "mscale_all_dim" if params.mscale_all_dim else "mscale"
            yield ctx.hit(
                ctx.model.pointer(layer_type, key),
                f"yarn with {key}: only DeepSeek model code rewrites it to deepseek_yarn (vLLM, SGLang); the generic "
                "yarn path ignored mscale/mscale_all_dim before vLLM PR #56446, and DeepSeek attention also "
                "scales the softmax by mscale^2",
                "Check each engine's attention scale against transformers, or use a DeepSeek model_type.",
            )


TRAINED_KEYS = (
    "factor",
    "original_max_position_embeddings",
    "low_freq_factor",
    "high_freq_factor",
    "beta_fast",
    "beta_slow",
    "mscale",
    "mscale_all_dim",
    "short_factor",
    "long_factor",
)
"""Parameters a checkpoint's long-context scaling was trained with: an override must not change them silently."""


@rule(
    "RS405",
    "override-replaces-trained-scaling",
    family="extension",
    severity=WARNING,
    summary="A rope override replaces the checkpoint's trained long-context scaling, or keeps its type but changes "
    "a trained parameter.",
    reference="https://github.com/vllm-project/vllm/issues/10537",
    catalogue="EXT-005",
)
def override_replaces_trained_scaling(ctx: LintContext) -> Iterator[Hit]:
    trained, served = ctx.original.main, ctx.model.main
    if ctx.intent.rope_override is None or trained is None or served is None:
        return
    if trained.rope_type not in TRAINED_SCALING:
        return
    if served.rope_type != trained.rope_type:
        yield Hit(
            "/rope_override",
            f"the override turns the trained {trained.rope_type} scaling into {served.rope_type}; the checkpoint "
            f"was trained for {trained.rope_type} up to {fmt(trained.max_position_embeddings)} tokens",
            f"Drop the override and serve up to {fmt(trained.max_position_embeddings)} tokens, or extend with the "
            f"same type ({trained.rope_type}) based on the original length.",
            artifact="intent",
        )
        return
    for key in TRAINED_KEYS:
        was, now = getattr(trained, key), getattr(served, key)
        if was is not None and now != was:
            yield Hit(
                pointers.join("/rope_override", key),
                f"the override keeps {trained.rope_type} but changes the trained {key} from {_brief(was)} to "
                f"{_brief(now)}: the checkpoint's weights were fitted to {_brief(was)}",
                f"Keep {key} = {_brief(was)} (drop it from the override) unless the checkpoint was re-trained with "
                "the new value.",
                artifact="intent",
            )


def _brief(value: object) -> str:
    if isinstance(value, tuple | list):
        return f"[{len(value)} values starting {value[0]:g}]" if value else "[]"
    return f"{value:g}" if isinstance(value, float) else str(value)


@rule(
    "RS406",
    "tgi-yarn-fixed-betas",
    family="extension",
    severity=WARNING,
    summary="TGI fixes YaRN beta_fast/beta_slow at 32/1 and ignores the config's values.",
    reference=f"{NOTE} §1.7, §6 footnote 5",
)
def tgi_yarn_fixed_betas(ctx: LintContext) -> Iterator[Hit]:
    if "tgi" not in ctx.target_names:
        return
    for layer_type, params in ctx.model.layers.items():
        if not is_yarn(params.rope_type):
            continue
        for key, fixed in (("beta_fast", YARN_BETA_FAST), ("beta_slow", YARN_BETA_SLOW)):
            value = getattr(params, key)
            if value not in (None, 0, fixed):
                yield ctx.hit(
                    ctx.model.pointer(layer_type, key),
                    f"{key} = {value:g} but TGI always uses {fixed:g}: its YaRN ramp differs from other engines",
                    "Serve this checkpoint with an engine that reads the betas, or accept TGI's ramp after testing.",
                    engine="tgi",
                )


@rule(
    "RS407",
    "llama-cpp-llama3-original",
    family="extension",
    severity=WARNING,
    summary="llama.cpp's converter reads llama3 `original_max_position_embeddings` from the top level (default 8192).",
    reference=f"{NOTE} §3, §6 footnote 9",
)
def llama_cpp_llama3_original(ctx: LintContext) -> Iterator[Hit]:
    if "llama.cpp" not in ctx.target_names:
        return
    for layer_type, params in ctx.model.layers.items():
        original = params.original_max_position_embeddings
        top_level = ctx.model.text.get("original_max_position_embeddings")
        if params.rope_type == "llama3" and original != LLAMA_CPP_LLAMA3_ORIGINAL and top_level != original:
            yield ctx.hit(
                ctx.model.pointer(layer_type, "original_max_position_embeddings"),
                f"llama3 original length {fmt(original)}, but convert_hf_to_gguf reads the top-level key with "
                f"default {LLAMA_CPP_LLAMA3_ORIGINAL}: the rope_freqs tensor would be built for the wrong length",
                f"Also write original_max_position_embeddings: {original} at the top level before converting.",
                engine="llama.cpp",
            )


@rule(
    "RS408",
    "tgi-linear-static",
    family="extension",
    severity=WARNING,
    summary="TGI's static rope path leaves the linear scaling factor unset (positions not divided).",
    reference="https://github.com/IBM/text-generation-inference/pull/61",
)
def tgi_linear_static(ctx: LintContext) -> Iterator[Hit]:
    if "tgi" not in ctx.target_names:
        return
    for layer_type, params in ctx.model.layers.items():
        if params.rope_type == "linear" and (params.factor or 1) != 1:
            yield ctx.hit(
                ctx.model.pointer(layer_type, "factor"),
                f"linear factor {params.factor:g}: TGI's PositionRotaryEmbedding.static linear branch sets "
                "scaling_factor=None, so positions are not divided (from source; the load() path applies it)",
                "Test TGI against transformers on a long prompt before serving, or use another engine.",
                engine="tgi",
            )
