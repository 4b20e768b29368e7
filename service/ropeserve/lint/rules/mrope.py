"""RS5xx: multimodal rotary sections (M-RoPE), their layout and the positions they reach."""

from __future__ import annotations

import math
from collections.abc import Iterator

from ropeserve.config.jsonsafe import INT64_MAX
from ropeserve.config.rope_types import finite_positive
from ropeserve.lint import pointers
from ropeserve.lint.context import LintContext
from ropeserve.lint.findings import NOTE, SPEC, Hit, Severity, rule
from ropeserve.lint.rules.common import fmt, written_type
from ropeserve.lint.versions import Version

ERROR, WARNING, INFO = Severity.ERROR, Severity.WARNING, Severity.INFO
TRANSFORMERS_FLOAT_VIDEO_INTERVAL = Version.parse("5.0")
"""transformers 4.x cast ``second_per_grid_t`` to an integer before scaling (spec §7 item 10)."""


def interleaved_split(section: tuple[int, ...], half: int) -> tuple[int, int, int]:
    """The (T, H, W) lane counts the interleaved layout realises: H at i%3==1, W at i%3==2 (i < 3h, 3w)."""
    height = len(range(1, min(3 * section[1], half), 3))
    width = len(range(2, min(3 * section[2], half), 3))
    return half - height - width, height, width


@rule(
    "RS501",
    "mrope-section-sum",
    family="mrope",
    severity=ERROR,
    summary="`mrope_section` must sum to rotary_dim/2 (after partial rotary), not head_dim/2.",
    reference="https://github.com/AI-Hypercomputer/maxtext/issues/4616",
    catalogue="MRP-001",
)
def mrope_section_sum(ctx: LintContext) -> Iterator[Hit]:
    for layer_type, params in ctx.model.mrope_layers.items():
        half, total = params.rotary_dim // 2, sum(params.mrope_section or ())
        if total != half:
            yield ctx.hit(
                ctx.model.pointer(layer_type, "mrope_section"),
                f"mrope_section {list(params.mrope_section or ())} sums to {total}; rotary_dim/2 = {half} "
                f"(head_dim {params.head_dim} x partial_rotary_factor {params.partial_rotary_factor:g} / 2): vLLM "
                "asserts, SGLang silently rescales, transformers fails in torch.split (chunked)",
                f"Use sections that sum to {half}.",
            )


@rule(
    "RS502",
    "mrope-interleaved-unrealizable",
    family="mrope",
    severity=ERROR,
    summary="Interleaved M-RoPE cannot realise the declared T/H/W split (needs 3h-2 < half and 3w-1 < half).",
    reference="https://github.com/ohdearquant/lattice/issues/1507",
    catalogue="MRP-002",
)
def mrope_interleaved_unrealizable(ctx: LintContext) -> Iterator[Hit]:
    for layer_type, params in ctx.model.mrope_layers.items():
        section, half = tuple(params.mrope_section or ()), params.rotary_dim // 2
        if params.mrope_layout != "interleaved" or sum(section) != half:
            continue
        realized = interleaved_split(section, half)
        if realized != section:
            yield ctx.hit(
                ctx.model.pointer(layer_type, "mrope_section"),
                f"interleaved lanes [T H W T H W ...] over {half} frequencies realise T/H/W = {list(realized)}, "
                f"not the declared {list(section)}",
                f"Declare the split the layout realises ({list(realized)}) or one with 3h-2 < {half} and "
                f"3w-1 < {half}.",
            )


@rule(
    "RS503",
    "mrope-layout-family-mismatch",
    family="mrope",
    severity=ERROR,
    summary="`mrope_interleaved` disagrees with the model family (Qwen3-VL/3.5 interleaved, Qwen2/2.5-VL chunked).",
    reference="https://github.com/alibaba/MNN/pull/4133",
    catalogue="MRP-003",
)
def mrope_layout_family_mismatch(ctx: LintContext) -> Iterator[Hit]:
    expected = ctx.model.family.mrope_layout
    if expected is None:
        return
    for entry in ctx.model.written_entries:
        declared = "interleaved" if entry.get("mrope_interleaved") else "chunked"
        if declared != expected and (entry.has("mrope_section") or entry.has("mrope_interleaved")):
            yield ctx.hit(
                entry.key_pointer("mrope_interleaved"),
                f"{ctx.model.model_type} uses {expected} M-RoPE but the config declares {declared}: engines that "
                "read the flag (vLLM) lay out T/H/W wrongly; text still works, images and video break",
                f'Set "mrope_interleaved": {str(expected == "interleaved").lower()}.',
            )


