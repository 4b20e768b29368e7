"""``/v1/rope/apply-table`` (rotation with the caller's cos/sin table, and its difference from ropeserve's) against a
port of vLLM's RotaryEmbedding (tests/support/engine_oracles.py), and ``/v1/vision/apply`` against transformers'
``apply_rotary_pos_emb_vision``."""

from __future__ import annotations

import json

import pytest
import torch
from engine_oracles import vllm_rotary_cos_sin_cache, vllm_rotary_forward_native
from fastapi.testclient import TestClient
from safetensors.torch import load, save
from transformers.models.qwen2_vl.modeling_qwen2_vl import apply_rotary_pos_emb_vision

from ropeserve.api import create_app
from ropeserve.settings import Settings

ROPE = {"rope_type": "default", "rope_theta": 10000.0, "head_dim": 64, "partial_rotary_factor": 0.5}
HEADS, KV_HEADS, HEAD, ROTARY, TOKENS, ROWS = 4, 2, 64, 32, 24, 512


@pytest.fixture(scope="module")
def client() -> TestClient:
    with TestClient(create_app(Settings(access_log=False))) as test_client:
        yield test_client


def call(client: TestClient, path: str, tensors: dict, params: dict, status: int = 200) -> tuple[dict, dict]:
    body = save(tensors, metadata={"ropeserve": json.dumps(params)})
    response = client.post(path, content=body, headers={"content-type": "application/x-safetensors"})
    assert response.status_code == status, response.text
    if status != 200:
        return response.json(), {}
    header = json.loads(response.content[8 : 8 + int.from_bytes(response.content[:8], "little")])
    return load(response.content), json.loads(header["__metadata__"]["ropeserve"])


def _inputs(dtype: torch.dtype) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(7)
    return {
        "q": torch.randn(TOKENS, HEADS * HEAD, generator=generator).to(dtype),
        "k": torch.randn(TOKENS, KV_HEADS * HEAD, generator=generator).to(dtype),
        "positions": torch.randint(0, ROWS, (TOKENS,), generator=generator),
    }


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_rotation_with_a_vllm_cache_equals_vllm_forward_native(client: TestClient, dtype: torch.dtype) -> None:
    cache = vllm_rotary_cos_sin_cache(ROTARY, ROWS, 10000.0).to(dtype)  # vLLM casts its cache to the model dtype
    tensors = {**_inputs(dtype), "cos_sin_cache": cache}
    out, meta = call(client, "/v1/rope/apply-table", tensors, {"rope": ROPE, "layout": "flat"})
    q, k = vllm_rotary_forward_native(
        tensors["positions"], tensors["q"], tensors["k"], cache, head_size=HEAD, rotary_dim=ROTARY, neox=True
    )
    assert torch.equal(out["q"], q) and torch.equal(out["k"], k)
    table = meta["table"]
    if dtype == torch.float32:  # vLLM's float32 cache is ropeserve's table bit for bit
        assert table["max_abs_error"] == 0.0 and table["first_differing_position"] is None
    else:
        assert 0 < table["max_abs_error"] <= 2.0**-8 and table["first_differing_position"] is not None
    assert table["rows"] == ROWS and table["non_finite"] is False


def test_first_differing_position_finds_a_corrupted_row(client: TestClient) -> None:
    cache = vllm_rotary_cos_sin_cache(ROTARY, ROWS, 10000.0)
    cache[37, 3] += 1e-3
    cache[300, 0] = float("nan")
    _, meta = call(client, "/v1/rope/apply-table", {**_inputs(torch.float32), "cos_sin_cache": cache}, {"rope": ROPE})
    assert meta["table"]["first_differing_position"] == 37
    assert meta["table"]["max_abs_error"] == pytest.approx(1e-3, rel=1e-3)
    assert meta["table"]["non_finite"] is True
    _, loose = call(
        client, "/v1/rope/apply-table", {**_inputs(torch.float32), "cos_sin_cache": cache}, {"rope": ROPE, "atol": 0.01}
    )
    assert loose["table"]["first_differing_position"] == 300  # only the NaN row is beyond atol


