"""RS8xx: how the serving stack turns tokens into position ids."""

from __future__ import annotations

from collections.abc import Iterator

from ropeserve.lint.context import LintContext
from ropeserve.lint.findings import NOTE, Hit, Severity, rule
from ropeserve.lint.numerics import EXACT_INTEGER_LIMIT

ERROR, WARNING, INFO = Severity.ERROR, Severity.WARNING, Severity.INFO


def _uses_mrope(ctx: LintContext) -> bool:
    return bool(ctx.model.mrope_layers)


@rule(
    "RS801",
    "left-padding-shared-positions",
    family="positions",
    severity=ERROR,
    summary="Left-padded batches with one shared position range (cache_position) instead of per-row positions.",
    reference="https://github.com/unslothai/unsloth/issues/3699",
    catalogue="POS-001",
)
def left_padding_shared_positions(ctx: LintContext) -> Iterator[Hit]:
    plan = ctx.intent.positions
    if plan.padding_side == "left" and plan.position_ids == "cache_position":
        yield ctx.intent_hit(
            "positions/position_ids",
            "left padding with cache_position as position_ids: shorter rows start at the pad count instead of 0",
            "Derive per-row positions from the attention mask (cumsum(mask) - 1) or pad on the right.",
        )


@rule(
    "RS802",
    "mrope-decode-positions",
    family="positions",
    severity=ERROR,
    summary="M-RoPE decode positions must be context_len + delta on all three rows.",
    reference="https://github.com/vllm-project/vllm/pull/10403",
    catalogue="POS-002",
)
def mrope_decode_positions(ctx: LintContext) -> Iterator[Hit]:
    if _uses_mrope(ctx) and ctx.intent.positions.mrope_decode == "sequential":
        yield ctx.intent_hit(
            "positions/mrope_decode",
            "decode continues at context_len without the prompt's mrope_position_delta: after an image or video "
            "every generated token sits at the wrong position",
            "Use positions context_len + delta (delta = max prompt position + 1 - prompt length), same on T/H/W.",
        )


@rule(
    "RS803",
    "chunked-prefill-recomputes-positions",
    family="positions",
    severity=WARNING,
    summary="Chunked prefill must slice positions computed for the full prompt, not recompute them per chunk.",
    reference=f"{NOTE} §1.4 (vLLM [:, context_len:seq_len])",
    catalogue="POS-003",
)
def chunked_prefill_recomputes_positions(ctx: LintContext) -> Iterator[Hit]:
    if ctx.intent.positions.chunked_prefill == "recompute":
        extra = " and M-RoPE vision blocks lose their offsets" if _uses_mrope(ctx) else ""
        yield ctx.intent_hit(
            "positions/chunked_prefill",
            f"positions recomputed from each prefill chunk restart or drift{extra}",
            "Compute positions once for the whole prompt and slice [context_len:seq_len] per chunk.",
        )


@rule(
    "RS804",
    "qwen3vl-video-frames",
    family="positions",
    severity=INFO,
    summary="Qwen3-VL video: one (1, h, w) position block per frame, separated by timestamp tokens.",
    reference=f"{NOTE} §5 POS-004",
    catalogue="POS-004",
)
def qwen3vl_video_frames(ctx: LintContext) -> Iterator[Hit]:
    video = ctx.intent.video_fps is not None or ctx.intent.max_video_seconds is not None
    if video and (ctx.model.model_type or "").startswith("qwen3_vl"):
        yield ctx.intent_hit(
            "video_fps",
            "Qwen3-VL encodes each frame as its own (1, h, w) block between timestamp text tokens; frames with no "
            "text between them merge into one block",
            "Let the processor insert the timestamps; do not feed raw frame grids.",
        )


@rule(
    "RS805",
    "positions-beyond-float32",
    family="positions",
    severity=ERROR,
    summary="Positions at or above 2**24 are not exact in float32, which every engine uses for positions.",
    reference=f"{NOTE} §1.2",
)
def positions_beyond_float32(ctx: LintContext) -> Iterator[Hit]:
    limit = EXACT_INTEGER_LIMIT["float32"]
    if ctx.longest and ctx.longest - 1 > limit:
        yield ctx.intent_hit(
            "max_model_len",
            f"positions up to {ctx.longest - 1:,} but float32 represents integers exactly only up to {limit:,}: "
            "neighbouring positions collapse onto the same angle",
            f"Serve at most {limit:,} positions, or build positions and angles in float64.",
        )
