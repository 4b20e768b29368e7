"""Lint results and their renderings: JSON, SARIF 2.1.0 (code scanning) and terminal text."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Any

from ropeserve import __version__
from ropeserve.lint import pointers
from ropeserve.lint.engines import EngineLength
from ropeserve.lint.findings import DOCS_URI, RULES, SEVERITIES_DESCENDING, Finding, Rule, Severity
from ropeserve.lint.intent import DeploymentIntent

TOOL_NAME = "ropeserve-lint"
SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
_LABELS_DESCENDING = tuple(severity.label for severity in SEVERITIES_DESCENDING)


@dataclass(frozen=True)
class Artifact:
    """A linted file: the URI reported in SARIF and its text (for line numbers)."""

    uri: str
    text: str | None = None

    def line_of(self, pointer: str) -> int:
        """1-based line of ``pointer`` (or of its closest existing ancestor); 1 without text."""
        return 1 if self.text is None else pointers.line_of(_line_index(self.text), pointer)


@lru_cache(maxsize=32)
def _line_index(text: str) -> dict[str, int]:
    return pointers.line_index(text)


@dataclass(frozen=True)
class LintReport:
    """Findings for one config plus the per-engine length table and the numerics summary."""

    findings: tuple[Finding, ...]
    engines: tuple[EngineLength, ...]
    numerics: Mapping[str, Any]
    model: Mapping[str, Any]
    intent: DeploymentIntent
    artifacts: Mapping[str, Artifact] = field(default_factory=dict)

    def located(self, artifacts: Mapping[str, Artifact]) -> LintReport:
        """The same report with file locations for its artifacts (``config``, ``tokenizer_config``, ...)."""
        return replace(self, artifacts=dict(artifacts))

    def count(self, severity: Severity) -> int:
        return sum(1 for f in self.findings if f.severity == severity)

    def fails(self, threshold: Severity) -> bool:
        """Whether any finding is at or above ``threshold``."""
        return any(f.severity >= threshold for f in self.findings)

    def finding_counts(self) -> Counter[tuple[str, str]]:
        """(rule id, severity) -> number of findings: the labels of the service's findings counter."""
        return Counter((f.rule.id, f.severity.label) for f in self.findings)

    def summary(self) -> dict[str, Any]:
        """Counts per severity label (error, warning, info) and per rule id (sorted). Counted by label: a
        ``Severity`` key would hash through ``Enum.__hash__``, a Python call per lookup."""
        counts: dict[str, Any] = dict.fromkeys(_LABELS_DESCENDING, 0)
        by_rule: dict[str, int] = {}
        for finding in self.findings:
            counts[finding.severity.label] += 1
            by_rule[finding.rule.id] = by_rule.get(finding.rule.id, 0) + 1
        counts["by_rule"] = dict(sorted(by_rule.items()))
        return counts

    def as_dict(self) -> dict[str, Any]:
        return {
            "tool": {"name": TOOL_NAME, "version": __version__},
            "source": self.artifacts["config"].uri if "config" in self.artifacts else None,
            "model": dict(self.model),
            "intent": self.intent.as_dict(),
            "findings": [f.as_dict() for f in self.findings],
            "engines": [e.as_dict() for e in self.engines],
            "numerics": dict(self.numerics),
            "summary": self.summary(),
        }

    def to_json(self) -> str:
        return json.dumps(self.as_dict(), indent=2)

    def to_sarif(self) -> str:
        return json.dumps(sarif_log([self]), indent=2)

    def to_text(self) -> str:
        return render_text(self)


def sarif_log(reports: Sequence[LintReport]) -> dict[str, Any]:
    """One SARIF 2.1.0 run covering ``reports`` (every registered rule is listed in the driver).

    A finding about a document that has no file of its own (an intent given as flags) is placed on line 1 of
    the linted config; its logical location still names the document and pointer.
    """
    rule_ids = list(RULES)
    artifacts: dict[str, int] = {}
    results = []
    for report in reports:
        for finding in report.findings:
            own = report.artifacts.get(finding.hit.artifact)
            artifact = own or report.artifacts.get("config") or Artifact(finding.hit.artifact)
            line = own.line_of(finding.hit.pointer) if own else 1
            index = artifacts.setdefault(artifact.uri, len(artifacts))
            results.append(_sarif_result(finding, artifact, index, line, rule_ids.index(finding.rule.id)))
    return {
        "$schema": SARIF_SCHEMA,
        "version": "2.1.0",
        "runs": [
            {
                "tool": {
                    "driver": {
                        "name": TOOL_NAME,
                        "version": __version__,
                        "informationUri": DOCS_URI,
                        "rules": [_sarif_rule(rule) for rule in RULES.values()],
                    }
                },
                "artifacts": [{"location": {"uri": uri}} for uri in artifacts],
                "results": results,
            }
        ],
    }


