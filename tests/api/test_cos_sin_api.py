"""``POST /v1/rope/cos-sin``: values equal transformers' rotary modules, for every source (config, preset,
explicit parameters), positions as a list or a range, every dtype, JSON or safetensors; limits are checked
before anything is allocated; bad inputs are problem+json documents naming the offending ``field``.
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers
from fastapi.testclient import TestClient
from safetensors.torch import load
from transformers import AutoConfig
from transformers.models.gemma3.modeling_gemma3 import Gemma3RotaryEmbedding
from transformers.models.glm.modeling_glm import GlmRotaryEmbedding
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
from transformers.models.phi3.modeling_phi3 import Phi3RotaryEmbedding

from ropeserve.api import create_app
from ropeserve.config import preset_config
from ropeserve.settings import Settings

transformers.logging.set_verbosity_error()

URL = "/v1/rope/cos-sin"
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "configs"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
SAFETENSORS = {"accept": "application/x-safetensors"}


def fixture(name: str) -> dict[str, Any]:
    return json.loads((FIXTURES / name).read_text(encoding="utf-8"))


LLAMA31 = fixture("meta-llama__Llama-3.1-8B-Instruct.json")
PHI3 = fixture("microsoft__Phi-3-mini-128k-instruct.json")
GEMMA3 = fixture("google__gemma-3-4b-it.json")


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    with TestClient(create_app(Settings(access_log=False))) as test_client:
        yield test_client


def small_limits_client(**limits: int) -> TestClient:
    return TestClient(create_app(Settings(access_log=False, **limits)))


def hf_cos_sin(
    module_class: type[torch.nn.Module],
    config: dict[str, Any],
    positions: list[int],
    dtype: torch.dtype,
    layer_type: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    kwargs = copy.deepcopy(config)
    text = AutoConfig.for_model(kwargs.pop("model_type"), **kwargs).get_text_config()
    extra = {"layer_type": layer_type} if layer_type else {}
    cos, sin = module_class(text)(torch.zeros(1, dtype=dtype), torch.tensor([positions]), **extra)
    return cos[0], sin[0]


def json_tensor(values: list[Any], dtype: torch.dtype) -> torch.Tensor:
    """JSON carries each value as the float64 of the dtype's value: converting back is exact."""
    return torch.tensor(values, dtype=torch.float64).to(dtype)


def assert_problem(response: Any, status: int, slug: str, field: str | None) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    body = response.json()
    assert body["type"].endswith("/" + slug)
    assert body["status"] == status
    assert body.get("field") == field
    return body


# --------------------------------------------------------------------------------------------------------- values
POSITIONS = [0, 1, 8191, 8192, 131_071, 131_072, 500_000]


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_config_source_equals_the_llama_module(client: TestClient, dtype: str) -> None:
    body = client.post(URL, json={"config": LLAMA31, "positions": POSITIONS, "dtype": dtype}).json()
    cos, sin = hf_cos_sin(LlamaRotaryEmbedding, LLAMA31, POSITIONS, DTYPES[dtype])
    assert torch.equal(json_tensor(body["cos"], DTYPES[dtype]), cos)
    assert torch.equal(json_tensor(body["sin"], DTYPES[dtype]), sin)
    assert (body["rope_type"], body["head_dim"], body["rotary_dim"], body["width"]) == ("llama3", 128, 128, 128)
    assert (body["count"], body["dtype"], body["pairing"], body["attention_factor"]) == (7, dtype, "neox", 1.0)
    assert len(body["inv_freq"]) == 64
    assert body["params"]["factor"] == 8.0
    if dtype == "float32":
        assert body["max_abs_error"] is None
    else:
        exact = client.post(URL, json={"config": LLAMA31, "positions": POSITIONS}).json()
        cos32, sin32 = json_tensor(exact["cos"], torch.float32), json_tensor(exact["sin"], torch.float32)
        expected = max(float((cos - cos32).abs().max()), float((sin - sin32).abs().max()))
        assert body["max_abs_error"] == expected > 0


def test_mixformer_config_of_phi2_gets_the_tables_of_its_transformers_config(client: TestClient) -> None:
    """Regression: the remote-code MixFormer form of phi-2 (``n_embd``, ``n_head``, ``rotary_dim``) was a 422
    "cannot derive head_dim" while the linter read it; the normaliser now completes it as the config class does."""
    mixformer = client.post(URL, json={"config": fixture("microsoft__phi-2.mixformer.json"), "positions": POSITIONS})
    phi2 = client.post(URL, json={"config": fixture("microsoft__phi-2.json"), "positions": POSITIONS})
    assert mixformer.status_code == 200, mixformer.text
    assert mixformer.json()["cos"] == phi2.json()["cos"] and mixformer.json()["rotary_dim"] == 32


