"""``lint_config``: run every registered rule over one config and deployment intent."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import ropeserve.lint.rules  # noqa: F401  (registers the rules)
from ropeserve.config import RopeParams
from ropeserve.config.jsonsafe import check_json_numbers
from ropeserve.lint.context import LintContext
from ropeserve.lint.engines import ENGINE_SOURCES
from ropeserve.lint.findings import RULES, Finding, Hit, Rule
from ropeserve.lint.intent import DEFAULT_INTENT, DeploymentIntent
from ropeserve.lint.report import LintReport


def lint_config(
    config: Mapping[str, Any],
    intent: DeploymentIntent | None = None,
    *,
    tokenizer_config: Mapping[str, Any] | None = None,
    draft_config: Mapping[str, Any] | None = None,
) -> LintReport:
    """Lint a Hugging Face ``config.json`` dict against a deployment ``intent`` (default: all engines).

    ``tokenizer_config`` (its ``model_max_length``) and a speculative ``draft_config`` are optional. Raises
    InvalidInput when ``config`` is not a JSON object, or when a document holds a number no float can carry
    (10**400) or nests past ``MAX_JSON_DEPTH`` (the field is ``/<document>/<pointer>``); every other problem
    is a finding.
    """
    documents = {"config": config, "tokenizer_config": tokenizer_config, "draft_config": draft_config}
    for name, document in documents.items():
        if document is not None:
            check_json_numbers(document, f"/{name}")
    context = LintContext.build(config, intent or DEFAULT_INTENT, tokenizer_config, draft_config)
    findings = default_target_severity(
        [Finding(rule, _sourced(rule, hit)) for rule in RULES.values() for hit in rule.check(context)], context.intent
    )
    findings.sort(key=lambda f: (-f.severity, f.rule.id, f.hit.artifact, f.hit.pointer, f.hit.engine or ""))
    return LintReport(
        findings=tuple(findings),
        engines=tuple(context.lengths.values()),
        numerics=_numerics_summary(context),
        model=_model_summary(context),
        intent=context.intent,
    )


def _sourced(rule: Rule, hit: Hit) -> Hit:
    """``hit`` citing its engine's own source (``engines.ENGINE_SOURCES``) unless it already names a reference."""
    source = ENGINE_SOURCES.get(hit.engine or "", {}).get(rule.id)
    return hit if source is None or hit.reference is not None else replace(hit, reference=source)


def default_target_severity(findings: list[Finding], intent: DeploymentIntent) -> list[Finding]:
    """Apply the default-target rule (docs/lint.md#default-targets).

    When nobody asked for engines (no ``--engine``, no ``engines`` in the intent file or HTTP body), every
    engine is a target only so that the report can say how each one would behave: a finding about one
    engine is then reported at info. It keeps its severity when the same rule hits the same place for every
    target engine (a fault that breaks every engine) or when it is engine-independent.
    """
    if intent.engines_asked:
        return findings
    every = {target.name for target in intent.engines}
    engines_per_place: dict[tuple[str, str, str], set[str]] = defaultdict(set)
    for finding in findings:
        if finding.hit.engine is not None:
            engines_per_place[_place(finding)].add(finding.hit.engine)
    return [
        replace(finding, unasked=True)
        if finding.hit.engine is not None and engines_per_place[_place(finding)] != every
        else finding
        for finding in findings
    ]


def _place(finding: Finding) -> tuple[str, str, str]:
    return finding.rule.id, finding.hit.artifact, finding.hit.pointer


def _model_summary(context: LintContext) -> dict[str, Any]:
    model, main = context.model, context.model.main
    return {
        "model_type": model.model_type,
        "layers": {name: _layer_kind(params) for name, params in model.layers.items()},
        "head_dim": main.head_dim if main else None,
        "rotary_dim": main.rotary_dim if main else None,
        "rope_theta": main.rope_theta if main and math.isfinite(main.rope_theta) else None,
        "max_position_embeddings": main.max_position_embeddings if main else None,
        "pairing": context.pairing,
        "dtype": context.dtype,
        "dtype_source": context.dtype_source,
    }


def _layer_kind(params: RopeParams) -> str:
    if params.mrope_section is None:
        return params.rope_type
    return f"{params.rope_type} + {params.mrope_layout} M-RoPE {list(params.mrope_section)}"


def _numerics_summary(context: LintContext) -> dict[str, Any]:
    reference = context.float32_reference
    return {
        "phase_dtype": context.intent.phase_dtype,
        "table_dtype": context.dtype,
        "engines": [row.as_dict() for row in context.numerics],
        "float32_reference": reference.as_dict() if reference else None,
    }
