"""``/v1/rope/apply`` and ``/v1/mrope/apply`` over HTTP: results, headers, problem+json errors, back-pressure."""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

import httpx
import pytest
import torch
from fastapi import FastAPI
from fastapi.testclient import TestClient
from hf_oracle import hf_rotary, hf_text_config
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import load, save
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from ropeserve.api import create_app, routes_rotation
from ropeserve.config import normalize_config, preset_config
from ropeserve.kernels import select_kernel
from ropeserve.rope import apply_rotary, mrope_cos_sin, rope_cos_sin
from ropeserve.settings import Settings

SAFETENSORS = {"content-type": "application/x-safetensors"}
ROPE = {"rope_theta": 10_000.0, "head_dim": 16}


def make_app(**settings: Any) -> FastAPI:
    app = create_app(Settings(**({"access_log": False} | settings)))
    routes_rotation.install(app)
    return app


@pytest.fixture()
def client() -> TestClient:
    with TestClient(make_app(max_body_bytes=1 << 16)) as test_client:
        yield test_client


def body(tensors: dict[str, torch.Tensor], params: dict[str, Any] | None) -> bytes:
    metadata = None if params is None else {"ropeserve": json.dumps(params)}
    return save(tensors, metadata=metadata)


def problem(response: httpx.Response, status: int, slug: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    document = response.json()
    assert document["type"].endswith("/" + slug)
    return document


def test_rope_apply_rotates_in_the_same_shape_and_dtype(client: TestClient) -> None:
    q, k = torch.randn(2, 5, 4, 16).to(torch.bfloat16), torch.randn(2, 5, 1, 16).to(torch.bfloat16)
    positions = torch.tensor([[0, 1, 2, 3, 4], [7, 8, 9, 10, 11]])
    params = {"rope": ROPE, "layout": "bthd", "pairing": "gptj"}
    response = client.post(
        "/v1/rope/apply", content=body({"q": q, "k": k, "positions": positions}, params), headers=SAFETENSORS
    )
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/x-safetensors"
    assert {"x-queue-time", "x-compute-time", "x-total-time"} <= set(response.headers)
    answer = load(response.content)
    cs = rope_cos_sin(
        normalize_config({"rope_parameters": ROPE, "head_dim": 16}).params(),
        positions,
        pairing="gptj",
        dtype=torch.bfloat16,
        cache=None,
    )
    expected = apply_rotary(q, k, cs.cos, cs.sin, head_dim=16, layout="bthd", pairing="gptj")
    assert torch.equal(answer["q"], expected[0]) and torch.equal(answer["k"], expected[1])


def test_metadata_reports_kernel_and_timings(client: TestClient) -> None:
    tensors = {"q": torch.randn(6, 32), "positions": torch.arange(6, dtype=torch.int32)}
    response = client.post(
        "/v1/rope/apply", content=body(tensors, {"rope": ROPE, "layout": "flat"}), headers=SAFETENSORS
    )
    raw = response.content
    header = json.loads(raw[8 : 8 + int.from_bytes(raw[:8], "little")])
    meta = json.loads(header["__metadata__"]["ropeserve"])
    assert meta["kernel"] == client.get("/v1/info").json()["kernel"] == select_kernel("cpu")
    assert {"read_s", "decode_s", "prepare_s", "queue_s", "compute_s", "total_s"} <= set(meta["timings"])
    assert set(header) == {"__metadata__", "q"}


def test_large_bodies_reuse_a_pooled_buffer_and_stay_exact() -> None:
    """Bodies of 1 MiB and up are read into pooled buffers: each answer must still be its own request's, and a
    buffer goes back to the pool only after a full answer (a refused request drops the one it took)."""
    app = make_app(max_body_bytes=8 << 20)
    pool = routes_rotation.install(app).body_buffers
    params = normalize_config({"rope_parameters": ROPE, "head_dim": 16}).params()
    with TestClient(app) as client:
        for seed in range(3):
            generator = torch.Generator().manual_seed(seed)
            q, positions = torch.randn(4096, 4 * 16, generator=generator), torch.randint(0, 9000, (4096,))
            sent = body({"q": q, "positions": positions}, {"rope": ROPE, "layout": "flat"})
            response = client.post("/v1/rope/apply", content=sent, headers=SAFETENSORS)
            cs = rope_cos_sin(params, positions, cache=None)
            expected = apply_rotary(q, None, cs.cos, cs.sin, head_dim=16, layout="flat")[0]
            assert torch.equal(load(response.content)["q"], expected)
            assert pool.idle == len(sent), "the 1.x MiB body's buffer is back in the pool (grown once, then reused)"
        refused = body({"q": q, "positions": positions.float()}, {"rope": ROPE, "layout": "flat"})
        problem(client.post("/v1/rope/apply", content=refused, headers=SAFETENSORS), 422, "invalid-input")
        assert pool.idle == 0


def test_info_says_which_kernels_could_serve_and_why_not(client: TestClient) -> None:
    kernels = client.get("/v1/info").json()["kernels"]
    assert kernels["c"] == {"description": kernels["c"]["description"], "available": True, "reason": None}
    assert kernels["fused"]["available"] and kernels["native"]["available"]
    assert kernels["triton"]["available"] is False and kernels["triton"]["reason"] == "serves cuda, not cpu"


def test_mrope_apply_with_a_preset(client: TestClient) -> None:
    params = normalize_config(preset_config("qwen2.5-vl-7b")).params()
    q = torch.randn(1, 2, 5, params.head_dim)
    positions = torch.tensor([[0, 1, 2, 2, 2], [0, 1, 2, 2, 3], [0, 1, 2, 3, 2]])
    response = client.post(
        "/v1/mrope/apply",
        content=body({"q": q, "positions": positions}, {"preset": "qwen2.5-vl-7b"}),
        headers=SAFETENSORS,
    )
    assert response.status_code == 200, response.text
    cs = mrope_cos_sin(params, positions, cache=None)
    assert torch.equal(load(response.content)["q"], apply_rotary(q, None, cs.cos, cs.sin, head_dim=params.head_dim)[0])


def test_mrope_endpoint_refuses_a_plain_rope_model(client: TestClient) -> None:
    tensors = {"q": torch.randn(1, 1, 2, 16), "positions": torch.zeros(3, 2, dtype=torch.int64)}
    response = client.post("/v1/mrope/apply", content=body(tensors, {"rope": ROPE}), headers=SAFETENSORS)
    assert problem(response, 422, "invalid-input")["field"] == "mrope_section"


def test_wrong_content_type_is_415(client: TestClient) -> None:
    response = client.post("/v1/rope/apply", content=b"{}", headers={"content-type": "text/plain"})
    problem(response, 415, "unsupported-media-type")


@pytest.mark.parametrize("content_type", ["application/json", "Application/JSON; charset=utf-8"])
def test_json_body_is_the_shared_memory_form(client: TestClient, content_type: str) -> None:
    response = client.post("/v1/rope/apply", content=b"{}", headers={"content-type": content_type})
    assert problem(response, 422, "invalid-input")["field"] == "params"


def test_oversized_body_is_413_before_it_is_read(client: TestClient) -> None:
    response = client.post("/v1/rope/apply", content=bytes(1 << 17), headers=SAFETENSORS)
    problem(response, 413, "payload-too-large")


@pytest.mark.parametrize(
    ("content", "status", "slug", "field"),
    [
        (b"\x01\x02", 400, "malformed-payload", "body"),
        (body({"q": torch.zeros(1, 1, 1, 16)}, {"rope": ROPE}), 422, "invalid-input", "positions"),
        (
            body({"q": torch.zeros(1, 1, 1, 16), "positions": torch.zeros(1, dtype=torch.int64)}, None),
            422,
            "invalid-input",
            "__metadata__.ropeserve",
        ),
        (
            body(
                {"q": torch.zeros(1, 1, 1, 16), "positions": torch.zeros(1, dtype=torch.int64)},
                {"rope": ROPE, "preset": "qwen3-8b"},
            ),
            422,
            "invalid-input",
            "__metadata__.ropeserve",
        ),
        (
            body({"q": torch.zeros(1, 1, 1, 8), "positions": torch.zeros(1, dtype=torch.int64)}, {"rope": ROPE}),
            422,
            "invalid-input",
            "q",
        ),
        (
            body(
                {"q": torch.zeros(1, 1, 1, 16, dtype=torch.float64), "positions": torch.zeros(1, dtype=torch.int64)},
                {"rope": ROPE},
            ),
            422,
            "invalid-input",
            "q",
        ),
        (
            body(
                {"q": torch.zeros(1, 1, 1, 16), "positions": torch.zeros(1, dtype=torch.int64)},
                {"rope": ROPE, "layout": "hbtd"},
            ),
            422,
            "invalid-input",
            "layout",
        ),
    ],
    ids=["truncated", "missing positions", "no parameters", "two sources", "head_dim", "float64", "layout"],
)
def test_bad_requests_are_problems_naming_the_field(
    client: TestClient, content: bytes, status: int, slug: str, field: str
) -> None:
    response = client.post("/v1/rope/apply", content=content, headers=SAFETENSORS)
    assert problem(response, status, slug)["field"] == field


def test_full_queue_is_429_with_retry_after() -> None:
    app = make_app(batch_queue_size=1, batch_max_wait_us=0, retry_after_s=2)
    service = app.state.runtime.extensions["rotation"]
    release, entered = threading.Event(), threading.Event()
    kernel = service.rotate_kernel

    def held_kernel(*args: Any, **kwargs: Any) -> Any:
        entered.set()
        release.wait(10)
        return kernel(*args, **kwargs)

    service.rotate_kernel = held_kernel
    content = body({"q": torch.randn(1, 1, 3, 16), "positions": torch.arange(3)}, {"rope": ROPE})

    async def run() -> list[httpx.Response]:
        await service.start()
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
            post = lambda: http.post("/v1/rope/apply", content=content, headers=SAFETENSORS)  # noqa: E731
            running = asyncio.create_task(post())
            await asyncio.to_thread(entered.wait, 10)
            queued = asyncio.create_task(post())
            await asyncio.sleep(0.05)
            refused = await post()
            release.set()
            responses = [refused, await running, await queued]
        await service.stop()
        return responses

    refused, first, second = asyncio.run(run())
    assert problem(refused, 429, "overloaded")
    assert refused.headers["retry-after"] == "2"
    assert first.status_code == second.status_code == 200
    assert "ropeserve_batch_size_requests_count 2.0" in app.state.runtime.metrics.exposition().decode()


def test_openapi_documents_both_endpoints(client: TestClient) -> None:
    paths = client.get("/openapi.json").json()["paths"]
    for path in ("/v1/rope/apply", "/v1/mrope/apply"):
        operation = paths[path]["post"]
        assert "application/x-safetensors" in operation["requestBody"]["content"]
        assert {"200", "413", "415", "422", "429"} <= set(operation["responses"])


PARAMS = st.sampled_from(
    [
        {"rope": ROPE},
        {"rope": ROPE, "layout": "flat", "pairing": "gptj"},
        {"rope": {**ROPE, "rotary_dim": 8}, "layout": "bthd", "dtype": "float16"},
        {"preset": "qwen2-vl-7b", "rotary_dim": 3},
        {
            "rope": {
                "rope_type": "dynamic",
                "rope_theta": 1e4,
                "head_dim": 16,
                "factor": 2.0,
                "max_position_embeddings": 8,
            }
        },
        {"rope": ROPE, "layout": 7},
        {},
    ]
)


@st.composite
def rotation_bodies(draw: st.DrawFn) -> bytes:
    tensors = {}
    for name in draw(st.lists(st.sampled_from(["q", "k", "positions", "v"]), min_size=1, max_size=3, unique=True)):
        shape = draw(st.lists(st.integers(0, 5), min_size=0, max_size=4))
        if name != "positions" and draw(st.booleans()):
            shape = [*shape[:3], 16]
        dtype = draw(st.sampled_from([torch.float32, torch.bfloat16, torch.int64, torch.int32]))
        tensors[name] = (torch.randn(shape) * 50).to(dtype)
    return body(tensors, draw(PARAMS))


@pytest.fixture(scope="module")
def fuzz_client() -> TestClient:
    with TestClient(make_app()) as test_client:
        yield test_client


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(content=rotation_bodies(), endpoint=st.sampled_from(["/v1/rope/apply", "/v1/mrope/apply"]))
def test_fuzzed_bodies_never_fail_the_server(fuzz_client: TestClient, content: bytes, endpoint: str) -> None:
    response = fuzz_client.post(endpoint, content=content, headers=SAFETENSORS)
    assert response.status_code in (200, 400, 422), response.text


def test_bit_exactness_excepts_only_the_bits_of_nans(client: TestClient) -> None:
    """README's exception to "bit for bit": NaN in q/k gives NaN out in exactly transformers' elements (its
    rotation pair) and every other element is bit-identical, but a NaN's sign and payload bits are not
    reproduced (the kernels' operation order differs from transformers', e.g. 0xffffffff vs 0x7fffffff)."""
    config = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "max_position_embeddings": 64}
    positions = torch.arange(5)
    q, k = torch.randn(1, 4, 5, 16, generator=torch.Generator().manual_seed(3)), torch.randn(1, 4, 5, 16)
    for tensor in (q, k):
        bits = tensor.view(torch.int32)
        bits[0, 0, 1, 3], bits[0, 1, 2, 10], bits[0, 3, 4, 0] = 0x7FC00001, -0x00400001, 0x7F800001  # payloads, -NaN
    cos, sin = hf_rotary(hf_text_config(config))(q, positions[None])
    expected = dict(zip("qk", apply_rotary_pos_emb(q, k, cos, sin), strict=True))
    response = client.post(
        "/v1/rope/apply",
        content=body({"q": q, "k": k, "positions": positions}, {"config": config}),
        headers=SAFETENSORS,
    )
    assert response.status_code == 200, response.text
    for name, rotated in load(response.content).items():
        nan = expected[name].isnan()
        assert nan.sum() == 6  # each planted NaN spreads to its NeoX pair, nowhere else
        assert torch.equal(rotated.isnan(), nan)
        assert torch.equal(rotated[~nan].view(torch.int32), expected[name][~nan].view(torch.int32))