def test_preset_equals_its_config(client: TestClient) -> None:
    by_preset = client.post(URL, json={"preset": "llama-3.1-8b", "positions": POSITIONS}).json()
    by_config = client.post(URL, json={"config": preset_config("llama-3.1-8b"), "positions": POSITIONS}).json()
    assert by_preset == by_config


def test_longrope_switches_with_the_largest_position(client: TestClient) -> None:
    for positions in ([0, 5, 4095], [0, 5, 4096]):
        body = client.post(URL, json={"config": PHI3, "positions": positions}).json()
        cos, sin = hf_cos_sin(Phi3RotaryEmbedding, PHI3, positions, torch.float32)
        assert torch.equal(json_tensor(body["cos"], torch.float32), cos)
        assert body["attention_factor"] == pytest.approx(1.1902380714238083, rel=1e-15)


def test_layer_type_selects_gemma3_sliding_layers(client: TestClient) -> None:
    positions = [0, 3, 1024, 70_000]
    for layer_type in ("full_attention", "sliding_attention"):
        request = {"config": GEMMA3, "positions": positions, "layer_type": layer_type}
        body = client.post(URL, json=request).json()
        cos, _ = hf_cos_sin(Gemma3RotaryEmbedding, GEMMA3, positions, torch.float32, layer_type)
        assert torch.equal(json_tensor(body["cos"], torch.float32), cos)
    assert_problem(
        client.post(URL, json={"config": GEMMA3, "positions": [0], "layer_type": "chunked_attention"}),
        422,
        "invalid-input",
        "layer_type",
    )


def test_explicit_params_and_range_positions(client: TestClient) -> None:
    rope = {
        "rope_type": "yarn",
        "rope_theta": 1e6,
        "head_dim": 64,
        "factor": 4.0,
        "original_max_position_embeddings": 1024,
        "max_position_embeddings": 4096,
    }
    by_range = client.post(URL, json={"rope": rope, "positions": {"start": 3, "stop": 5000, "step": 499}}).json()
    by_list = client.post(URL, json={"rope": rope, "positions": list(range(3, 5000, 499))}).json()
    assert by_range == by_list
    config = {
        "model_type": "llama",
        "hidden_size": 256,
        "num_attention_heads": 4,
        "max_position_embeddings": 4096,
        "rope_parameters": {k: v for k, v in rope.items() if k not in ("head_dim", "max_position_embeddings")},
    }
    cos, _ = hf_cos_sin(LlamaRotaryEmbedding, config, list(range(3, 5000, 499)), torch.float32)
    assert torch.equal(json_tensor(by_range["cos"], torch.float32), cos)
    assert by_range["attention_factor"] == pytest.approx(0.1 * math.log(4.0) + 1, rel=1e-15)


def test_model_pairing_by_default_and_on_request(client: TestClient) -> None:
    glm = {"model_type": "glm", "hidden_size": 512, "num_attention_heads": 4}
    positions = [0, 7, 4096]
    default = client.post(URL, json={"config": glm, "positions": positions}).json()
    neox = client.post(URL, json={"config": glm, "positions": positions, "pairing": "neox"}).json()
    cos, _ = hf_cos_sin(GlmRotaryEmbedding, glm, positions, torch.float32)
    assert (default["pairing"], default["width"]) == ("gptj", 64)
    assert torch.equal(json_tensor(neox["cos"], torch.float32), cos)
    assert torch.equal(json_tensor(default["cos"], torch.float32), cos[:, :32].repeat_interleave(2, dim=-1))