@rule(
    "RS504",
    "mrope-gptj-on-vllm",
    family="mrope",
    severity=WARNING,
    summary="M-RoPE with GPT-J pairing on vLLM: its Triton M-RoPE kernel is NeoX-only.",
    reference="https://github.com/vllm-project/vllm/issues/42016",
    catalogue="MRP-004",
)
def mrope_gptj_on_vllm(ctx: LintContext) -> Iterator[Hit]:
    pairing = ctx.intent.pairing or ctx.pairing
    if pairing != "gptj" or "vllm" not in ctx.target_names:
        return
    for layer_type, _ in ctx.model.mrope_layers.items():
        yield ctx.hit(
            ctx.model.pointer(layer_type, "mrope_section"),
            "M-RoPE with GPT-J (interleaved pairs) pairing: vLLM's Triton M-RoPE kernel rotates NeoX halves "
            "whatever is_neox_style says (GLM-4.1V/GLM-OCR image inputs, vllm#42016; the kernel at vLLM @055e47c "
            "has a GPT-J branch); SGLang's fused kernel supports both",
            "Use a vLLM whose _triton_mrope_forward takes is_neox_style (vllm#42016), or serve it with SGLang.",
            engine="vllm",
        )


VIDEO_EXTENT_CEILING = float(INT64_MAX)
"""Positions are int64 in every engine: a larger projected extent (video_fps 1e308) counts as this one."""


def _video_extent(ctx: LintContext) -> float:
    """Extra temporal positions a video can add beyond its token count (tokens_per_second x seconds), at most
    ``VIDEO_EXTENT_CEILING``."""
    seconds = ctx.intent.max_video_seconds
    if not seconds:
        return 0.0
    vision = ctx.model.document.get("vision_config") or {}
    per_second = finite_positive(vision.get("tokens_per_second")) if isinstance(vision, dict) else None
    if per_second is None:
        per_second = (ctx.intent.video_fps or 2.0) / 2  # one temporal patch per two frames
    return min(seconds * per_second, VIDEO_EXTENT_CEILING)


@rule(
    "RS505",
    "mrope-positions-exceed-cache",
    family="mrope",
    severity=WARNING,
    summary="Projected M-RoPE positions (text plus video time) reach past the engine's cos/sin cache.",
    reference="https://github.com/vllm-project/vllm/issues/9965",
    catalogue="MRP-005",
)
def mrope_positions_exceed_cache(ctx: LintContext) -> Iterator[Hit]:
    if not ctx.model.mrope_layers:
        return
    extent = _video_extent(ctx)
    for engine in ctx.targeted("vllm", "sglang"):
        rows, served = ctx.lengths[engine].cache_rows, ctx.served(engine)
        if rows is None or served is None or served > rows:
            continue  # RS302 reports a served length past the cache
        projected = served + math.ceil(extent)
        if projected > rows:
            yield ctx.hit(
                ctx.model.pointer("full_attention", "max_position_embeddings"),
                f"M-RoPE positions may reach {fmt(projected)} ({fmt(served)} tokens + {fmt(math.ceil(extent))} "
                f"video time positions) but {engine} caches {fmt(rows)} rows",
                "Shorten the longest video, lower the served length, or raise max_position_embeddings.",
                engine=engine,
            )


@rule(
    "RS506",
    "qwen25vl-video-interval",
    family="mrope",
    severity=WARNING,
    summary="Qwen2.5-VL video above 2 fps on transformers 4.x collapses the temporal axis (integer interval).",
    reference="https://github.com/huggingface/transformers/issues/45325",
    catalogue="MRP-006",
)
def qwen25vl_video_interval(ctx: LintContext) -> Iterator[Hit]:
    fps = ctx.intent.video_fps
    if not (ctx.model.model_type or "").startswith("qwen2_5_vl") or fps is None or fps <= 2:
        return
    for target in ctx.targets("transformers"):
        if target.spec.may_predate(TRANSFORMERS_FLOAT_VIDEO_INTERVAL):
            yield ctx.intent_hit(
                "video_fps",
                f"at {fps:g} fps second_per_grid_t = {2 / fps:.3g} < 1; transformers 4.x cast it to int (0) so every "
                "frame gets temporal position 0",
                f"Pin transformers >= {TRANSFORMERS_FLOAT_VIDEO_INTERVAL} (float interval, PR #48669) or sample "
                "video at <= 2 fps.",
                engine="transformers",
            )


