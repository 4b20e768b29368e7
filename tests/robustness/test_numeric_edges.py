"""Numeric edge cases through the API: clear 4xx naming the field, or a documented defined answer."""

from __future__ import annotations

import math
from typing import Any

import httpx
import pytest
import torch
from safetensors.torch import load

from support import ROPE, ROPE_APPLY, SAFETENSORS, assert_problem, rope_body

COS_SIN = "/v1/rope/cos-sin"
LLAMA = "llama-3.1-8b"


def cos_sin(client: httpx.Client, rope: dict[str, Any], positions: list[int]) -> httpx.Response:
    return client.post(COS_SIN, json={"rope": rope, "positions": positions})


@pytest.mark.parametrize(
    ("rope", "positions", "field"),
    [
        (ROPE, [-1], "positions"),
        (ROPE | {"rope_theta": 0.0}, [1], "rope_theta"),
        (ROPE | {"rope_theta": -10.0}, [1], "rope_theta"),
        (ROPE | {"head_dim": 15}, [1], "head_dim"),
        (ROPE | {"rope_type": "linear", "factor": "NaN"}, [1], "factor"),
        (ROPE | {"rope_type": "linear", "factor": "Infinity"}, [1], "factor"),
    ],
    ids=["negative position", "theta zero", "theta negative", "odd head_dim", "NaN factor", "infinite factor"],
)
def test_json_edge_case_is_refused_with_its_field(
    guarded: httpx.Client, rope: dict[str, Any], positions: list[int], field: str
) -> None:
    document = assert_problem(cos_sin(guarded, rope, positions), {422})
    assert field in document.get("field", ""), document


def test_positions_beyond_max_position_embeddings_are_defined(guarded: httpx.Client) -> None:
    """Policy: max_position_embeddings is no hard limit; cos/sin are defined (finite, |·| ≤ 1) beyond it."""
    response = guarded.post(COS_SIN, json={"preset": LLAMA, "positions": [131_072 * 4]})
    assert response.status_code == 200, response.text
    values = response.json()["cos"][0] + response.json()["sin"][0]
    assert all(math.isfinite(value) and abs(value) <= 1 for value in values)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (lambda: rope_body(rotary_dim=ROPE["head_dim"] + 2), "rotary_dim"),
        (lambda: rope_body(rotary_dim=0), "rotary_dim"),
        (lambda: rope_body(rope=ROPE | {"rope_theta": -1.0}), "rope_theta"),
        (lambda: rope_body(rope=ROPE | {"head_dim": 15}), "head_dim"),
        (lambda: rope_body(q=torch.randn(1, 2, 4, 17)), "q"),
    ],
    ids=["rotary_dim above head_dim", "rotary_dim zero", "theta negative", "odd head_dim", "q width not head_dim"],
)
def test_rotation_edge_case_is_refused_with_its_field(guarded: httpx.Client, body: Any, field: str) -> None:
    document = assert_problem(guarded.post(ROPE_APPLY, content=body(), headers=SAFETENSORS), {422})
    assert field in document.get("field", ""), document


def test_negative_rotation_positions_are_refused(guarded: httpx.Client) -> None:
    body = rope_body(tokens=2, positions=torch.tensor([0, -3]))
    assert assert_problem(guarded.post(ROPE_APPLY, content=body, headers=SAFETENSORS), {422})["field"] == "positions"


@pytest.mark.parametrize("layout", ["bhtd", "flat"])
def test_rotation_of_zero_heads_is_an_empty_answer(guarded: httpx.Client, layout: str) -> None:
    """q with no heads (a 500 in the torch-ops and C kernels until found here) is a valid, empty rotation."""
    q = torch.randn(1, 0, 3, ROPE["head_dim"]) if layout == "bhtd" else torch.randn(3, 0)
    body = rope_body(q=q, positions=torch.arange(3), layout=layout)
    response = guarded.post(ROPE_APPLY, content=body, headers=SAFETENSORS)
    assert response.status_code == 200, response.text
    assert load(response.content)["q"].shape == q.shape
