"""A corpus of malformed safetensors bodies against the real server's tensor endpoints: each answers a 4xx
problem+json, and the server stays healthy afterwards."""

from __future__ import annotations

import math
from collections.abc import Callable

import httpx
import pytest
import torch
from safetensors.torch import load

from support import (
    RESAMPLE,
    ROPE_APPLY,
    SAFETENSORS,
    TENSOR_ENDPOINTS,
    VALID_BODIES,
    assert_healthy,
    assert_problem,
    raw_safetensors,
    resample_body,
    rope_body,
    server_5xx,
    with_params,
)

PARAMS = with_params({"rope": {"rope_theta": 10_000.0, "head_dim": 16}, "source_grid": [2], "target_grid": [3]})


def tensor(dtype: str, shape: list[int], begin: int, end: int) -> dict[str, object]:
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


def one_tensor(name: str, entry: dict[str, object], data: bytes) -> bytes:
    return raw_safetensors(PARAMS | {name: entry}, data)


CORPUS: dict[str, Callable[[str, bytes], bytes]] = {
    "empty": lambda name, valid: b"",
    "shorter than the length prefix": lambda name, valid: b"\x01\x02\x03",
    "truncated in the data": lambda name, valid: valid[: len(valid) - 5],
    "truncated in the header": lambda name, valid: valid[:20],
    "header length beyond the body": lambda name, valid: raw_safetensors(PARAMS, claimed_length=10_000),
    "absurd header length": lambda name, valid: raw_safetensors(PARAMS, claimed_length=2**63 + 7),
    "header not JSON": lambda name, valid: raw_safetensors(b"{not json"),
    "header not UTF-8": lambda name, valid: raw_safetensors(b'{"\xff\xfe": 1}'),
    "header a JSON list": lambda name, valid: raw_safetensors(b"[1, 2, 3]"),
    "overlapping offsets": lambda name, valid: raw_safetensors(
        PARAMS | {name: tensor("F32", [4], 0, 16), "positions": tensor("I64", [2], 8, 24)}, bytes(24)
    ),
    "offsets beyond the data": lambda name, valid: one_tensor(name, tensor("F32", [2**28], 0, 2**30), bytes(16)),
    "offsets reversed": lambda name, valid: one_tensor(name, tensor("F32", [4], 16, 0), bytes(16)),
    "negative offset": lambda name, valid: one_tensor(name, tensor("F32", [4], -16, 0), bytes(16)),
    "gap before the tensor": lambda name, valid: one_tensor(name, tensor("F32", [4], 8, 24), bytes(24)),
    "trailing bytes": lambda name, valid: one_tensor(name, tensor("F32", [4], 0, 16), bytes(20)),
    "unknown dtype": lambda name, valid: one_tensor(name, tensor("F128", [4], 0, 64), bytes(64)),
    "dtype outside the allow-list": lambda name, valid: one_tensor(name, tensor("U8", [4], 0, 4), bytes(4)),
    "shape and offsets disagree": lambda name, valid: one_tensor(name, tensor("F32", [2, 3], 0, 16), bytes(16)),
    "negative dimension": lambda name, valid: one_tensor(name, tensor("F32", [-4], 0, 16), bytes(16)),
    "shape not a list": lambda name, valid: one_tensor(name, tensor("F32", "4", 0, 16), bytes(16)),  # type: ignore[arg-type]
    "element count overflows": lambda name, valid: one_tensor(name, tensor("F32", [2**62, 2**62], 0, 0), b""),
    "entry with extra keys": lambda name, valid: one_tensor(name, tensor("F32", [4], 0, 16) | {"x": 1}, bytes(16)),
    "zero-size tensor": lambda name, valid: one_tensor(name, tensor("F32", [0, 16], 0, 0), b""),
    "zero-size tensors only": lambda name, valid: raw_safetensors(
        PARAMS | {name: tensor("F32", [1, 1, 0, 16], 0, 0), "positions": tensor("I64", [0], 0, 0)}
    ),
    "duplicate names": lambda name, valid: raw_safetensors(
        b'{"%s": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, '
        b'"%s": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}' % (name.encode(), name.encode()),
        bytes(8),
    ),
    "metadata a list": lambda name, valid: raw_safetensors(
        {"__metadata__": [1, 2], name: tensor("F32", [4], 0, 16)}, bytes(16)
    ),
    "metadata values not strings": lambda name, valid: raw_safetensors(
        {"__metadata__": {"ropeserve": {"rope": 1}}, name: tensor("F32", [4], 0, 16)}, bytes(16)
    ),
    "parameters not JSON": lambda name, valid: raw_safetensors(
        {"__metadata__": {"ropeserve": "{"}, name: tensor("F32", [4], 0, 16)}, bytes(16)
    ),
    "parameters missing": lambda name, valid: raw_safetensors({name: tensor("F32", [4], 0, 16)}, bytes(16)),
    "required tensor missing": lambda name, valid: raw_safetensors(
        PARAMS | {"other": tensor("F32", [1], 0, 4)}, bytes(4)
    ),
    "random bytes": lambda name, valid: bytes(range(256)) * 4,
}


ENDPOINT_TENSOR = {ROPE_APPLY: "q", "/v1/mrope/apply": "q", RESAMPLE: "table"}


@pytest.mark.parametrize("case", sorted(CORPUS))
@pytest.mark.parametrize("endpoint", TENSOR_ENDPOINTS)
def test_malformed_body_is_a_client_error(guarded: httpx.Client, endpoint: str, case: str) -> None:
    body = CORPUS[case](ENDPOINT_TENSOR[endpoint], VALID_BODIES[endpoint]())
    response = guarded.post(endpoint, content=body, headers=SAFETENSORS)
    assert_problem(response)


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_non_finite_resample_table_is_refused(guarded: httpx.Client, value: float) -> None:
    table = torch.randn(5, 8)
    table[2, 3] = value
    response = guarded.post(RESAMPLE, content=resample_body(table), headers=SAFETENSORS)
    assert assert_problem(response, {422})["field"] == "table"


def test_nan_in_q_propagates_within_its_rotation_pair(guarded: httpx.Client) -> None:
    """Policy: q/k are not scanned; NaN follows IEEE arithmetic and stays inside its (i, i + d/2) NeoX pair."""
    q = torch.randn(1, 2, 4, 16)
    q[0, 1, 2, 3] = math.nan
    response = guarded.post(ROPE_APPLY, content=rope_body(q=q), headers=SAFETENSORS)
    assert response.status_code == 200, response.text
    rotated = load(response.content)["q"]
    expected_nan = torch.zeros_like(q, dtype=torch.bool)
    expected_nan[0, 1, 2, [3, 3 + 8]] = True
    assert torch.equal(rotated.isnan(), expected_nan)


def test_server_is_healthy_after_the_corpus(guarded: httpx.Client) -> None:
    for endpoint in TENSOR_ENDPOINTS:
        assert guarded.post(endpoint, content=VALID_BODIES[endpoint](), headers=SAFETENSORS).status_code == 200
    assert_healthy(guarded)
    assert server_5xx(guarded) == 0