def test_dynamic_seq_len_cached_reproduces_hysteresis(client: TestClient) -> None:
    """A module that has seen length 8192 keeps those frequencies at position 6000 (spec §2.9); a fresh one
    grows to 6001. ``seq_len_cached`` tells the service which of the two it is asked about."""
    rope = {"rope_type": "dynamic", "factor": 2.0, "head_dim": 128, "max_position_embeddings": 4096}
    config = {
        "model_type": "llama",
        "hidden_size": 512,
        "num_attention_heads": 4,
        "head_dim": 128,
        "max_position_embeddings": 4096,
        "rope_parameters": {"rope_type": "dynamic", "factor": 2.0},
    }
    module = LlamaRotaryEmbedding(
        AutoConfig.for_model("llama", **{k: v for k, v in config.items() if k != "model_type"})
    )
    x = torch.zeros(1)
    fresh_cos, _ = module(x, torch.tensor([[6000]]))
    module(x, torch.tensor([[8191]]))
    seen_cos, _ = module(x, torch.tensor([[6000]]))
    fresh = client.post(URL, json={"rope": rope, "positions": [6000]}).json()
    after_8192 = client.post(URL, json={"rope": rope, "positions": [6000], "seq_len_cached": 8192}).json()
    assert torch.equal(json_tensor(fresh["cos"], torch.float32), fresh_cos[0])
    assert torch.equal(json_tensor(after_8192["cos"], torch.float32), seen_cos[0])
    assert after_8192["inv_freq"][63] == pytest.approx(3.849273e-05, rel=1e-6)  # spec §8 S7
    assert_problem(client.post(URL, json={"rope": rope, "positions": []}), 422, "invalid-input", "positions")


def test_proportional_width_is_the_head(client: TestClient) -> None:
    rope = {"rope_type": "proportional", "rope_theta": 1e6, "head_dim": 128, "partial_rotary_factor": 0.25}
    body = client.post(URL, json={"rope": rope, "positions": [5]}).json()
    assert (body["rotary_dim"], body["width"], len(body["cos"][0])) == (32, 128, 128)
    assert body["cos"][0][16:64] == [1.0] * 48


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_safetensors_response_carries_tensors_and_metadata(client: TestClient, dtype: str) -> None:
    request = {"config": LLAMA31, "positions": POSITIONS, "dtype": dtype}
    response = client.post(URL, json=request, headers=SAFETENSORS)
    assert response.headers["content-type"] == "application/x-safetensors"
    tensors = load(response.content)
    cos, sin = hf_cos_sin(LlamaRotaryEmbedding, LLAMA31, POSITIONS, DTYPES[dtype])
    assert tensors["cos"].dtype == DTYPES[dtype]
    assert torch.equal(tensors["cos"], cos) and torch.equal(tensors["sin"], sin)
    assert tensors["inv_freq"].dtype == torch.float32
    metadata = json.loads(_safetensors_metadata(response.content)["ropeserve"])
    json_body = client.post(URL, json=request).json()
    assert metadata == {key: value for key, value in json_body.items() if key not in ("cos", "sin", "inv_freq")}


def _safetensors_metadata(blob: bytes) -> dict[str, str]:
    header_size = int.from_bytes(blob[:8], "little")
    return json.loads(blob[8 : 8 + header_size])["__metadata__"]


# ---------------------------------------------------------------------------------------------------------- limits
def test_too_many_positions_is_refused_before_allocation(client: TestClient) -> None:
    """The largest range the schema admits (2^31 positions, 16 GiB as int64) is counted before any tensor exists."""
    huge = {"rope": {"head_dim": 8}, "positions": {"start": 0, "stop": 2**31}}
    body = assert_problem(client.post(URL, json=huge), 422, "limit-exceeded", "positions")
    assert body["limit"] == Settings().max_positions
    with small_limits_client(max_positions=10) as small:
        listed = {"rope": {"head_dim": 8}, "positions": list(range(11))}
        assert_problem(small.post(URL, json=listed), 422, "limit-exceeded", "positions")
        assert small.post(URL, json={**listed, "positions": list(range(10))}).status_code == 200


def test_table_element_limit(client: TestClient) -> None:
    with small_limits_client(max_table_elements=1000) as small:
        request = {"rope": {"head_dim": 128}, "positions": list(range(4))}
        body = assert_problem(small.post(URL, json=request), 422, "limit-exceeded", "positions")
        assert body["limit"] == 1000


def test_large_json_result_is_406_but_safetensors_is_served(client: TestClient) -> None:
    request = {"rope": {"head_dim": 128}, "positions": {"start": 0, "stop": 1000}}
    body = assert_problem(client.post(URL, json=request), 406, "not-acceptable", "accept")
    assert body["limit"] == Settings().json_response_max_elements
    response = client.post(URL, json=request, headers=SAFETENSORS)
    assert response.status_code == 200
    assert load(response.content)["cos"].shape == (1000, 128)


