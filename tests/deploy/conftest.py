"""Fixtures for the deployment-file checks (helpers: deploy_tools.py)."""

from __future__ import annotations

import subprocess
from collections.abc import Callable

import pytest
from deploy_tools import run_tool


@pytest.fixture(scope="session")
def tool() -> Callable[..., subprocess.CompletedProcess[str]]:
    return run_tool
