"""Work sized by a request's numbers, not its byte count, stays off the event loop: the cos/sin table a few far
positions make ropeserve build, and the encoding of a large resampled table. Each spy records whether it ran in the
event loop's thread (a running asyncio loop there)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from fastapi.testclient import TestClient
from safetensors.torch import load, save

from ropeserve.api import create_app, negotiation
from ropeserve.api.inline import INLINE_BUILD_ELEMENTS
from ropeserve.rope.tables import RopeTable
from ropeserve.settings import Settings


def on_event_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def spy(record: list[tuple[bool, int]], size: Callable[..., int], wrapped: Callable[..., Any]) -> Callable[..., Any]:
    def recording(*args: Any, **kwargs: Any) -> Any:
        record.append((on_event_loop(), size(*args, **kwargs)))
        return wrapped(*args, **kwargs)

    return recording


@pytest.fixture()
def client() -> Iterator[TestClient]:
    """A fresh app per test: its table cache starts empty (every lookup a miss)."""
    with TestClient(create_app(Settings(access_log=False))) as test_client:
        yield test_client


@pytest.fixture()
def builds(monkeypatch: pytest.MonkeyPatch) -> list[tuple[bool, int]]:
    """(on the event loop, positions) of every cos/sin row computation."""
    record: list[tuple[bool, int]] = []
    compute = spy(record, lambda table, positions: positions.numel(), RopeTable.compute_half)
    monkeypatch.setattr(RopeTable, "compute_half", compute)
    return record


def cos_sin(client: TestClient, positions: list[int], theta: float) -> dict[str, Any]:
    response = client.post(
        "/v1/rope/cos-sin", json={"rope": {"rope_theta": theta, "head_dim": 64}, "positions": positions}
    )
    assert response.status_code == 200, response.text
    return response.json()


def test_a_far_position_builds_its_table_in_the_threadpool(client: TestClient, builds: list) -> None:
    answer = cos_sin(client, [0, 100_000], theta=10_000.0)  # 2 positions; the cached table grows to 2**17 rows
    assert builds and not any(on_loop for on_loop, _ in builds), builds
    assert 2 * max(rows for _, rows in builds) * 32 > INLINE_BUILD_ELEMENTS
    assert len(answer["cos"]) == 2


def test_a_cached_table_or_a_small_build_is_answered_on_the_event_loop(client: TestClient, builds: list) -> None:
    """No needless thread hop: 16 near positions build 2 * 16 * 32 elements; a repeat finds them cached."""
    first = cos_sin(client, list(range(16)), theta=20_000.0)
    assert builds and all(on_loop for on_loop, _ in builds), builds
    assert cos_sin(client, list(range(16)), theta=20_000.0) == first


def test_a_large_resampled_table_is_encoded_off_the_event_loop(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    encodes: list[tuple[bool, int]] = []
    elements = spy(
        encodes, lambda tensors, metadata: sum(t.numel() for t in tensors.values()), negotiation.encode_safetensors
    )
    monkeypatch.setattr(negotiation, "encode_safetensors", elements)
    params = {"source_grid": [4, 4], "target_grid": [64, 64], "prefix_rows": 1}
    body = save({"table": torch.randn(17, 64)}, metadata={"ropeserve": json.dumps(params)})
    response = client.post("/v1/pe/resample", content=body, headers={"content-type": "application/x-safetensors"})
    assert response.status_code == 200, response.text
    assert load(response.content)["table"].shape == (1 + 64 * 64, 64)
    assert encodes == [(False, (1 + 64 * 64) * 64)]
