"""RS6xx: which channels rotate together (NeoX halves vs GPT-J neighbours) and over which width."""

from __future__ import annotations

from collections.abc import Iterator

from ropeserve.lint import pointers
from ropeserve.lint.context import LintContext
from ropeserve.lint.findings import NOTE, SPEC, Hit, Severity, rule

ERROR, WARNING = Severity.ERROR, Severity.WARNING
LLAMA_DEFAULT_ROPE_TYPES = frozenset({"llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe"})
"""Model types whose transformers default RoPE uses the full head_dim, ignoring partial_rotary_factor."""
PAIRING_NAMES = {"neox": "NeoX (i, i + d/2)", "gptj": "GPT-J (2i, 2i + 1)"}


@rule(
    "RS601",
    "pairing-mismatch",
    family="pairing",
    severity=ERROR,
    summary="The deployment's rotary pairing (kernel, converted weights) differs from the model family's.",
    reference="https://github.com/ggml-org/llama.cpp/issues/3018",
    catalogue="LAY-001",
)
def pairing_mismatch(ctx: LintContext) -> Iterator[Hit]:
    expected = ctx.intent.pairing
    if expected is None or expected == ctx.pairing or not ctx.model.layers:
        return
    yield ctx.intent_hit(
        "pairing",
        f"{ctx.model.model_type or 'this model'} rotates {PAIRING_NAMES[ctx.pairing]} pairs but the deployment "
        f"applies {PAIRING_NAMES[expected]}: every rotated channel pair is wrong (gibberish output)",
        f"Use {ctx.pairing} pairing, or permute the Q/K weight rows when converting (as llama.cpp's converter "
        "does for NORM rope).",
    )


@rule(
    "RS602",
    "partial-rotary-ignored",
    family="pairing",
    severity=WARNING,
    summary="transformers' Llama-family default RoPE ignores `partial_rotary_factor`; vLLM/SGLang honour it.",
    reference=f"{SPEC} §2.1, §7 item 4",
    catalogue="LAY-002",
)
def partial_rotary_ignored(ctx: LintContext) -> Iterator[Hit]:
    if ctx.model.model_type not in LLAMA_DEFAULT_ROPE_TYPES or "transformers" not in ctx.target_names:
        return
    for layer_type, params in ctx.model.layers.items():
        if params.rope_type == "default" and params.partial_rotary_factor < 1:
            yield ctx.hit(
                ctx.model.pointer(layer_type, "partial_rotary_factor"),
                f"partial_rotary_factor {params.partial_rotary_factor:g} on a {ctx.model.model_type} default rope: "
                f"transformers rotates all {params.head_dim} channels, vLLM/SGLang only {params.rotary_dim} "
                "(pairs within rotary_dim, frequencies theta^(-2i/rotary_dim))",
                "Confirm which width the checkpoint was trained with and serve it on engines that agree.",
                engine="transformers",
            )


@rule(
    "RS603",
    "longrope-gptj-on-vllm",
    family="pairing",
    severity=ERROR,
    summary="LongRoPE with GPT-J pairing: vLLM's Phi-3 LongRoPE raises for is_neox_style=False.",
    reference=f"{NOTE} §1.1 notes",
)
def longrope_gptj_on_vllm(ctx: LintContext) -> Iterator[Hit]:
    pairing = ctx.intent.pairing or ctx.pairing
    main = ctx.model.main
    if main is None or main.rope_type != "longrope" or pairing != "gptj" or "vllm" not in ctx.target_names:
        return
    yield ctx.hit(
        pointers.join(ctx.model.text_pointer, "model_type"),
        "longrope with GPT-J pairing: vLLM's Phi3LongRoPEScaledRotaryEmbedding supports NeoX only and raises",
        "Serve with NeoX pairing (permute Q/K weights) or use another engine.",
        engine="vllm",
    )
