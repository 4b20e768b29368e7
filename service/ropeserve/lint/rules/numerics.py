"""RS7xx: cos/sin precision at the longest served position (torch-free model in ``lint.numerics``)."""

from __future__ import annotations

from collections.abc import Iterator

from ropeserve.lint.context import LintContext
from ropeserve.lint.findings import SPEC, Hit, Severity, rule
from ropeserve.lint.numerics import EXACT_INTEGER_LIMIT, TableError

WARNING, INFO = Severity.WARNING, Severity.INFO
LOW_PRECISION = frozenset({"bfloat16", "float16"})
FLOAT32_PHASE_TOLERANCE = 5e-2
"""Above this max abs cos/sin error, float32 phases themselves (not the table dtype) lose the position."""


@rule(
    "RS701",
    "low-precision-phases",
    family="numerics",
    severity=WARNING,
    summary="Angles p*inv_freq computed in bfloat16/float16: positions above 256/2048 are not even representable.",
    reference="https://github.com/huggingface/transformers/issues/25681",
    catalogue="NUM-001",
)
def low_precision_phases(ctx: LintContext) -> Iterator[Hit]:
    phase, main, longest = ctx.intent.phase_dtype, ctx.model.computable_main, ctx.longest
    if phase not in LOW_PRECISION or main is None or not longest:
        return
    error = ctx.table_error_of(main, longest - 1, phase, ctx.dtype)
    yield ctx.intent_hit(
        "phase_dtype",
        f"phases in {phase}: integers above {EXACT_INTEGER_LIMIT[phase]} are not exact and the max cos/sin error "
        f"at position {longest - 1:,} is {error.worst:.3g} (float32 phases: "
        f"{ctx.table_error_of(main, longest - 1, 'float32', ctx.dtype).worst:.3g})",
        "Compute inv_freq, positions and their product in float32 (disable autocast around the rotary embedding);"
        " cast only cos/sin.",
    )


@rule(
    "RS702",
    "table-dtype-error",
    family="numerics",
    severity=INFO,
    summary="Max abs cos/sin error of each engine's table dtype at its longest position (vs float64).",
    reference=f"{SPEC} §7 items 1-2",
    catalogue="NUM-002",
)
def table_dtype_error(ctx: LintContext) -> Iterator[Hit]:
    groups: dict[tuple[int, str], tuple[TableError, list[str]]] = {}
    for row in ctx.numerics:
        error = row.error
        if error.table_dtype in LOW_PRECISION:  # the rows share one phase dtype: (position, table dtype) is the key
            groups.setdefault((error.position, error.table_dtype), (error, []))[1].append(row.engine)
    if not groups:
        return
    summary = "; ".join(
        f"{', '.join(engines)}: {error.worst:.2g} at position {error.position:,}" for error, engines in groups.values()
    )
    message = f"cos/sin cast to the model dtype ({ctx.dtype}, from {ctx.dtype_source}): {summary}"
    fix = "Nothing to do for serving; for differential tests compare against float32 tables with this tolerance."
    if ctx.dtype_source.startswith("/"):
        yield ctx.hit(ctx.dtype_source, message, fix)
    else:
        yield ctx.intent_hit("dtype", message, fix)


@rule(
    "RS703",
    "float32-phase-error",
    family="numerics",
    severity=WARNING,
    summary="Even float32 phases lose the position at this length (max abs cos/sin error above 0.05).",
    reference=f"{SPEC} §7 item 1",
)
def float32_phase_error(ctx: LintContext) -> Iterator[Hit]:
    reference = ctx.float32_reference
    if reference is None or reference.worst <= FLOAT32_PHASE_TOLERANCE:
        return
    yield ctx.intent_hit(
        "max_model_len",
        f"at position {reference.position:,} float32 angles p*inv_freq are off by up to {reference.worst:.3g} in "
        "cos/sin (inv_freq and the product round to 24 bits)",
        "Compute the angle in float64 (or split p into high/low parts) when building tables for this length.",
    )
