"""Result types: tensors plus metadata for compute endpoints, a lint report for config validation."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["SEVERITIES", "Finding", "LintReport", "TensorResult"]


@dataclass(frozen=True)
class TensorResult(Mapping[str, Any]):
    """Named result tensors (torch tensors or numpy arrays) plus the answer's JSON metadata.

    A mapping over the tensors: ``result["cos"]``, ``list(result)``; the metadata is ``result.meta``
    (e.g. ``result.meta["attention_factor"]``).
    """

    tensors: dict[str, Any]
    meta: dict[str, Any] = dataclasses.field(default_factory=dict)
    request_id: str | None = None

    def __getitem__(self, name: str) -> Any:
        return self.tensors[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.tensors)

    def __len__(self) -> int:
        return len(self.tensors)

    def __repr__(self) -> str:
        shapes = ", ".join(f"{name}{list(getattr(t, 'shape', []))}" for name, t in self.tensors.items())
        return f"TensorResult({shapes}; meta keys {sorted(self.meta)})"


@dataclass(frozen=True)
class Finding:
    """One lint finding: ``rule`` id (``RS301``) and ``name``, ``severity`` (error, warning, info), the
    ``artifact`` (config, tokenizer_config, ...) and JSON ``pointer`` into it, the ``engine`` it concerns (None: all),
    ``message``, ``fix`` and ``reference``; keys a newer server adds land in ``extra``."""

    rule: str
    severity: str
    message: str
    name: str = ""
    artifact: str = "config"
    pointer: str | None = None
    engine: str | None = None
    fix: str | None = None
    reference: str | None = None
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> Finding:
        known = {"rule", "severity", "message", "name", "artifact", "pointer", "engine", "fix", "reference"}
        return cls(
            rule=str(body.get("rule") or ""),
            severity=str(body.get("severity") or "").lower(),
            message=str(body.get("message") or ""),
            name=str(body.get("name") or ""),
            artifact=str(body.get("artifact") or "config"),
            pointer=body.get("pointer"),
            engine=body.get("engine"),
            fix=body.get("fix"),
            reference=body.get("reference"),
            extra={key: value for key, value in body.items() if key not in known},
        )

    def lines(self) -> list[str]:
        """The finding as the server's ``ropeserve lint`` prints it: headline, message, fix."""
        where = self.pointer or "/"
        if self.artifact != "config":
            where = f"{self.artifact}:{where}"
        engine = f" [{self.engine}]" if self.engine else ""
        lines = [f"{self.severity:<8}{self.rule} {self.name}{engine} at {where}", f"        {self.message}"]
        return lines + ([f"        fix: {self.fix}"] if self.fix else [])


SEVERITIES = ("error", "warning", "info")
"""Lint severities, most severe first."""


@dataclass(frozen=True)
class LintReport:
    """What ``/v1/config/validate`` found. ``raw`` is the whole JSON answer: also ``engines`` (per-engine derived
    length, default length, rope cache rows, length check), ``numerics``, ``model``, ``intent`` and ``summary``."""

    findings: list[Finding]
    raw: dict[str, Any]
    request_id: str | None = None

    @property
    def clean(self) -> bool:
        return not self.findings

    @property
    def engines(self) -> list[dict[str, Any]]:
        return list(self.raw.get("engines") or [])

    def count(self, severity: str) -> int:
        return sum(1 for finding in self.findings if finding.severity == severity)

    def fails(self, threshold: str = "error") -> bool:
        """Whether any finding is at or above ``threshold`` (error, warning or info)."""
        worst = SEVERITIES[: SEVERITIES.index(threshold) + 1]
        return any(finding.severity in worst for finding in self.findings)

    @classmethod
    def from_json(cls, body: Mapping[str, Any], request_id: str | None = None) -> LintReport:
        findings = [Finding.from_json(item) for item in body.get("findings", []) if isinstance(item, Mapping)]
        return cls(findings=findings, raw=dict(body), request_id=request_id)
