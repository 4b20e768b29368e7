"""Building configs for linter tests: real fixture files, card snippets and JSON-pointer patches."""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any

from ropeserve.lint import DeploymentIntent, LintReport, lint_config
from ropeserve.lint.pointers import DELETE, patched

__all__ = [
    "CONFIGS",
    "DELETE",
    "LINT_FIXTURES",
    "build_config",
    "lint",
    "patched",
    "real_config",
    "rule_ids",
    "with_snippet",
]

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
CONFIGS = FIXTURES / "configs"
LINT_FIXTURES = FIXTURES / "lint"


@cache
def _load(name: str) -> dict[str, Any]:
    return json.loads((CONFIGS / name).read_text(encoding="utf-8"))


def real_config(name: str) -> dict[str, Any]:
    return copy.deepcopy(_load(name))


def with_snippet(config: dict[str, Any], snippet_name: str) -> dict[str, Any]:
    """``config`` with a model card's long-context ``rope_scaling`` block added (as the card says to)."""
    snippet = _load(snippet_name)
    config = copy.deepcopy(config)
    config["rope_scaling"] = copy.deepcopy(snippet.get("rope_scaling", snippet))
    return config


def build_config(spec: Mapping[str, Any]) -> dict[str, Any]:
    """``{"config": file, "rope_scaling_snippet": file?, "patch": {pointer: value}?}`` -> config dict."""
    config = real_config(spec["config"])
    if "rope_scaling_snippet" in spec:
        config = with_snippet(config, spec["rope_scaling_snippet"])
    return patched(config, spec.get("patch"))


def lint(
    config: Mapping[str, Any],
    intent: Mapping[str, Any] | None = None,
    *,
    tokenizer_config: Mapping[str, Any] | None = None,
    draft_config: Mapping[str, Any] | None = None,
) -> LintReport:
    return lint_config(
        config,
        DeploymentIntent.from_mapping(intent or {}),
        tokenizer_config=tokenizer_config,
        draft_config=draft_config,
    )


def rule_ids(report: LintReport, severity: str | None = None) -> set[str]:
    return {f.rule.id for f in report.findings if severity is None or f.severity.label == severity}
