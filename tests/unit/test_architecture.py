"""Architecture rules that CI enforces: the import-linter contracts of pyproject.toml, and tests that reach their
helpers through pytest's ``pythonpath`` rather than by editing ``sys.path`` or importing a conftest."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FORBIDDEN_IN_TESTS = re.compile(r"sys\.path\.(insert|append|extend)|^\s*from conftest import|^\s*import conftest", re.M)


def test_import_contracts_hold() -> None:
    lint_imports = Path(sys.executable).parent / "lint-imports"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "service")}
    command = [str(lint_imports), "--config", str(ROOT / "pyproject.toml"), "--no-cache"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=240, cwd=ROOT, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count(" KEPT") == 3, result.stdout


def test_tests_neither_edit_sys_path_nor_import_a_conftest() -> None:
    offenders = [
        str(path.relative_to(ROOT))
        for path in (ROOT / "tests").rglob("*.py")
        if path != Path(__file__).resolve() and FORBIDDEN_IN_TESTS.search(path.read_text(encoding="utf-8"))
    ]
    assert not offenders, offenders
