"""Fixtures for tests that talk to ropeserve over HTTP: a real ropeserve server on loopback.

``ropeserve_url`` starts ``uvicorn ropeserve.api:create_app --factory`` on 127.0.0.1 (a free port) once per test
session, waits for ``/health/ready`` and yields its URL; other suites may import the fixture from here.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ropeserve_client.testing import LocalServer


@pytest.fixture(scope="session")
def ropeserve_server() -> Iterator[LocalServer]:
    with LocalServer(startup_timeout=60.0) as server:
        yield server


@pytest.fixture(scope="session")
def ropeserve_url(ropeserve_server: LocalServer) -> str:
    return ropeserve_server.url