@rule(
    "RS507",
    "legacy-mrope-type",
    family="mrope",
    severity=INFO,
    summary="Legacy rope type `mrope` (means default RoPE plus `mrope_section`).",
    reference=f"{SPEC} §3.2 item 5",
    catalogue="MRP-007",
)
def legacy_mrope_type(ctx: LintContext) -> Iterator[Hit]:
    for entry in ctx.model.written_entries:
        if written_type(entry) == "mrope":
            key = "rope_type" if entry.has("rope_type") else "type"
            yield ctx.hit(
                entry.key_pointer(key),
                "'mrope' is mapped to 'default' by transformers and vLLM (TGI maps it back for Qwen2-VL)",
                'Write "rope_type": "default" with the mrope_section (the form transformers >= 4.45 saves).',
            )


@rule(
    "RS508",
    "llama-cpp-mrope",
    family="mrope",
    severity=INFO,
    summary="llama.cpp runs M-RoPE with 4 position rows per token and no context shift.",
    reference=f"{NOTE} §3",
    catalogue="MRP-008",
)
def llama_cpp_mrope(ctx: LintContext) -> Iterator[Hit]:
    if "llama.cpp" not in ctx.target_names:
        return
    for layer_type, params in ctx.model.mrope_layers.items():
        kind = "IMROPE" if params.mrope_layout == "interleaved" else "MROPE"
        yield ctx.hit(
            ctx.model.pointer(layer_type, "mrope_section"),
            f"llama.cpp rope type {kind}: 4 position rows per token (rope.dimension_sections) and the KV cache "
            "refuses context shift",
            "Size n_ctx for the whole conversation; context shifting is unavailable.",
            engine="llama.cpp",
        )


@rule(
    "RS509",
    "mrope-section-missing",
    family="mrope",
    severity=WARNING,
    summary="An M-RoPE model family without an explicit `mrope_section` in its rope dict.",
    reference=f"{NOTE} §1.5 (vLLM uses_mrope)",
)
def mrope_section_missing(ctx: LintContext) -> Iterator[Hit]:
    for layer_type, params in ctx.model.mrope_layers.items():
        if ctx.model.source(layer_type, "mrope_section") == "default:family":
            entry = ctx.model.main_entry
            base = entry.pointer if entry is not None else pointers.join(ctx.model.text_pointer, "rope_parameters")
            yield ctx.hit(
                pointers.join(base, "mrope_section"),
                f"no mrope_section: transformers' {ctx.model.model_type} class supplies "
                f"{list(params.mrope_section or ())}, but engines that detect M-RoPE from the file (vLLM uses_mrope) "
                "fall back to 1-D RoPE and vision positions break",
                f'Write "mrope_section": {list(params.mrope_section or ())} into the rope dict.',
            )


@rule(
    "RS510",
    "mrope-layout-intent-mismatch",
    family="mrope",
    severity=ERROR,
    summary="The deployment's M-RoPE layout (kernel or converter) differs from the config's.",
    reference="https://github.com/mlx-node/mlx-node/pull/80",
    catalogue="MRP-003",
)
def mrope_layout_intent_mismatch(ctx: LintContext) -> Iterator[Hit]:
    expected = ctx.intent.mrope_layout
    main = ctx.model.main
    if expected is None or main is None:
        return
    actual = main.mrope_layout or "none (1-D RoPE)"
    if actual != expected:
        yield ctx.intent_hit(
            "mrope_layout",
            f"the deployment applies {expected} M-RoPE but the config's layout is {actual}: text tokens agree "
            "(t = h = w), image and video tokens get wrong frequencies",
            f"Run the {actual} layout, or fix the config if the checkpoint really is {expected}.",
        )


VLLM_MROPE_AS_DEFAULT = Version.parse("0.6.3")
"""First vLLM that accepts M-RoPE written as rope_type "default" + mrope_section (the transformers >= 4.45 form)."""


@rule(
    "RS511",
    "vllm-mrope-default-type",
    family="mrope",
    severity=ERROR,
    summary='M-RoPE written as rope_type "default" with mrope_section fails vLLM before 0.6.3 at model init.',
    reference="https://github.com/vllm-project/vllm/issues/8388",
)
def vllm_mrope_default_type(ctx: LintContext) -> Iterator[Hit]:
    entries = [e for e in ctx.model.written_entries if written_type(e) == "default" and e.has("mrope_section")]
    target = ctx.intent.target("vllm") if entries else None  # the entries first: most configs have none
    if target is None or not target.spec.may_predate(VLLM_MROPE_AS_DEFAULT):
        return
    for entry in entries:
        yield ctx.hit(
            entry.key_pointer("rope_type" if entry.has("rope_type") else "type"),
            f"{target} may be older than 0.6.3, which asserts on M-RoPE written as type 'default' (the form "
            "transformers >= 4.45 saves); it expects type 'mrope'",
            'Pin vLLM >= 0.6.3, or write "type": "mrope" for the older engine.',
            engine="vllm",
        )
