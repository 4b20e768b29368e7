"""The rule catalogue as a Markdown table (``ropeserve lint --list-rules``; embedded in docs/lint.md)."""

from __future__ import annotations

import ropeserve.lint.rules  # noqa: F401  (registers the rules)
from ropeserve.lint.findings import RULES

TABLE_HEADER = ("id", "name", "family", "severity", "catalogue", "checks", "reference")


def rule_table_markdown() -> str:
    """One row per registered rule, in id order."""
    lines = ["| " + " | ".join(TABLE_HEADER) + " |", "|" + "---|" * len(TABLE_HEADER)]
    for rule in sorted(RULES.values(), key=lambda r: r.id):
        cells = (
            f'<a id="{rule.id.lower()}"></a>{rule.id}',
            f"`{rule.name}`",
            rule.family,
            rule.severity.label,
            rule.catalogue or "",
            rule.summary.replace("|", "\\|"),
            rule.reference,
        )
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
