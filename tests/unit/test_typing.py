"""``mypy --strict`` is clean on the packages that hold the model knowledge (config, rope, lint), on encodings
and on the top-level modules (settings, errors, metrics, logs, the CLI). api, serving, kernels and positions
are not yet."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mypy", reason="mypy is not installed (it is in the test extra)")

SERVICE = Path(__file__).resolve().parents[2] / "service"
STRICT_PACKAGES = ("config", "rope", "lint", "encodings")


def test_mypy_strict_is_clean(tmp_path: Path) -> None:
    package_root = SERVICE / "ropeserve"
    paths = [str(package_root / package) for package in STRICT_PACKAGES] + [str(p) for p in package_root.glob("*.py")]
    command = [sys.executable, "-m", "mypy", "--strict", "--cache-dir", str(tmp_path), *paths]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False, cwd=SERVICE)
    assert result.returncode == 0, result.stdout + result.stderr
