"""RS1xx: how the rope configuration is written (keys, types, aliases, engine support)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import replace

from ropeserve.config.normalize import ROTARY_FRACTION_ALIASES, THETA_ALIASES, RopeEntry
from ropeserve.config.schema import allowed_keys
from ropeserve.lint import pointers
from ropeserve.lint.context import LintContext
from ropeserve.lint.engines import REQUIRED_KEYS, TOP_LEVEL_FOLDED, rope_kinds, support
from ropeserve.lint.findings import NOTE, SPEC, Hit, Severity, rule
from ropeserve.lint.rules.common import TRANSFORMERS_5, canonical_type, is_yarn, written_type

ERROR, WARNING, INFO = Severity.ERROR, Severity.WARNING, Severity.INFO
ALLOWED_TYPE_PAIRS = (frozenset({"su", "longrope"}), frozenset({"mrope", "default"}))
ENGINE_ONLY_KEYS = {
    "attn_factor": "vLLM/SGLang's spelling of attention_factor",
    "extrapolation_factor": "a vLLM-only yarn key",
    "apply_yarn_scaling": "a vLLM-only yarn key",
    "alpha": "vLLM's dynamic-NTK alpha (HunYuan)",
    "mixed_b": "vLLM's ntk key",
    "short_mscale": "a vLLM-only longrope key",
    "long_mscale": "a vLLM-only longrope key",
}
MODEL_READ_KEYS = {
    "llama_4_scaling_beta": "Llama-4 attention temperature; transformers (Ministral 3, Mistral 4) and vLLM read it",
    "finetuned": "the YaRN release's remote model code (modeling_llama_together_yarn, named by auto_map) reads it; "
    "true means the weights were fine-tuned at this factor, which is the static YaRN engines serve",
}
"""Keys outside the rope-type schema that model code reads from the rope dict: not unknown (RS107 stays silent)."""
ALIAS_KEYS = {
    **dict.fromkeys(THETA_ALIASES, "rope_theta"),
    **dict.fromkeys(ROTARY_FRACTION_ALIASES, "partial_rotary_factor"),
    "rotary_emb_fraction": "partial_rotary_factor",
    "rotary_dim": "partial_rotary_factor (= rotary_dim / head_dim)",
}


@rule(
    "RS100",
    "config-unreadable",
    family="schema",
    severity=ERROR,
    summary="The rope configuration cannot be read at all (no head_dim, a non-numeric value, a malformed dict).",
    reference=f"{SPEC} §3",
)
def config_unreadable(ctx: LintContext) -> Iterator[Hit]:
    error = ctx.model.error
    if error is not None:
        field = error.field or ""
        pointer = field if field.startswith("/") else ""
        fix = "Fix the value at the pointer; rules that need the parsed rope parameters are skipped until then."
        yield ctx.hit(pointer, error.detail, fix)


@rule(
    "RS101",
    "type-conflict",
    family="schema",
    severity=ERROR,
    summary="`type` and `rope_type` are both set and disagree.",
    reference=f"{NOTE} §1.5 (vLLM patch_rope_parameters_dict)",
    catalogue="SCH-001",
)
def type_conflict(ctx: LintContext) -> Iterator[Hit]:
    for entry in ctx.model.written_entries:
        legacy, current = entry.get("type"), entry.get("rope_type")
        if not isinstance(legacy, str) or not isinstance(current, str) or legacy == current:
            continue
        if frozenset({legacy, current}) in ALLOWED_TYPE_PAIRS:
            continue
        yield ctx.hit(
            entry.key_pointer("type"),
            f"type={legacy!r} but rope_type={current!r}; vLLM raises ValueError, transformers uses rope_type",
            f'Keep one: set "rope_type": "{current}" and delete "type" (or the reverse if {legacy!r} is meant).',
        )


@rule(
    "RS102",
    "legacy-type-key",
    family="schema",
    severity=INFO,
    summary="Only the legacy `type` key names the rope type.",
    reference=f"{NOTE} §5 SCH-002",
    catalogue="SCH-002",
)
def legacy_type_key(ctx: LintContext) -> Iterator[Hit]:
    for entry in ctx.model.written_entries:
        if entry.has("type") and not entry.has("rope_type"):
            yield ctx.hit(
                entry.key_pointer("type"),
                f"rope type given only as legacy type={entry.get('type')!r}; transformers and vLLM remap it, "
                "TensorRT-LLM reads `type` before `rope_type`",
                f'Write "rope_type": "{canonical_type(entry)}" (transformers v5 form).',
            )


@rule(
    "RS103",
    "mrope-without-section",
    family="schema",
    severity=ERROR,
    summary="Rope type `mrope` without `mrope_section`.",
    reference=f"{NOTE} §1.5 (vLLM: mrope -> default needs mrope_section)",
    catalogue="SCH-003",
)
def mrope_without_section(ctx: LintContext) -> Iterator[Hit]:
    for entry in ctx.model.written_entries:
        if written_type(entry) == "mrope" and not entry.has("mrope_section"):
            yield ctx.hit(
                entry.key_pointer("mrope_section"),
                "rope type 'mrope' but no mrope_section: vLLM raises ValueError when it maps mrope to default",
                'Add the model\'s sections, e.g. "mrope_section": [16, 24, 24] for Qwen2/2.5-VL.',
            )


@rule(
    "RS104",
    "su-alias",
    family="schema",
    severity=INFO,
    summary="Legacy rope type name `su` (LongRoPE).",
    reference=f"{NOTE} §5 SCH-004",
    catalogue="SCH-004",
)
def su_alias(ctx: LintContext) -> Iterator[Hit]:
    for entry in ctx.model.written_entries:
        for key in ("rope_type", "type"):
            if entry.get(key) == "su":
                yield ctx.hit(
                    entry.key_pointer(key),
                    "'su' is the old name of longrope; vLLM maps it with a warning, TGI accepts both",
                    f'Write "{key}": "longrope".',
                )


@rule(
    "RS105",
    "engine-unsupported-rope",
    family="schema",
    severity=ERROR,
    summary="A target engine (at the pinned version) does not implement this rope kind.",
    reference=f"{NOTE} §6",
    catalogue="SCH-005",
)
def engine_unsupported(ctx: LintContext) -> Iterator[Hit]:
    seen = set()
    for layer_type, params in ctx.model.layers.items():
        for kind in rope_kinds(params):
            for target in ctx.targets():
                cell = support(kind, target.name)
                reason = cell.refuses(target)
                if (reason is None and cell.level != "D") or (kind, target.name) in seen:
                    continue
                seen.add((kind, target.name))
                key = "mrope_section" if kind.startswith("mrope") else "rope_type"
                pointer = ctx.model.pointer(layer_type, key)
                if reason is None:
                    yield _dropped_scaling(ctx, pointer, kind, target.name, cell.note, params.max_position_embeddings)
                    continue
                yield ctx.hit(
                    pointer,
                    f"{target} cannot run {kind!r}: {reason}",
                    f"Pick an engine/version that supports {kind!r} (see the support matrix) or drop {target.name}.",
                    engine=target.name,
                )


def _dropped_scaling(ctx: LintContext, pointer: str, kind: str, engine: str, note: str, trained: int | None) -> Hit:
    """An engine that drops the scaling runs the trained, unscaled model: info inside ``trained``, error past it."""
    served = ctx.served(engine)
    beyond = served is not None and trained is not None and served > trained
    effect = (
        f"it serves {served:,} positions, past the trained {trained or 0:,}"
        if beyond
        else f"the model runs as trained, which is right within its {trained or 0:,} trained positions"
    )
    return replace(
        ctx.hit(
            pointer,
            f"{engine} does not apply {kind!r}: {note}; {effect}",
            f"Serve at most {trained or 0:,} tokens on {engine}, or use an engine that applies {kind!r}.",
            engine=engine,
        ),
        severity=ERROR if beyond else INFO,
    )


def _present_keys(entry: RopeEntry, engine: str, ctx: LintContext) -> set[str]:
    """The keys ``engine`` finds in the rope dict: its own, plus the top-level ones vLLM and SGLang fold in."""
    present = set(entry.data or ())
    if engine in ("vllm", "sglang"):
        present.update(key for key in TOP_LEVEL_FOLDED if ctx.model.text.get(key) is not None)
    return present


@rule(
    "RS106",
    "missing-required-key",
    family="schema",
    severity=ERROR,
    summary="A key the engine indexes directly is missing for this rope type (KeyError at model init).",
    reference=f"{NOTE} §1.1, §5 SCH-006",
    catalogue="SCH-006",
)
def missing_required_key(ctx: LintContext) -> Iterator[Hit]:
    for entry in ctx.model.written_entries:
        rope_type = canonical_type(entry)
        for target in ctx.targets(*REQUIRED_KEYS):
            requirements = REQUIRED_KEYS[target.name].get(rope_type or "", ())
            if not requirements:
                continue
            present = _present_keys(entry, target.name, ctx)
            for alternatives in requirements:
                if not present.isdisjoint(alternatives):
                    continue
                wanted = " or ".join(alternatives)
                yield ctx.hit(
                    entry.key_pointer(alternatives[0]),
                    f"{target.name} needs {wanted} for rope type {rope_type!r} and fails at model init without it",
                    f"Add {wanted} to the rope dict.",
                    engine=target.name,
                )


@rule(
    "RS107",
    "unknown-rope-key",
    family="schema",
    severity=WARNING,
    summary="A key in the rope dict is not defined for its rope type.",
    reference=f"{SPEC} §3.3 rule 11",
    catalogue="SCH-007",
)
def unknown_rope_key(ctx: LintContext) -> Iterator[Hit]:
    for entry in ctx.model.written_entries:
        allowed = allowed_keys(canonical_type(entry) or "default")
        if allowed is None:
            continue
        allowed = allowed | MODEL_READ_KEYS.keys() | ctx.model.family.rope_keys_read
        for key in sorted(set(entry.data or ()) - allowed):
            why = ENGINE_ONLY_KEYS.get(key, "unknown to every engine read")
            yield ctx.hit(
                entry.key_pointer(key),
                f"{key!r} is not a {canonical_type(entry) or 'default'} key ({why}); transformers warns "
                "'Unrecognized keys' and ignores it",
                "Remove it, or use the transformers key if one exists (e.g. attention_factor for attn_factor).",
            )


@rule(
    "RS108",
    "yarn-attention-factor-ignored",
    family="schema",
    severity=WARNING,
    summary="YaRN `attention_factor` is read by transformers only; vLLM/SGLang read `attn_factor`, TGI fixes 1.",
    reference=f"{NOTE} §1.1 notes",
    catalogue="SCH-008",
)
def yarn_attention_factor(ctx: LintContext) -> Iterator[Hit]:
    for entry in ctx.model.written_entries:
        if not is_yarn(canonical_type(entry)) or not entry.has("attention_factor") or entry.has("attn_factor"):
            continue
        for engine in ctx.targeted("vllm", "sglang", "tgi"):
            yield ctx.hit(
                entry.key_pointer("attention_factor"),
                f"{engine} ignores attention_factor={entry.get('attention_factor')!r} "
                f"({'hard-codes 1' if engine == 'tgi' else 'reads attn_factor'}): attention magnitude differs "
                "from transformers",
                "Also set attn_factor to the same value for vLLM/SGLang; TGI cannot take it.",
                engine=engine,
            )


def _disagreements(ctx: LintContext) -> Iterator[tuple[str, str, str]]:
    """(pointer read, pointer shadowed, which wins) for every pair of places that both set a rope value."""
    text, text_pointer = ctx.model.text, ctx.model.text_pointer
    for entry in ctx.model.written_entries:
        for key, winner in (
            ("rope_theta", "the rope dict's value (transformers setdefault)"),
            ("partial_rotary_factor", "the rope dict's value (transformers setdefault)"),
            ("original_max_position_embeddings", "Phi-3 takes the top level; others the rope dict"),
        ):
            if entry.has(key) and key in text:
                yield entry.key_pointer(key), pointers.join(text_pointer, key), winner
    both = [pointers.join(text_pointer, key) for key in ("rope_scaling", "rope_parameters") if text.get(key)]
    if len(both) == 2:
        yield both[0], both[1], "rope_scaling (it replaces rope_parameters)"
    if text_pointer:
        for key in ("rope_scaling", "rope_parameters", "rope_theta", "max_position_embeddings"):
            if key in text and key in ctx.model.document:
                yield pointers.join(text_pointer, key), pointers.join("", key), "text_config in transformers"


@rule(
    "RS109",
    "conflicting-rope-values",
    family="schema",
    severity=WARNING,
    summary="The same rope or length value is set in two places with different values.",
    reference=f"{NOTE} §5 SCH-009",
    catalogue="SCH-009",
)
def conflicting_values(ctx: LintContext) -> Iterator[Hit]:
    document = ctx.model.document
    for read, shadowed, winner in _disagreements(ctx):
        first, second = pointers.resolve(document, read), pointers.resolve(document, shadowed)
        if first != second:
            yield ctx.hit(
                read,
                f"{read} = {first!r} but {shadowed} = {second!r}; engines disagree on which wins (winner: {winner})",
                f"Keep one value: delete {shadowed} or make both equal.",
            )


@rule(
    "RS110",
    "alias-key",
    family="schema",
    severity=INFO,
    summary="An alias key (`rotary_emb_base`, `rotary_pct`, `rotary_emb_fraction`, `rotary_dim`) carries rope data.",
    reference=f"{NOTE} §5 SCH-010",
    catalogue="SCH-010",
)
def alias_key(ctx: LintContext) -> Iterator[Hit]:
    for key, canonical in ALIAS_KEYS.items():
        if key in ctx.model.text:
            yield ctx.hit(
                pointers.join(ctx.model.text_pointer, key),
                f"{key} is an alias of {canonical}; engines read different alias sets (TensorRT-LLM even "
                "reads rotary_emb_base as a dimension)",
                f"Write {canonical.split(' ')[0]} instead.",
            )


@rule(
    "RS111",
    "rope-theta-invalid",
    family="schema",
    severity=ERROR,
    summary="`rope_theta` is not a finite number above 1 (frequencies theta^(-2i/d) would not decrease).",
    reference=f"{NOTE} §5 SCH-011",
    catalogue="SCH-011",
)
def rope_theta_invalid(ctx: LintContext) -> Iterator[Hit]:
    for layer_type, params in ctx.model.layers.items():
        if not math.isfinite(params.rope_theta) or params.rope_theta <= 1:
            yield ctx.hit(
                ctx.model.pointer(layer_type, "rope_theta"),
                f"rope_theta = {params.rope_theta!r}: frequencies theta^(-2i/d) are undefined or do not decrease",
                "Set the rope_theta the model was trained with (e.g. 10000, 500000, 1000000).",
            )


ENGINE_FALLBACK_THETA = 10_000.0
"""The rope_theta that engines and converters reading the raw file assume when it is absent."""


@rule(
    "RS112",
    "rope-theta-missing",
    family="schema",
    severity=WARNING,
    summary="`rope_theta` is absent and the model class's default differs from the 10000 engines assume.",
    reference=f"{NOTE} §5 SCH-011",
    catalogue="SCH-011",
)
def rope_theta_missing(ctx: LintContext) -> Iterator[Hit]:
    for layer_type, params in ctx.model.layers.items():
        if ctx.model.source(layer_type, "rope_theta") != "default:family" or params.rope_theta == ENGINE_FALLBACK_THETA:
            continue  # a class default of 10000 (Llama-2, Baichuan, InternLM, ChatGLM...) is what engines use too
        yield ctx.hit(
            _theta_pointer(ctx, layer_type),
            f"no rope_theta: transformers uses {params.rope_theta:g} for {ctx.model.model_type or 'this model'}"
            f", engines and converters that read the raw file default to {ENGINE_FALLBACK_THETA:g} silently",
            "Write the trained rope_theta explicitly.",
        )


def _theta_pointer(ctx: LintContext, layer_type: str) -> str:
    """Where the file would hold rope_theta: its ``rope_parameters`` dict (v5 form), else the text section."""
    entry = next((e for e in ctx.model.entries if e.layer_type == layer_type), ctx.model.main_entry)
    if entry is not None and "/rope_parameters" in entry.pointer:
        return entry.key_pointer("rope_theta")
    return pointers.join(ctx.model.text_pointer, "rope_theta")


@rule(
    "RS113",
    "engine-support-unverified",
    family="schema",
    severity=INFO,
    summary="Whether a target engine runs this rope kind was not verified.",
    reference=f"{NOTE} §6",
)
def engine_support_unverified(ctx: LintContext) -> Iterator[Hit]:
    seen = set()
    for layer_type, params in ctx.model.layers.items():
        for kind in rope_kinds(params):
            for engine in ctx.target_names:
                if support(kind, engine).level == "?" and (kind, engine) not in seen:
                    seen.add((kind, engine))
                    yield ctx.hit(
                        ctx.model.pointer(layer_type, "rope_type"),
                        f"{engine} support for {kind!r} was not verified",
                        f"Run a differential test of {engine} against transformers before deploying.",
                        engine=engine,
                    )


WRAPPER_REQUIRED_ORIGINAL = frozenset({"yarn"})
"""Rope types whose transformers 5 validation requires ``original_max_position_embeddings`` in the dict itself
when nothing standardises it first (a rope dict left at the wrapper level of a nested config)."""


@rule(
    "RS114",
    "wrapper-rope-dict-unloadable",
    family="schema",
    severity=ERROR,
    summary="A yarn dict at the wrapper level of a nested config without original_max_position_embeddings: "
    "transformers 5 raises KeyError at load.",
    reference=f"{SPEC} §3.3",
)
def wrapper_rope_dict_unloadable(ctx: LintContext) -> Iterator[Hit]:
    if not ctx.model.text_pointer or not ctx.targeted("transformers"):
        return
    target = ctx.intent.target("transformers")
    if target is not None and target.spec.may_predate(TRANSFORMERS_5):
        return
    for key in ("rope_scaling", "rope_parameters"):
        value = ctx.model.document.get(key)
        if not isinstance(value, dict) or not value:
            continue
        rope_type = value.get("rope_type", value.get("type"))
        if not isinstance(rope_type, str) or rope_type not in WRAPPER_REQUIRED_ORIGINAL:
            continue
        if "original_max_position_embeddings" not in value:
            yield ctx.hit(
                pointers.join("", key),
                f"transformers 5 validates this top-level {rope_type} dict against the wrapper config, where nothing "
                'fills original_max_position_embeddings: loading raises KeyError "Missing required keys in '
                f"`rope_parameters` for 'rope_type'='{rope_type}'\" (transformers 5.24, Qwen3VLConfig)",
                f"Move the dict into {ctx.model.text_pointer.lstrip('/')}.rope_parameters (where every engine reads "
                "it) and give original_max_position_embeddings there.",
                engine="transformers",
            )