# ------------------------------------------------------------------------------------------------------ bad inputs
BAD_REQUESTS: list[tuple[str, dict[str, Any], str]] = [
    ("two sources", {"preset": "llama-3.1-8b", "rope": {"head_dim": 8}, "positions": [0]}, "body"),
    ("no source", {"positions": [0]}, "body"),
    ("unknown preset", {"preset": "no-such-model", "positions": [0]}, "preset"),
    (
        "unknown rope_type (explicit)",
        {"rope": {"rope_type": "bogus", "head_dim": 8}, "positions": [0]},
        "rope.rope_type",
    ),
    (
        "unknown rope_type (config)",
        {"config": {**LLAMA31, "rope_scaling": {"rope_type": "bogus"}}, "positions": [0]},
        "config.rope_scaling.rope_type",
    ),
    ("odd head_dim", {"rope": {"head_dim": 7}, "positions": [0]}, "rope.head_dim"),
    ("theta zero", {"rope": {"head_dim": 8, "rope_theta": 0}, "positions": [0]}, "rope.rope_theta"),
    ("theta negative (config)", {"config": {**LLAMA31, "rope_theta": -1.0}, "positions": [0]}, "config.rope_theta"),
    ("negative position", {"rope": {"head_dim": 8}, "positions": [0, -1]}, "positions[1]"),
    ("negative range start", {"rope": {"head_dim": 8}, "positions": {"start": -2, "stop": 3}}, "positions"),
    ("zero range step", {"rope": {"head_dim": 8}, "positions": {"start": 0, "stop": 3, "step": 0}}, "positions"),
    ("rotary_dim > head_dim", {"rope": {"head_dim": 8, "rotary_dim": 16}, "positions": [0]}, "rope.rotary_dim"),
    ("unknown dtype", {"rope": {"head_dim": 8}, "positions": [0], "dtype": "float64"}, "dtype"),
    ("unknown pairing", {"rope": {"head_dim": 8}, "positions": [0], "pairing": "zigzag"}, "pairing"),
    ("unknown key", {"rope": {"head_dim": 8}, "positions": [0], "extra": 1}, "extra"),
    ("config not an object", {"config": [1], "positions": [0]}, "config"),
]


@pytest.mark.parametrize(("request_body", "field"), [c[1:] for c in BAD_REQUESTS], ids=[c[0] for c in BAD_REQUESTS])
def test_bad_inputs_are_problems_naming_the_field(client: TestClient, request_body: dict[str, Any], field: str) -> None:
    assert_problem(client.post(URL, json=request_body), 422, "invalid-input", field)


def test_nan_factor_is_a_problem_naming_the_factor(client: TestClient) -> None:
    """JSON has no NaN, but Python's parser accepts the ``NaN`` literal: it must still be refused."""
    raw = b'{"rope": {"head_dim": 8, "rope_type": "linear", "factor": NaN}, "positions": [0]}'
    response = client.post(URL, content=raw, headers={"content-type": "application/json"})
    assert_problem(response, 422, "invalid-input", "rope.factor")


def test_dynamic_ntk_vllm_over_http(client: TestClient) -> None:
    from engine_oracles import vllm_dynamic_ntk_cos_sin_cache

    rope = {"rope_type": "dynamic", "factor": 2.0, "head_dim": 64, "max_position_embeddings": 256}
    body = client.post(URL, json={"rope": rope, "positions": [0, 7, 511], "dynamic_ntk": "vllm"}).json()
    cache = vllm_dynamic_ntk_cos_sin_cache(64, 256, 10000.0, 2.0)
    assert body["dynamic_ntk"] == "vllm" and body["rope_type"] == "dynamic"
    assert torch.equal(json_tensor(body["cos"], torch.float32)[:, :32], cache[[0, 7, 511], :32])
    short = {"rope": rope, "positions": [7]}
    transformers_rule = client.post(URL, json=short).json()
    assert transformers_rule["cos"] != client.post(URL, json={**short, "dynamic_ntk": "vllm"}).json()["cos"]
    past = client.post(URL, json={"rope": rope, "positions": [512], "dynamic_ntk": "vllm"})
    assert_problem(past, 422, "invalid-input", "positions")
    for factor in (1e308, 10**400, float("nan"), -2.0, 2**63):
        hostile = {**rope, "factor": factor}
        response = client.post(
            URL,
            content=json.dumps({"rope": hostile, "positions": [1], "dynamic_ntk": "vllm"}),
            headers={"content-type": "application/json"},
        )
        assert response.status_code == 422, (factor, response.text)
    assert client.post(URL, json={"rope": rope, "positions": [1], "dynamic_ntk": "sglang"}).status_code == 422
