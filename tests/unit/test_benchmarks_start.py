"""Every benchmark script still starts: ``--help`` imports all it uses and parses its options (a function it
imported was renamed once, and only the next benchmark run found out). Lint timings are checked in
``bench_lint_request``'s own smallest run, since it empties the linter's caches by name."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
SCRIPTS = sorted(path.name for path in BENCHMARKS.glob("*.py"))


def run(script: str, *arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(BENCHMARKS / script), *arguments],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        check=False,
    )


@pytest.mark.parametrize("script", SCRIPTS)
def test_benchmark_starts(script: str) -> None:
    result = run(script, "--help")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "usage:" in result.stdout


def test_lint_request_benchmark_runs_cold_and_warm() -> None:
    result = run("bench_lint_request.py", "--repeats", "1", "--number", "10", "Qwen__Qwen2.5-7B-Instruct.json")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "Qwen__Qwen2.5-7B-Instruct.json" in result.stdout
