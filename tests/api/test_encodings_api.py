"""``/v1/pe/*`` endpoints: results, content negotiation, limits and problem+json errors."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest
import torch
from fastapi.testclient import TestClient
from safetensors.torch import load, save
from transformers.models.t5.modeling_t5 import T5Attention
from transformers.models.vit_mae.modeling_vit_mae import build_2d_sinusoidal_position_embedding

from ropeserve.api.app import create_app
from ropeserve.encodings import alibi_bias, alibi_slopes, resample_table, sinusoidal_table
from ropeserve.settings import Settings

SAFETENSORS = "application/x-safetensors"
PROBLEM = "application/problem+json"


def make_client(**overrides: object) -> TestClient:
    return TestClient(create_app(Settings(access_log=False, **overrides)))  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    with make_client() as test_client:
        yield test_client


def assert_problem(response, status: int, field: str, slug: str = "invalid-input") -> dict:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith(PROBLEM)
    problem = response.json()
    assert problem["field"] == field or problem["field"].startswith((f"{field}.", f"{field}[")), problem
    assert problem["type"].endswith(slug), problem
    return problem


def safetensors_result(response) -> tuple[dict[str, torch.Tensor], dict]:
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == SAFETENSORS
    header_length = int.from_bytes(response.content[:8], "little")
    header = json.loads(response.content[8 : 8 + header_length])
    return load(response.content), json.loads(header["__metadata__"]["ropeserve"])


# --- sinusoidal ----------------------------------------------------------------------------------------------------


def test_sinusoidal_json(client: TestClient) -> None:
    response = client.post("/v1/pe/sinusoidal", json={"positions": [0, 3, 9], "dim": 6, "layout": "concat"})
    assert response.status_code == 200
    body = response.json()
    expected = sinusoidal_table(torch.tensor([0, 3, 9]), 6, layout="concat")
    torch.testing.assert_close(torch.tensor(body["table"], dtype=torch.float32), expected)
    assert body["count"] == 3 and body["layout"] == "concat" and body["schedule"] == "vaswani"


def test_sinusoidal_offset_continues_the_table(client: TestClient) -> None:
    request = {"positions": {"start": 0, "stop": 5}, "offset": 100, "dim": 8, "dtype": "bfloat16"}
    tensors, meta = safetensors_result(client.post("/v1/pe/sinusoidal", json=request, headers={"Accept": SAFETENSORS}))
    expected = sinusoidal_table(torch.arange(105), 8, dtype=torch.bfloat16)[100:]
    assert tensors["table"].dtype == torch.bfloat16 and torch.equal(tensors["table"], expected)
    assert meta["offset"] == 100 and meta["dtype"] == "bfloat16"


@pytest.mark.parametrize(
    ("request_body", "field"),
    [
        ({"positions": [0], "dim": 3, "schedule": "tensor2tensor"}, "dim"),
        ({"positions": [0], "dim": 0}, "dim"),
        ({"positions": [0], "dim": 4, "layout": "zigzag"}, "layout"),
        ({"positions": [0], "dim": 4, "offset": -1}, "offset"),
        ({"positions": [-1], "dim": 4}, "positions"),
        ({"positions": [2**70], "dim": 4}, "positions"),
        ({"positions": {"start": 2**70, "stop": 2**70 + 1}, "dim": 4}, "positions"),
        ({"positions": [0], "dim": 4, "offset": 2**41}, "offset"),
        ({"positions": [0], "dim": 4, "theta": 1.0}, "theta"),
    ],
)
def test_sinusoidal_invalid(client: TestClient, request_body: dict, field: str) -> None:
    assert_problem(client.post("/v1/pe/sinusoidal", json=request_body), 422, field)


def test_sinusoidal_limit_is_checked_before_building(client: TestClient) -> None:
    request = {"positions": {"stop": 1_000_000}, "dim": 100_000}
    assert_problem(client.post("/v1/pe/sinusoidal", json=request), 422, "positions", "limit-exceeded")


def test_large_json_results_need_safetensors(client: TestClient) -> None:
    request = {"positions": {"stop": 4096}, "dim": 64}
    assert_problem(client.post("/v1/pe/sinusoidal", json=request), 406, "accept", "not-acceptable")


# --- alibi ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("num_heads", [1, 12, 20, 96])
def test_alibi_slopes_only(client: TestClient, num_heads: int) -> None:
    body = client.post("/v1/pe/alibi", json={"num_heads": num_heads}).json()
    assert "bias" not in body
    assert torch.equal(torch.tensor(body["slopes"], dtype=torch.float32), alibi_slopes(num_heads))
    assert body["closest_power_of_two"] <= num_heads < 2 * body["closest_power_of_two"]


@pytest.mark.parametrize("mode", ["causal", "symmetric"])
def test_alibi_bias(client: TestClient, mode: str) -> None:
    request = {"num_heads": 6, "query_len": 2, "key_len": 7, "offset": 5, "mode": mode, "dtype": "float16"}
    tensors, meta = safetensors_result(client.post("/v1/pe/alibi", json=request, headers={"Accept": SAFETENSORS}))
    expected = alibi_bias(alibi_slopes(6), 2, 7, mode=mode, offset=5, dtype=torch.float16)  # type: ignore[arg-type]
    assert torch.equal(tensors["bias"], expected) and tensors["slopes"].dtype == torch.float32
    assert meta["mode"] == mode


@pytest.mark.parametrize(
    ("request_body", "field"),
    [
        ({"num_heads": 0}, "num_heads"),
        ({"num_heads": 4, "max_bias": 0}, "max_bias"),
        ({"num_heads": 4, "mode": "alibi"}, "mode"),
        ({"num_heads": 4, "query_len": 3}, "body"),
    ],
)
def test_alibi_invalid(client: TestClient, request_body: dict, field: str) -> None:
    assert_problem(client.post("/v1/pe/alibi", json=request_body), 422, field)


def test_alibi_bias_limit_is_checked_before_allocating(client: TestClient) -> None:
    started = time.perf_counter()
    request = {"num_heads": 64, "query_len": 1_000_000, "key_len": 1_000_000}
    assert_problem(client.post("/v1/pe/alibi", json=request), 422, "query_len", "limit-exceeded")
    assert time.perf_counter() - started < 2


def test_alibi_head_count_limit(client: TestClient) -> None:
    assert_problem(client.post("/v1/pe/alibi", json={"num_heads": 10**12}), 422, "num_heads", "limit-exceeded")


# --- relative ------------------------------------------------------------------------------------------------------


def test_relative_t5_buckets(client: TestClient) -> None:
    request = {"query_len": 5, "key_len": 200, "offset": 3, "bidirectional": False}
    body = client.post("/v1/pe/relative", json=request).json()
    relative = torch.arange(200)[None, :] - (torch.arange(5)[:, None] + 3)
    expected = T5Attention._relative_position_bucket(relative, bidirectional=False)
    assert body["relative_index"] == expected.tolist()
    assert body["table_rows"] == 32 and body["mode"] == "t5" and "clip" not in body


def test_relative_shaw_indices(client: TestClient) -> None:
    request = {"query_len": 3, "key_len": 4, "mode": "shaw", "clip": 1}
    tensors, meta = safetensors_result(client.post("/v1/pe/relative", json=request, headers={"Accept": SAFETENSORS}))
    assert tensors["relative_index"].dtype == torch.int64
    assert tensors["relative_index"].tolist() == [[1, 2, 2, 2], [0, 1, 2, 2], [0, 0, 1, 2]]
    assert meta["table_rows"] == 3 and meta["clip"] == 1 and "num_buckets" not in meta


@pytest.mark.parametrize(
    ("request_body", "field"),
    [
        ({"query_len": 2, "key_len": 2, "mode": "shaw"}, "clip"),
        ({"query_len": 2, "key_len": 2, "mode": "t5", "clip": 3}, "clip"),
        ({"query_len": 2, "key_len": 2, "mode": "shaw", "clip": 3, "num_buckets": 8}, "num_buckets"),
        ({"query_len": 2, "key_len": 2, "mode": "rotary"}, "mode"),
        ({"query_len": 2, "key_len": 2, "num_buckets": 2}, "num_buckets"),
        ({"query_len": 2, "key_len": 2, "max_distance": 8}, "max_distance"),
        ({"query_len": 0, "key_len": 2}, "query_len"),
        ({"query_len": 2, "key_len": 2, "mode": "shaw", "clip": 2**63 - 1}, "clip"),
        ({"query_len": 2, "key_len": 2, "mode": "shaw", "clip": 2**62}, "clip"),
    ],
)
def test_relative_invalid(client: TestClient, request_body: dict, field: str) -> None:
    assert_problem(client.post("/v1/pe/relative", json=request_body), 422, field)


def test_relative_limit_is_checked_before_allocating(client: TestClient) -> None:
    request = {"query_len": 10_000_000, "key_len": 10_000_000, "mode": "shaw", "clip": 4}
    assert_problem(client.post("/v1/pe/relative", json=request), 422, "query_len", "limit-exceeded")


# --- sincos-2d -----------------------------------------------------------------------------------------------------


def test_sincos_2d(client: TestClient) -> None:
    request = {"grid_h": 3, "grid_w": 5, "dim": 16, "cls_token": True}
    tensors, meta = safetensors_result(client.post("/v1/pe/sincos-2d", json=request, headers={"Accept": SAFETENSORS}))
    assert torch.equal(tensors["table"], build_2d_sinusoidal_position_embedding(3, 5, 16, cls_token=True))
    assert meta["first_axis"] == "h"


def test_sincos_2d_width_first(client: TestClient) -> None:
    height_first = client.post("/v1/pe/sincos-2d", json={"grid_h": 2, "grid_w": 3, "dim": 8}).json()["table"]
    request = {"grid_h": 2, "grid_w": 3, "dim": 8, "first_axis": "w"}
    width_first = client.post("/v1/pe/sincos-2d", json=request).json()["table"]
    assert [row[4:] + row[:4] for row in height_first] == width_first


@pytest.mark.parametrize(
    ("request_body", "field", "slug"),
    [
        ({"grid_h": 2, "grid_w": 2, "dim": 6}, "dim", "invalid-input"),
        ({"grid_h": 2, "grid_w": 2, "dim": 2}, "dim", "invalid-input"),
        ({"grid_h": 0, "grid_w": 2, "dim": 8}, "grid_h", "invalid-input"),
        ({"grid_h": 2, "grid_w": 2, "dim": 8, "first_axis": "d"}, "first_axis", "invalid-input"),
        ({"grid_h": 100_000, "grid_w": 100_000, "dim": 8}, "grid_h", "limit-exceeded"),
        ({"grid_h": 1000, "grid_w": 1000, "dim": 1024}, "dim", "limit-exceeded"),
    ],
)
def test_sincos_2d_invalid(client: TestClient, request_body: dict, field: str, slug: str) -> None:
    assert_problem(client.post("/v1/pe/sincos-2d", json=request_body), 422, field, slug)


# --- resample ------------------------------------------------------------------------------------------------------


def resample_body(table: torch.Tensor, params: dict | str | None, **extra: torch.Tensor) -> bytes:
    metadata = None if params is None else {"ropeserve": params if isinstance(params, str) else json.dumps(params)}
    return save({"table": table, **extra}, metadata=metadata)


def post_resample(client: TestClient, body: bytes, accept: str = "*/*", content_type: str = SAFETENSORS):
    return client.post("/v1/pe/resample", content=body, headers={"Content-Type": content_type, "Accept": accept})


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("batched", [False, True])
def test_resample_vit_table(client: TestClient, dtype: torch.dtype, batched: bool) -> None:
    table = torch.randn(1 + 4 * 6, 8).to(dtype)
    table = table[None] if batched else table
    params = {"source_grid": [4, 6], "target_grid": [7, 3], "prefix_rows": 1, "antialias": True}
    tensors, meta = safetensors_result(post_resample(client, resample_body(table, params)))
    expected = resample_table(table, [4, 6], [7, 3], prefix_rows=1, antialias=True)
    assert tensors["table"].dtype == dtype and torch.equal(tensors["table"], expected)
    assert meta["shape"] == list(expected.shape) and meta["dtype"] == str(dtype).removeprefix("torch.")


def test_resample_one_dimensional_table_as_json(client: TestClient) -> None:
    table = torch.randn(16, 4)
    response = post_resample(
        client, resample_body(table, {"source_grid": [16], "target_grid": [24]}), "application/json"
    )
    assert response.status_code == 200 and response.headers["content-type"] == "application/json"
    expected = resample_table(table, [16], [24])
    torch.testing.assert_close(torch.tensor(response.json()["table"], dtype=torch.float32), expected)


@pytest.mark.parametrize(
    ("table", "params", "field"),
    [
        (torch.randn(17, 4), {"source_grid": [4, 4], "target_grid": [2, 2]}, "table"),
        (torch.full((16, 4), float("nan")), {"source_grid": [4, 4], "target_grid": [2, 2]}, "table"),
        (torch.randn(16, 4), {"source_grid": [4, 4], "target_grid": [2, 2], "mode": "lanczos"}, "mode"),
        (
            torch.randn(16, 4),
            {"source_grid": [4, 4], "target_grid": [2, 2], "mode": "nearest", "antialias": True},
            "antialias",
        ),
        (torch.randn(16, 4), {"source_grid": [4, 4], "target_grid": [2, 2], "scale": 2}, "scale"),
        (torch.randn(16, 4), {"source_grid": [4, 4, 1], "target_grid": [2, 2]}, "source_grid"),
        (torch.randn(16, 4), {"source_grid": [4, 4], "target_grid": [16]}, "target_grid"),
        (torch.randn(16, 4), {"source_grid": [4, 4]}, "target_grid"),
        (torch.randn(16, 4), None, "__metadata__.ropeserve"),
        (torch.ones(16, 4, dtype=torch.int64), {"source_grid": [4, 4], "target_grid": [2, 2]}, "table"),
    ],
)
def test_resample_invalid(client: TestClient, table: torch.Tensor, params: dict | None, field: str) -> None:
    assert_problem(post_resample(client, resample_body(table, params)), 422, field)


def test_resample_refuses_other_tensors(client: TestClient) -> None:
    body = resample_body(torch.randn(4, 2), {"source_grid": [4], "target_grid": [8]}, extra=torch.zeros(1))
    assert_problem(post_resample(client, body), 422, "extra")


def test_resample_result_limit_is_checked_before_interpolating(client: TestClient) -> None:
    body = resample_body(torch.randn(16, 4), {"source_grid": [4, 4], "target_grid": [100_000, 100_000]})
    assert_problem(post_resample(client, body), 422, "target_grid", "limit-exceeded")


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (b"not safetensors", "body"),
        (b"\xff" * 8 + b"{}", "body"),
        (resample_body(torch.randn(4, 2), None)[:-3], "table"),  # truncated: the tensor whose bytes are missing
    ],
)
def test_resample_malformed_body(client: TestClient, body: bytes, field: str) -> None:
    assert_problem(post_resample(client, body), 400, field, "malformed-payload")


def test_resample_malformed_parameters(client: TestClient) -> None:
    body = resample_body(torch.randn(4, 2), "{not json")
    assert_problem(post_resample(client, body), 400, "__metadata__.ropeserve", "malformed-payload")


def test_resample_needs_safetensors_content_type(client: TestClient) -> None:
    body = resample_body(torch.randn(4, 2), {"source_grid": [4], "target_grid": [8]})
    assert_problem(
        post_resample(client, body, content_type="application/json"), 415, "content-type", "unsupported-media-type"
    )


def test_resample_input_limits() -> None:
    with make_client(max_body_bytes=4096, max_tensor_elements=100) as limited:
        small = resample_body(torch.randn(16, 8), {"source_grid": [4, 4], "target_grid": [2, 2]})
        assert_problem(post_resample(limited, small), 422, "table", "limit-exceeded")
        large = resample_body(torch.randn(1024, 8), {"source_grid": [1024], "target_grid": [2]})
        assert_problem(post_resample(limited, large), 413, "body", "payload-too-large")


def test_openapi_declares_the_routes(client: TestClient) -> None:
    paths = client.get("/openapi.json").json()["paths"]
    for route in ["sinusoidal", "alibi", "relative", "sincos-2d", "resample"]:
        operation = paths[f"/v1/pe/{route}"]["post"]
        assert {"200", "413", "422"} <= set(operation["responses"]), route
    resample = paths["/v1/pe/resample"]["post"]
    assert SAFETENSORS in resample["requestBody"]["content"]
    assert {"400", "415"} <= set(resample["responses"])
