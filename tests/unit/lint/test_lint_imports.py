"""The lint path must not import torch, numpy or fastapi (it runs in pre-commit hooks and CI)."""

from __future__ import annotations

import subprocess
import sys

from lint_helpers import CONFIGS

HEAVY = ("torch", "numpy", "fastapi", "pydantic", "matplotlib")


def _loaded_modules(code: str) -> set[str]:
    probe = f"{code}\nimport sys\nprint(' '.join(sorted(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True)
    return set(result.stdout.split()[-1000:]) | set(result.stdout.split())


def test_import_lint_is_light() -> None:
    loaded = _loaded_modules("import ropeserve.lint")
    assert not {name for name in loaded if name.split(".")[0] in HEAVY}


def test_cli_lint_run_is_light() -> None:
    config = CONFIGS / "Qwen__Qwen3-VL-8B-Instruct.json"
    code = (
        "import contextlib, io\nfrom ropeserve.cli import main\n"
        f"with contextlib.redirect_stdout(io.StringIO()):\n    main(['lint', {str(config)!r}, '--format', 'sarif'])\n"
        f"    main(['explain', {str(config)!r}])"
    )
    loaded = _loaded_modules(code)
    assert not {name for name in loaded if name.split(".")[0] in HEAVY}
