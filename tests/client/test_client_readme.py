"""The Python examples of clients/python/README.md run against a live server (and print what they claim)."""

from __future__ import annotations

import contextlib
import io
import re
import tomllib
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "clients" / "python" / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def claimed_output(code: str) -> list[str]:
    """The ``# expected`` comments of print lines, in order."""
    return [line.split("#", 1)[1].strip() for line in code.splitlines() if "print(" in line and "#" in line]


@pytest.mark.parametrize("code", BLOCKS, ids=[f"block{i}" for i in range(len(BLOCKS))])
def test_readme_example_runs(code: str, ropeserve_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROPESERVE_URL", ropeserve_url)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(code.replace("http://127.0.0.1:8000", ropeserve_url), str(README), "exec"), {})
    for claim, line in zip(claimed_output(code), printed.getvalue().splitlines(), strict=False):
        pattern = ".*".join(re.escape(part) for part in claim.split("..."))  # "..." stands for any text
        assert re.fullmatch(pattern, " ".join(line.split())), (claim, line)


def test_torch_extra_is_documented_with_the_cpu_only_install() -> None:
    repo = README.parents[2]
    extras = tomllib.loads((README.parent / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(requirement.startswith("torch") for requirement in extras["torch"])
    cpu_index = re.search(r"--index-url (https://\S+/whl/cpu)", (repo / "scripts/bootstrap").read_text()).group(1)
    text = README.read_text()
    assert f"pip install torch --index-url {cpu_index}" in text and "pip install 'ropeserve-client[torch]'" in text
