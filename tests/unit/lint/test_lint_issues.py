"""Known-bad variants derived from real user issues (engines-and-config-lint.md §4) produce the expected rules."""

from __future__ import annotations

import json

import pytest
from lint_helpers import LINT_FIXTURES, build_config, lint, rule_ids

ISSUES = sorted((LINT_FIXTURES / "issues").glob("*.json"))


@pytest.mark.parametrize("path", ISSUES, ids=[p.stem for p in ISSUES])
def test_issue_variant(path) -> None:
    case = json.loads(path.read_text(encoding="utf-8"))
    draft = build_config(case["draft"]) if "draft" in case else None
    report = lint(build_config(case), case["intent"], draft_config=draft)
    fired = rule_ids(report)
    assert set(case["expect"]) <= fired, report.to_text()
    assert not set(case.get("absent", ())) & fired, report.to_text()
    engines = {length.engine: length.as_dict() for length in report.engines}
    for engine, expected in case.get("engines", {}).items():
        for key, value in expected.items():
            assert engines[engine][key] == value, (engine, key)


def test_issue_fixtures_cite_their_source() -> None:
    assert len(ISSUES) >= 15
    for path in ISSUES:
        case = json.loads(path.read_text(encoding="utf-8"))
        assert case["issue"].startswith("https://github.com/"), path.name
        assert case["expect"], path.name
