"""A short soak in the default run (the 10-minute one is ``loadtest/soak.py --minutes 10``, outside it)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SOAK = Path(__file__).resolve().parents[2] / "loadtest" / "soak.py"
SHORT_SOAK_S = 25
MAX_RSS_GROWTH_MB = 50


def test_short_soak_has_no_failures_and_bounded_rss(tmp_path: Path) -> None:
    command = [sys.executable, str(SOAK), "--seconds", str(SHORT_SOAK_S), "--users", "4", "--out", str(tmp_path)]
    completed = subprocess.run(command, capture_output=True, text=True, timeout=SHORT_SOAK_S + 150)
    summary = json.loads((tmp_path / "soak.json").read_text())
    assert summary["requests"] > 0 and summary["failures"] == 0, completed.stdout + completed.stderr
    assert summary["rss"]["growth_mb"] <= MAX_RSS_GROWTH_MB, summary["rss"]
    assert completed.returncode == 0, completed.stdout + completed.stderr
