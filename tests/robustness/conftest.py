"""Real ropeserve servers on loopback for the robustness suite (``LocalServer``, as ``tests/client/conftest.py``).

``guarded_server``: default batching, an 8 MiB body cap (so streamed overflows stay cheap). ``queue_server``: a
two-slot rotation queue and a 1.5 s batch window for requests under 64 tokens, so overload and "client left while
queued" are deterministic.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from ropeserve_client.testing import LocalServer
from support import BATCH_MAX_TOKENS, BATCH_WINDOW_S, BODY_CAP_BYTES, ONE_THREAD, QUEUE_SIZE


@pytest.fixture(scope="session")
def guarded_server() -> Iterator[LocalServer]:
    with LocalServer(env={"ROPESERVE_MAX_BODY_BYTES": str(BODY_CAP_BYTES), **ONE_THREAD}) as server:
        yield server


@pytest.fixture(scope="session")
def queue_server() -> Iterator[LocalServer]:
    env = {
        "ROPESERVE_BATCH_QUEUE_SIZE": str(QUEUE_SIZE),
        "ROPESERVE_BATCH_MAX_WAIT_US": str(int(BATCH_WINDOW_S * 1e6)),
        "ROPESERVE_BATCH_MAX_TOKENS": str(BATCH_MAX_TOKENS),
        **ONE_THREAD,
    }
    with LocalServer(env=env) as server:
        yield server


@pytest.fixture()
def guarded(guarded_server: LocalServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=guarded_server.url, timeout=30.0) as client:
        yield client


@pytest.fixture()
def queued(queue_server: LocalServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=queue_server.url, timeout=30.0) as client:
        yield client
