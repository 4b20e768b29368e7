"""Inference-config linter (torch-free): rule registry, per-engine lengths, numerics, reports.

Public API::

    lint_config(config, intent=None, *, tokenizer_config=None, draft_config=None) -> LintReport
    explain(config, intent=None, *, layer_type=None) -> ExplainReport
    validate_config_request(request) -> dict          # body of POST /v1/config/validate
"""

from ropeserve.lint.explain import ExplainReport, explain
from ropeserve.lint.findings import RULES, Finding, Hit, Rule, Severity
from ropeserve.lint.intent import DeploymentIntent, EngineTarget, PositionPlan
from ropeserve.lint.linter import lint_config
from ropeserve.lint.report import Artifact, LintReport, sarif_log
from ropeserve.lint.service import validate_config_request

__all__ = [
    "RULES",
    "Artifact",
    "DeploymentIntent",
    "EngineTarget",
    "ExplainReport",
    "Finding",
    "Hit",
    "LintReport",
    "PositionPlan",
    "Rule",
    "Severity",
    "explain",
    "lint_config",
    "sarif_log",
    "validate_config_request",
]