def _sarif_rule(rule: Rule) -> dict[str, Any]:
    return {
        "id": rule.id,
        "name": rule.name,
        "shortDescription": {"text": rule.summary},
        "helpUri": rule.help_uri,
        "help": {"text": f"{rule.summary} Reference: {rule.reference}"},
        "defaultConfiguration": {"level": rule.severity.sarif_level},
        "properties": {"family": rule.family, "tags": ["rope", rule.family], "catalogue": rule.catalogue},
    }


def _sarif_result(
    finding: Finding, artifact: Artifact, artifact_index: int, line: int, rule_index: int
) -> dict[str, Any]:
    hit = finding.hit
    engine = f"[{hit.engine}] " if hit.engine else ""
    return {
        "ruleId": finding.rule.id,
        "ruleIndex": rule_index,
        "level": finding.severity.sarif_level,
        "message": {"text": f"{engine}{hit.message}. Fix: {hit.fix}"},
        "locations": [
            {
                "physicalLocation": {
                    "artifactLocation": {"uri": artifact.uri, "index": artifact_index},
                    "region": {"startLine": line},
                },
                "logicalLocations": [{"fullyQualifiedName": f"{hit.artifact}:{hit.pointer or '/'}", "kind": "member"}],
            }
        ],
        "partialFingerprints": {"ropeserveFinding/v1": f"{finding.rule.id}:{hit.artifact}:{hit.pointer}:{hit.engine}"},
        "properties": {
            "pointer": hit.pointer,
            "engine": hit.engine,
            "fix": hit.fix,
            "reference": finding.reference,
        },
    }


def render_text(report: LintReport) -> str:
    lines = [_headline(report)]
    for finding in report.findings:
        lines.extend(_finding_lines(finding))
    lines.extend(_engine_table(report.engines, report.intent))
    lines.extend(_numerics_lines(report.numerics))
    counts = report.summary()
    lines.append("  " + ", ".join(_plural(counts[s.label], s.label) for s in SEVERITIES_DESCENDING))
    return "\n".join(lines)


def _headline(report: LintReport) -> str:
    model = report.model
    source = report.artifacts["config"].uri if "config" in report.artifacts else "config"
    layers = ", ".join(f"{name}: {kind}" for name, kind in (model.get("layers") or {}).items()) or "unreadable"
    details = [
        str(model.get("model_type") or "unknown model_type"),
        layers,
        f"head_dim {model.get('head_dim')}, rotary {model.get('rotary_dim')}" if model.get("head_dim") else "",
        f"{model.get('dtype')} (from {model.get('dtype_source')})",
    ]
    return f"{source}: " + " | ".join(d for d in details if d)


def _finding_lines(finding: Finding) -> list[str]:
    hit = finding.hit
    where = hit.pointer or "/"
    if hit.artifact != "config":
        where = f"{hit.artifact}:{where}"
    engine = f" [{hit.engine}]" if hit.engine else ""
    return [
        f"  {finding.severity.label:<8}{finding.rule.id} {finding.rule.name}{engine} at {where}",
        f"          {hit.message}",
        f"          fix: {hit.fix}",
        f"          ref: {finding.reference}",
    ]


def _engine_table(engines: Iterable[EngineLength], intent: DeploymentIntent) -> list[str]:
    rows = [("engine", "derived", "default", "cache rows", "length check")]
    for length in engines:
        check = length.check
        if length.override_env:
            state = "set" if intent.env_flag(length.override_env) else "unset"
            check = f"{check} ({length.override_env} {state})"
        rows.append(
            (
                str(intent.target(length.engine) or length.engine),
                _number(length.derived),
                _number(length.default),
                _number(length.cache_rows) if length.cache_rows is not None else "on demand",
                check,
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "  " + "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows
    ]


def _numerics_lines(numerics: Mapping[str, Any]) -> list[str]:
    rows = numerics.get("engines") or []
    if not rows:
        return []
    parts = [f"{row['engine']} {_error(row['max_abs_error_cos'], row['max_abs_error_sin'])}" for row in rows]
    reference = numerics.get("float32_reference")
    tail = (
        f"; float32 tables {_error(reference['max_abs_error_cos'], reference['max_abs_error_sin'])}"
        if reference
        else ""
    )
    return [f"  numerics ({numerics['phase_dtype']} phases, max |cos/sin - exact|): {', '.join(parts)}{tail}"]


def _error(cos: float | None, sin: float | None) -> str:
    if cos is None or sin is None:
        return "overflow"
    return f"{max(cos, sin):.2g}"


def _number(value: int | None) -> str:
    return "?" if value is None else f"{value:,}"


def _plural(count: int, word: str) -> str:
    return f"{count} {word}" + ("s" if count != 1 else "")
