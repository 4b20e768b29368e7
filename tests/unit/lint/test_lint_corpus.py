"""The real-config corpus lints clean: benchmarks/lint_corpus.py (the precision/recall figures of docs/lint.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_corpus_has_no_error_without_flags_and_no_false_or_unjudged_finding() -> None:
    command = [sys.executable, str(ROOT / "benchmarks" / "lint_corpus.py"), "--json"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, check=True)
    figures = json.loads(result.stdout)
    precision, recall = figures["precision"], figures["recall"]
    assert precision["configs"] >= 60
    assert precision["errors_without_flags"] == 0, precision["findings"]
    assert precision["counts"]["false"] == 0 and precision["counts"]["unjudged"] == 0, precision["findings"]
    assert recall["caught"] == recall["variants"] >= 15, recall["rows"]
