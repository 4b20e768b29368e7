"""Runs the Triton parity cases on CPU in a subprocess with ``TRITON_INTERPRET=1`` (see that file)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

CASES_FILE = Path(__file__).with_name("triton_interpreter_cases.py")


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")
def test_triton_kernel_matches_native_in_the_interpreter() -> None:
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    command = [sys.executable, "-m", "pytest", str(CASES_FILE), "-q", "-p", "no:cacheprovider", "-p", "no:randomly"]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=240, check=False)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
    assert " passed" in result.stdout and "skipped" not in result.stdout.splitlines()[-1]
