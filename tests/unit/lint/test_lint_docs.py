"""docs/lint.md lists every rule (generated table in sync) and the pre-commit hook is well formed."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from ropeserve.lint import RULES
from ropeserve.lint.catalogue import rule_table_markdown

ROOT = Path(__file__).resolve().parents[3]
BEGIN, END = "<!-- rules:begin -->", "<!-- rules:end -->"


def test_docs_rule_table_is_generated_from_the_registry() -> None:
    text = (ROOT / "docs" / "lint.md").read_text(encoding="utf-8")
    table = text[text.index(BEGIN) + len(BEGIN) : text.index(END)].strip()
    assert table == rule_table_markdown(), "regenerate: ropeserve lint --list-rules, paste between the markers"
    assert set(re.findall(r"\bRS\d{3}\b", table)) == set(RULES)


def test_docs_name_exit_codes_and_sarif_upload() -> None:
    text = (ROOT / "docs" / "lint.md").read_text(encoding="utf-8")
    assert "### Exit codes" in text and "upload-sarif" in text and "security-events: write" in text


def test_pre_commit_hook() -> None:
    hooks = yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text(encoding="utf-8"))
    hook = next(h for h in hooks if h["id"] == "ropeserve-lint")
    assert hook["entry"] == "ropeserve lint"
    pattern = re.compile(hook["files"])
    assert pattern.search("models/qwen/config.json") and pattern.search("config.json")
    assert not pattern.search("models/qwen/tokenizer_config.json") and not pattern.search("generation_config.json")
