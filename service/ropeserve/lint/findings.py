"""Rule registry and findings.

A rule is a function ``LintContext -> Iterable[Hit]`` registered with ``@rule(...)``; the registry adds the
rule's stable id, family, severity and reference to each hit to make a ``Finding``. Ids are grouped by
family: RS1xx schema, RS2xx ranges, RS3xx length, RS4xx extension behaviour, RS5xx M-RoPE, RS6xx pairing,
RS7xx numerics, RS8xx positions.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import IntEnum
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ropeserve.lint.context import LintContext

NOTE = "engines-and-config-lint.md"
SPEC = "transformers-rope-spec.md"
DOCS_URI = "https://ropeserve.dev/docs/lint"


class Severity(IntEnum):
    INFO = 1
    WARNING = 2
    ERROR = 3

    @property
    def label(self) -> str:
        return _LABELS[self]

    @property
    def sarif_level(self) -> str:
        return {Severity.INFO: "note", Severity.WARNING: "warning", Severity.ERROR: "error"}[self]

    @classmethod
    def parse(cls, text: str) -> Severity:
        return cls[text.strip().upper()]


_LABELS = {severity: severity.name.lower() for severity in Severity}
SEVERITIES_DESCENDING = tuple(sorted(Severity, reverse=True))
"""Error, warning, info: the order of the report's counts."""


FAMILIES = {
    "schema": "RS1xx",
    "ranges": "RS2xx",
    "length": "RS3xx",
    "extension": "RS4xx",
    "mrope": "RS5xx",
    "pairing": "RS6xx",
    "numerics": "RS7xx",
    "positions": "RS8xx",
}


@dataclass(frozen=True)
class Hit:
    """What a rule function reports: where, what, how to fix it, and for which engine (if engine-specific)."""

    pointer: str
    message: str
    fix: str
    engine: str | None = None
    artifact: str = "config"
    severity: Severity | None = None
    """Overrides the rule's severity for this hit (a rule whose outcome depends on the deployment)."""
    reference: str | None = None
    """Overrides the rule's reference (e.g. the engine's own source for an engine-specific hit)."""


@dataclass(frozen=True)
class Rule:
    id: str
    name: str
    family: str
    severity: Severity
    summary: str
    reference: str
    catalogue: str | None
    check: Callable[[LintContext], Iterable[Hit]]
    basis: str | None = None
    """The maintainers' research note the rule was derived from (not shipped; never shown as the reference)."""

    @property
    def help_uri(self) -> str:
        if self.reference.startswith("https://"):
            return self.reference.split()[0]
        return f"{DOCS_URI}#{self.id.lower()}"


@dataclass(frozen=True)
class Finding:
    """A rule's hit. ``unasked`` marks an engine-specific finding for an engine nobody asked for, reported at
    info (see ``lint.linter.default_target_severity``)."""

    rule: Rule
    hit: Hit
    unasked: bool = False

    @property
    def reference(self) -> str:
        return self.hit.reference or self.rule.reference

    @property
    def severity(self) -> Severity:
        if self.unasked:
            return Severity.INFO
        return self.hit.severity if self.hit.severity is not None else self.rule.severity

    def as_dict(self) -> dict[str, Any]:
        return {
            "rule": self.rule.id,
            "name": self.rule.name,
            "family": self.rule.family,
            "severity": self.severity.label,
            "artifact": self.hit.artifact,
            "pointer": self.hit.pointer,
            "engine": self.hit.engine,
            "message": self.hit.message,
            "fix": self.hit.fix,
            "reference": self.reference,
        }


RULES: dict[str, Rule] = {}


def docs_anchor(rule_id: str) -> str:
    """The rule's row in the shipped docs: the reference of a rule without a public upstream source."""
    return f"docs/lint.md#{rule_id.lower()}"


def rule(
    rule_id: str,
    name: str,
    *,
    family: str,
    severity: Severity,
    summary: str,
    reference: str,
    catalogue: str | None = None,
) -> Callable[[Callable[[LintContext], Iterable[Hit]]], Callable[[LintContext], Iterable[Hit]]]:
    """Register a rule function under a stable id (which must sit in its family's id range)."""
    if family not in FAMILIES or not rule_id.startswith(FAMILIES[family][:3]):
        raise ValueError(f"rule {rule_id} does not fit family {family!r}")

    def register(check: Callable[[LintContext], Iterable[Hit]]) -> Callable[[LintContext], Iterable[Hit]]:
        if rule_id in RULES:
            raise ValueError(f"duplicate rule id {rule_id}")
        public, basis = (reference, None) if reference.startswith("https://") else (docs_anchor(rule_id), reference)
        RULES[rule_id] = Rule(rule_id, name, family, severity, summary, public, catalogue, check, basis)
        return check

    return register