def test_batched_flat_layout_and_separate_cos_sin(client: TestClient) -> None:
    cache = vllm_rotary_cos_sin_cache(ROTARY, ROWS, 10000.0)
    flat = _inputs(torch.float32)
    reference, _ = call(client, "/v1/rope/apply-table", {**flat, "cos_sin_cache": cache}, {"rope": ROPE})
    batched = {
        "q": flat["q"].view(2, TOKENS // 2, -1),
        "k": flat["k"].view(2, TOKENS // 2, -1),
        "positions": flat["positions"].view(2, TOKENS // 2),
        "cos": cache[:, : ROTARY // 2].repeat(1, 2),  # full width, NeoX layout
        "sin": cache[:, ROTARY // 2 :].repeat(1, 2),
    }
    out, _ = call(client, "/v1/rope/apply-table", batched, {"rope": ROPE, "layout": "batched_flat"})
    assert torch.equal(out["q"].view(TOKENS, -1), reference["q"])
    assert torch.equal(out["k"].view(TOKENS, -1), reference["k"])


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"positions": torch.tensor([0, ROWS] + [0] * (TOKENS - 2))}, "positions"),
        ({"positions": torch.tensor([-1] + [0] * (TOKENS - 1))}, "positions"),
        ({"positions": torch.zeros(TOKENS)}, "positions"),
        ({"positions": torch.zeros(2, 3, TOKENS, dtype=torch.long)}, "positions"),
        ({"cos_sin_cache": torch.zeros(ROWS, ROTARY + 2)}, "cos_sin_cache"),
        ({"cos_sin_cache": None}, "cos_sin_cache"),
        ({"q": torch.zeros(TOKENS, HEADS * HEAD, dtype=torch.int32)}, "q"),
        ({"q": torch.zeros(TOKENS, HEADS * HEAD + 1)}, "q"),
    ],
)
def test_apply_table_errors_name_the_tensor(client: TestClient, change: dict, field: str) -> None:
    tensors = {**_inputs(torch.float32), "cos_sin_cache": vllm_rotary_cos_sin_cache(ROTARY, ROWS, 10000.0)}
    tensors = {name: value for name, value in {**tensors, **change}.items() if value is not None}
    problem, _ = call(client, "/v1/rope/apply-table", tensors, {"rope": ROPE}, status=422)
    assert problem["field"] == field


@pytest.mark.parametrize("atol", [float("nan"), -1.0, 1e400])
def test_apply_table_refuses_a_bad_atol(client: TestClient, atol: float) -> None:
    tensors = {**_inputs(torch.float32), "cos_sin_cache": vllm_rotary_cos_sin_cache(ROTARY, ROWS, 10000.0)}
    body = save(tensors, metadata={"ropeserve": json.dumps({"rope": ROPE, "atol": atol})})
    response = client.post("/v1/rope/apply-table", content=body, headers={"content-type": "application/x-safetensors"})
    assert response.status_code == 422, response.text


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_vision_apply_equals_transformers_apply_rotary_pos_emb_vision(client: TestClient, dtype: torch.dtype) -> None:
    grid = [[1, 4, 6], [2, 4, 4]]
    vision = {"grid_thw": grid, "spatial_merge_size": 2, "head_dim": 16}
    tables = client.post("/v1/vision/rope", json=vision, headers={"accept": "application/x-safetensors"})
    cos_sin = load(tables.content)
    patches = cos_sin["cos"].shape[0]
    q, k = torch.randn(patches, 3, 16).to(dtype), torch.randn(patches, 3, 16).to(dtype)
    out, meta = call(client, "/v1/vision/apply", {"q": q, "k": k}, vision)
    expected_q, expected_k = apply_rotary_pos_emb_vision(q, k, cos_sin["cos"], cos_sin["sin"])
    assert torch.equal(out["q"], expected_q) and torch.equal(out["k"], expected_k)
    assert meta["patches"] == patches
    problem, _ = call(client, "/v1/vision/apply", {"q": q[:-1]}, vision, status=422)
    assert problem["field"] == "q"
