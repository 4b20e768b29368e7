"""Positions outside 0..MAX_POSITION are a 422 problem naming ``positions`` over HTTP, for every int dtype; in
range but past the cached table's row cap they are rotated exactly (cos/sin computed per token)."""

from __future__ import annotations

import json

import httpx
import pytest
import torch
from fastapi.testclient import TestClient
from safetensors.torch import load, save

from ropeserve.api import create_app, routes_rotation
from ropeserve.config import from_explicit
from ropeserve.rope import apply_rotary, rope_cos_sin
from ropeserve.rope.tables import MAX_POSITION, TABLE_ROW_CAP
from ropeserve.settings import Settings

ROPE = {"rope_theta": 10_000.0, "head_dim": 16}


@pytest.fixture(scope="module")
def client() -> TestClient:
    app = create_app(Settings(access_log=False))
    routes_rotation.install(app)
    with TestClient(app) as test_client:
        yield test_client


def rotate(client: TestClient, q: torch.Tensor, positions: torch.Tensor) -> httpx.Response:
    """POST flat q [T, 2·16] and positions [T] to /v1/rope/apply."""
    content = save({"q": q, "positions": positions}, {"ropeserve": json.dumps({"rope": ROPE, "layout": "flat"})})
    return client.post("/v1/rope/apply", content=content, headers={"content-type": "application/x-safetensors"})


@pytest.mark.parametrize(
    "positions",
    [
        torch.tensor([0, -1, 2]),
        torch.tensor([0, MAX_POSITION + 1], dtype=torch.int64),
        torch.tensor([2**63 - 1, 0], dtype=torch.int64),
        torch.tensor([-(2**31), 3], dtype=torch.int32),
        torch.tensor([-1, 4], dtype=torch.int8),
    ],
    ids=["negative", "max+1", "int64-max", "int32-min", "int8-negative"],
)
def test_out_of_range_positions_are_422_naming_positions(client: TestClient, positions: torch.Tensor) -> None:
    response = rotate(client, torch.zeros(positions.numel(), 2 * 16), positions)
    assert response.status_code == 422, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    assert response.json()["field"] == "positions"


def test_positions_past_the_table_cap_rotate_exactly(client: TestClient) -> None:
    positions = torch.tensor([0, TABLE_ROW_CAP + 5, MAX_POSITION, 7])
    q = torch.randn(4, 2 * 16)
    response = rotate(client, q, positions)
    assert response.status_code == 200, response.text
    cs = rope_cos_sin(from_explicit(ROPE), positions, dtype=q.dtype, cache=None)
    expected, _ = apply_rotary(q, None, cs.cos, cs.sin, head_dim=16, layout="flat")
    assert torch.equal(load(response.content)["q"], expected)
