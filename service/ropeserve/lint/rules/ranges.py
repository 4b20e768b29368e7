"""RS2xx: values outside the range their formula accepts."""

from __future__ import annotations

from collections.abc import Iterator

from ropeserve.config.rope_types import Problem
from ropeserve.config.rope_types.base import ProblemKind
from ropeserve.config.rope_types.yarn import BETA_FAST as YARN_BETA_FAST
from ropeserve.config.rope_types.yarn import BETA_SLOW as YARN_BETA_SLOW
from ropeserve.lint import pointers
from ropeserve.lint.context import LintContext
from ropeserve.lint.findings import NOTE, SPEC, Hit, Severity, rule
from ropeserve.lint.model import MAX_HEAD_DIM
from ropeserve.lint.rules.common import definition_of, is_yarn

ERROR, WARNING = Severity.ERROR, Severity.WARNING


@rule(
    "RS201",
    "factor-below-one",
    family="ranges",
    severity=WARNING,
    summary="Scaling `factor` below 1 compresses the trained context instead of extending it.",
    reference=f"{SPEC} §3.3 rule 13",
    catalogue="RNG-001",
)
def factor_below_one(ctx: LintContext) -> Iterator[Hit]:
    for layer_type, params in ctx.model.layers.items():
        definition = definition_of(params.rope_type)
        if definition is not None and definition.scales and params.factor is not None and 0 < params.factor < 1:
            yield ctx.hit(
                ctx.model.pointer(layer_type, "factor"),
                f"factor = {params.factor:g} < 1 shrinks the usable context (transformers warns)",
                "Use factor = target length / trained length (>= 1), or drop the scaling.",
            )


@rule(
    "RS202",
    "yarn-beta-order",
    family="ranges",
    severity=WARNING,
    summary="YaRN `beta_fast` must exceed `beta_slow`; an explicit 0 silently becomes the default.",
    reference=f"{SPEC} §3.3 rule 17, §7 item 6",
    catalogue="RNG-002",
)
def yarn_beta_order(ctx: LintContext) -> Iterator[Hit]:
    for layer_type, params in ctx.model.layers.items():
        if not is_yarn(params.rope_type):
            continue
        for key, default in (("beta_fast", YARN_BETA_FAST), ("beta_slow", YARN_BETA_SLOW)):
            if getattr(params, key) == 0:
                yield ctx.hit(
                    ctx.model.pointer(layer_type, key),
                    f"{key} = 0 is replaced by {default:g} (transformers reads it with `or`)",
                    f"Write {key} = {default:g} explicitly, or the value you meant.",
                )
        fast, slow = params.beta_fast or YARN_BETA_FAST, params.beta_slow or YARN_BETA_SLOW
        if fast < slow:
            yield ctx.hit(
                ctx.model.pointer(layer_type, "beta_fast"),
                f"beta_fast {fast:g} < beta_slow {slow:g}: the YaRN ramp runs backwards",
                "Swap them (defaults: beta_fast 32, beta_slow 1).",
            )


@rule(
    "RS203",
    "llama3-frequency-factors",
    family="ranges",
    severity=ERROR,
    summary="llama3 `high_freq_factor` must exceed `low_freq_factor` (the smoothing divides by their difference).",
    reference=f"{SPEC} §2.6, §3.3 rule 24",
    catalogue="RNG-003",
)
def llama3_frequency_factors(ctx: LintContext) -> Iterator[Hit]:
    for layer_type, problem in validator_problems(ctx, "order"):
        yield ctx.hit(
            ctx.model.pointer(layer_type, problem.key),
            problem.message,
            "Use the trained values (Llama 3.1: low_freq_factor 1, high_freq_factor 4).",
        )


