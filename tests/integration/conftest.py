"""Fixtures for tests with real processes on loopback (helpers: integration_support.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from integration_support import Server, find_tool, running_server


@pytest.fixture(scope="session")
def tool() -> Callable[[str], str]:
    return find_tool


@pytest.fixture(scope="session")
def live_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One server for the read-only checks, with JSON access logs on."""
    with running_server(tmp_path_factory.mktemp("live"), ROPESERVE_ACCESS_LOG="true") as server:
        yield server
