"""``mypy --strict`` is clean on the whole ``ropeserve`` package: the model knowledge (config, rope, lint),
encodings, positions, kernels, serving, api and the top-level modules (settings, errors, metrics, logs, the CLI)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mypy", reason="mypy is not installed (it is in the test extra)")

SERVICE = Path(__file__).resolve().parents[2] / "service"


def test_mypy_strict_is_clean(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "mypy", "--strict", "--cache-dir", str(tmp_path), str(SERVICE / "ropeserve")]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False, cwd=SERVICE)
    assert result.returncode == 0, result.stdout + result.stderr