@rule(
    "RS204",
    "llama3-original-length",
    family="ranges",
    severity=WARNING,
    summary="llama3 `original_max_position_embeddings` should be below `max_position_embeddings`.",
    reference=f"{SPEC} §3.3 rule 24",
    catalogue="RNG-003",
)
def llama3_original_length(ctx: LintContext) -> Iterator[Hit]:
    for layer_type, params in ctx.model.layers.items():
        original, limit = params.original_max_position_embeddings, params.max_position_embeddings
        if params.rope_type == "llama3" and original and limit and original >= limit:
            yield ctx.hit(
                ctx.model.pointer(layer_type, "original_max_position_embeddings"),
                f"original_max_position_embeddings {original:,} >= max_position_embeddings {limit:,}: "
                "the config claims no extension",
                "Set original to the pre-training length (8192 for Llama 3.x) and max to the extended length.",
            )


@rule(
    "RS205",
    "longrope-factor-length",
    family="ranges",
    severity=ERROR,
    summary="LongRoPE `short_factor`/`long_factor` need exactly rotary_dim/2 entries.",
    reference=f"{SPEC} §3.3 rule 20",
    catalogue="RNG-004",
)
def longrope_factor_length(ctx: LintContext) -> Iterator[Hit]:
    for layer_type, problem in validator_problems(ctx, "length"):
        yield ctx.hit(
            ctx.model.pointer(layer_type, problem.key),
            problem.message,
            "Use the factor list that matches this head size, or fix head_dim / partial_rotary_factor.",
        )


@rule(
    "RS206",
    "rotary-dim-invalid",
    family="ranges",
    severity=ERROR,
    summary="`partial_rotary_factor` outside (0, 1], a rotary width that is odd or below 2, or an absurd head_dim.",
    reference=f"{NOTE} §5 RNG-005 (vLLM get_rope ValueError)",
    catalogue="RNG-005",
)
def rotary_dim_invalid(ctx: LintContext) -> Iterator[Hit]:
    for layer_type, params in ctx.model.layers.items():
        factor = params.partial_rotary_factor
        if not 0 < factor <= 1:
            key, problem = "partial_rotary_factor", f"partial_rotary_factor {factor:g} is outside (0, 1]"
        elif params.rotary_dim < 2 or params.rotary_dim % 2:
            key = "partial_rotary_factor" if factor != 1 else "head_dim"
            problem = (
                f"rotary width int(head_dim {params.head_dim} x {factor:g}) = {params.rotary_dim} must be even and >= 2"
            )
        elif params.head_dim > MAX_HEAD_DIM:
            key, problem = "head_dim", f"head_dim {params.head_dim} is implausible (above {MAX_HEAD_DIM})"
        else:
            continue
        yield ctx.hit(
            ctx.model.pointer(layer_type, key),
            problem,
            "Choose head_dim and partial_rotary_factor so that head_dim x factor is an even integer (e.g. 128 x 0.5).",
        )


def validator_problems(ctx: LintContext, kind: ProblemKind) -> Iterator[tuple[str, Problem]]:
    """``(layer type, problem)`` for each problem of ``kind`` the service's validator finds in a RoPE layer."""
    for layer_type, found in ctx.model.layer_problems.items():
        yield from ((layer_type, problem) for problem in found if problem.kind == kind)


@rule(
    "RS207",
    "parameter-out-of-domain",
    family="ranges",
    severity=ERROR,
    summary="A scaling or length parameter is zero, negative or not finite where the formula divides by it.",
    reference=f"{SPEC} §2",
)
def parameter_out_of_domain(ctx: LintContext) -> Iterator[Hit]:
    for layer_type, problem in validator_problems(ctx, "range"):
        key = problem.key
        yield ctx.hit(ctx.model.pointer(layer_type, key), problem.message, f"Set {key} to the trained, positive value.")


@rule(
    "RS208",
    "sliding-window-invalid",
    family="ranges",
    severity=ERROR,
    summary="`sliding_window` is not a positive integer (0, negative, fractional, or not a number).",
    reference="https://github.com/vllm-project/vllm/pull/17772",
)
def sliding_window_invalid(ctx: LintContext) -> Iterator[Hit]:
    for problem in ctx.model.window_problems:
        yield ctx.hit(
            pointers.join(ctx.model.text_pointer, problem.key),
            problem.message,
            "Write the trained window in tokens (e.g. 4096), or null when the model has none.",
        )
