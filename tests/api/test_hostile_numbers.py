"""Fuzz every number of every request: hostile values never give a 5xx, only a problem+json 4xx or a 200.

Each base request below is valid (checked: 200) and, together, they set every numeric field of every request
model (checked too, so a new field without a fuzz case fails here). Every numeric leaf of each request, the free
JSON inside ``config``/``rope``/``intent``/``rows`` included, is replaced in turn by each hostile literal: an
integer beyond the float range, 1e308, 1e300, NaN, ±Infinity, -1, 0, 5e-324, 1.5, 2**63, 2**64, -2**63-1, and
nesting (200 and 100,000 deep).
Safetensors requests carry the parameters as a JSON string in the header; they are fuzzed the same way.
"""

from __future__ import annotations

import json
import mmap
import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, get_args

import pytest
import torch
from fastapi.testclient import TestClient
from hostile_json import HUGE_INT, with_literal
from pydantic import BaseModel
from safetensors.torch import save

from ropeserve.api import create_app
from ropeserve.api.schemas import StrictModel
from ropeserve.settings import Settings

CONFIGS = Path(__file__).parents[1] / "fixtures" / "configs"
HOSTILE = {
    "10**400": HUGE_INT,
    "-10**400": f"-{HUGE_INT}",
    "1e308": "1e308",
    "NaN": "NaN",
    "Infinity": "Infinity",
    "-Infinity": "-Infinity",
    "1e300": "1e300",
    "-1": "-1",
    "0": "0",
    "5e-324": "5e-324",
    "1.5": "1.5",
    "-2**63-1": str(-(2**63) - 1),
    "2**63-1": str(2**63 - 1),
    "2**63": str(2**63),
    "2**64": str(2**64),
    "nested 200": "[" * 200 + "]" * 200,
    "nested 100000": "[" * 100_000 + "]" * 100_000,
}
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768, "beta_fast": 32.0}
SMALL_LLAMA = {
    "model_type": "llama",
    "hidden_size": 256,
    "num_attention_heads": 4,
    "max_position_embeddings": 131072,
    "rope_theta": 500000.0,
    "rope_scaling": {
        "rope_type": "llama3",
        "factor": 8.0,
        "original_max_position_embeddings": 8192,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
    },
}
QWEN_VL = {
    "model_type": "qwen2_5_vl",
    "hidden_size": 256,
    "num_attention_heads": 2,
    "max_position_embeddings": 128000,
    "rope_theta": 1000000.0,
    "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
    "vision_config": {"spatial_merge_size": 2, "tokens_per_second": 2, "hidden_size": 64, "num_heads": 4},
}
ROWS = [[{"text": 2}, {"image": [1, 4, 4]}, {"video": [2, 4, 4], "second_per_grid_t": 1.0}, {"text": 1}]]
MINICPM_MARKERS = {"slice_start": 901, "slice_end": 902, "image_start": 903, "image_end": 904, "newline": 905}
MINICPM_IDS = [7, 903, 8, 8, 8, 8, 904, 7, 903, 8, 8, 8, 8, 904, 7]
"""An image and a video frame of 2x2 tokens each (16x downsampling: an 8x8 crop), between text."""
HUNYUAN_TYPES = [[0, 0, 1, 1, 1, 1, 1, 1, 0], [0, 1, 1, 1, 1, 1, 1, 1, 1]]
GLM_IMAGE_IDS = [[7, 7, 16384, *[167855] * 6, 16385, 7, 16384], [7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 16384, 7]]


def omni_token_form() -> dict[str, Any]:
    """A Qwen2.5-Omni token-form request: a video with its audio interleaved, then text."""
    from omni_oracle import render_omni

    rows = [[{"text": 3}, {"video": [2, 4, 4], "second_per_grid_t": 1.0, "audio_seqlen": 100}, {"text": 2}]]
    batch = render_omni(rows, 2, use_audio_in_video=True, pads=[0], left=True)
    return {
        **batch.token_form("qwen2_5_omni"),
        "position_id_per_seconds": 25.0,
        "seconds_per_chunk": 2.0,
    }


JSON_CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "mrope omni": ("/v1/mrope/positions", omni_token_form()),
    "mrope glm-image": (
        "/v1/mrope/positions",
        {
            "family": "glm_image",
            "input_ids": GLM_IMAGE_IDS,
            "image_grid_thw": [[1, 2, 3], [1, 4, 4], [1, 3, 5]],
            "images_per_sample": [2, 1],
        },
    ),
    "mrope hunyuan-vl": (
        "/v1/mrope/positions",
        {"family": "hunyuan_vl", "mm_token_type_ids": HUNYUAN_TYPES, "image_grid_thw": [[1, 4, 4]] * 2, "num_axes": 4},
    ),
    "mrope minicpm-v": (
        "/v1/mrope/positions",
        {
            "family": "minicpmv4_7",
            "input_ids": [MINICPM_IDS],
            "mm_token_type_ids": [
                [1 if token == 8 and i < 7 else 2 if token == 8 else 0 for i, token in enumerate(MINICPM_IDS)]
            ],
            "target_sizes": [[8, 8]],
            "target_sizes_videos": [[8, 8]],
            "marker_ids": MINICPM_MARKERS,
        },
    ),  # fmt: skip
    "positions mask": (
        "/v1/positions",
        {"attention_mask": [[0, 1, 1]], "past_lengths": [5], "fill_value": 1},
    ),
    "positions packed": (
        "/v1/positions",
        {"segment_lengths": [2, 3], "past_lengths": [0, 4], "total_length": 6, "fill_value": 0},
    ),
    "positions cu_seqlens": ("/v1/positions", {"cu_seqlens": [0, 2, 5]}),
    "positions decode": ("/v1/positions", {"cache_lengths": [3, 9], "num_new": 2}),
    "mrope rows": (
        "/v1/mrope/positions",
        {
            "config": QWEN_VL,
            "rows": ROWS,
            "spatial_merge_size": 2,
            "tokens_per_second": 2.0,
            "fill_value": 0,
            "context_len": 1,
            "seq_len": 5,
        },
    ),
    "mrope tokens": (
        "/v1/mrope/positions",
        {
            "family": "qwen2_5_vl",
            "input_ids": [[1, 7, 7, 7, 7, 2]],
            "image_token_id": 7,
            "video_token_id": 8,
            "image_grid_thw": [[1, 4, 4]],
            "attention_mask": [[1, 1, 1, 1, 1, 1]],
        },
    ),
    "mrope token types": (
        "/v1/mrope/positions",
        {
            "family": "qwen2_5_vl",
            "mm_token_type_ids": [[0, 2, 2, 2, 2, 2, 2, 2, 2, 0]],
            "video_grid_thw": [[2, 4, 4]],
            "second_per_grid_ts": [0.5],
        },
    ),
    "mrope decode": (
        "/v1/mrope/decode-positions",
        {"mrope_position_deltas": [[-2]], "cache_lengths": [7], "num_new": 2},
    ),
    "mrope cos-sin": (
        "/v1/mrope/cos-sin",
        {"config": QWEN_VL, "position_ids": [[0, 1], [0, 2], [0, 3]]},
    ),
    "vision rope": (
        "/v1/vision/rope",
        {"grid_thw": [[1, 4, 4]], "config": QWEN_VL, "theta": 10000.0},
    ),
    "vision rope explicit": (
        "/v1/vision/rope",
        {"grid_thw": [[1, 4, 4]], "spatial_merge_size": 2, "head_dim": 16},
    ),
    "cos-sin explicit yarn": (
        "/v1/rope/cos-sin",
        {
            "rope": YARN | {"rope_theta": 10000.0, "head_dim": 16, "rotary_dim": 16, "max_position_embeddings": 4096},
            "positions": [0, 7],
        },
    ),
    "cos-sin explicit dynamic": (
        "/v1/rope/cos-sin",
        {
            "rope": {"rope_type": "dynamic", "factor": 2.0, "head_dim": 16, "max_position_embeddings": 64},
            "positions": {"start": 0, "stop": 100, "step": 3},
            "seq_len_cached": 80,
        },
    ),
    "cos-sin explicit longrope": (
        "/v1/rope/cos-sin",
        {
            "rope": {
                "rope_type": "longrope",
                "head_dim": 8,
                "partial_rotary_factor": 1.0,
                "short_factor": [1.0, 1.0, 1.0, 1.0],
                "long_factor": [2.0, 2.0, 2.0, 2.0],
                "original_max_position_embeddings": 16,
                "max_position_embeddings": 64,
                "attention_factor": 1.2,
            },
            "positions": [0, 40],
        },
    ),
    "cos-sin config": ("/v1/rope/cos-sin", {"config": SMALL_LLAMA, "positions": [0, 9000]}),
    "sinusoidal": ("/v1/pe/sinusoidal", {"positions": {"start": 0, "stop": 4, "step": 1}, "dim": 8, "offset": 2}),
    "sinusoidal list": ("/v1/pe/sinusoidal", {"positions": [0, 3], "dim": 6, "base": 100.0}),
    "alibi": ("/v1/pe/alibi", {"num_heads": 4, "max_bias": 8.0, "query_len": 2, "key_len": 3, "offset": 1}),
    "relative t5": (
        "/v1/pe/relative",
        {"query_len": 2, "key_len": 3, "offset": 1, "num_buckets": 8, "max_distance": 16},
    ),
    "relative shaw": ("/v1/pe/relative", {"query_len": 2, "key_len": 3, "mode": "shaw", "clip": 2}),
    "sincos-2d": ("/v1/pe/sincos-2d", {"grid_h": 2, "grid_w": 3, "dim": 8, "base": 10000.0}),
    "lint": (
        "/v1/config/validate",
        {
            "config": SMALL_LLAMA | {"rope_scaling": YARN},
            "intent": {
                "engines": ["vllm==0.9.1", "sglang"],
                "max_model_len": 65536,
                "video_fps": 2.0,
                "max_video_seconds": 60,
                "rope_override": YARN,
            },
            "tokenizer_config": {"model_max_length": 131072},
            "draft_config": SMALL_LLAMA,
        },
    ),
    "lint M-RoPE override": (
        "/v1/config/validate",
        {"config": QWEN_VL, "intent": {"engines": ["vllm", "sglang"], "rope_override": YARN}},
    ),
    "lint video": (
        "/v1/config/validate",
        {"config": QWEN_VL, "intent": {"video_fps": 4.0, "max_video_seconds": 600, "context_length": 32768}},
    ),
}
TENSOR_CASES: dict[str, tuple[str, dict[str, torch.Tensor], dict[str, Any]]] = {
    "rope apply": (
        "/v1/rope/apply",
        {"q": torch.randn(1, 2, 3, 16), "positions": torch.arange(3)},
        {"rope": YARN | {"head_dim": 16, "rope_theta": 10000.0}, "rotary_dim": 8},
    ),
    "mrope apply": (
        "/v1/mrope/apply",
        {"q": torch.randn(1, 2, 3, 128), "positions": torch.arange(3).expand(3, 3).contiguous()},
        {"config": QWEN_VL | {"hidden_size": 256, "num_attention_heads": 2}},
    ),
    "rope apply-table": (
        "/v1/rope/apply-table",
        {
            "q": torch.randn(3, 2 * 16),
            "positions": torch.arange(3),
            "cos_sin_cache": torch.cat([torch.ones(8, 8), torch.zeros(8, 8)], dim=1),
        },
        {"rope": {"rope_theta": 10000.0, "head_dim": 16}, "layout": "flat", "atol": 0.01},
    ),
    "resample": (
        "/v1/pe/resample",
        {"table": torch.randn(5, 8)},
        {"source_grid": [2, 2], "target_grid": [3, 3], "prefix_rows": 1},
    ),
}


SHM_TOKENS, SHM_HEADS, SHM_HEAD_DIM = 3, 2, 16
SHM_Q_BYTES = SHM_TOKENS * SHM_HEADS * SHM_HEAD_DIM * 4
SHM_REGION = {"name": "fuzz", "byte_size": 4096}
"""Registered before the rotation case (its ``key`` is the test's own object); fuzzed last."""
SHM_ROTATION = {
    "params": {"rope": {"rope_theta": 10000.0, "head_dim": SHM_HEAD_DIM}, "rotary_dim": 16},
    "q": {"region": "fuzz", "offset": 0, "shape": [1, SHM_HEADS, SHM_TOKENS, SHM_HEAD_DIM], "dtype": "float32"},
    "positions": {"region": "fuzz", "offset": SHM_Q_BYTES, "shape": [SHM_TOKENS], "dtype": "int64"},
}


@pytest.fixture()
def shm_key() -> Iterator[str]:
    """A POSIX shared-memory object of the region's size, made as a client would (zeros: a valid rotation)."""
    key = f"ropeserve_fuzz_{uuid.uuid4().hex[:12]}"
    fd = os.open(f"/dev/shm/{key}", os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    os.ftruncate(fd, SHM_REGION["byte_size"])
    mapping = mmap.mmap(fd, SHM_REGION["byte_size"])
    yield "/" + key
    mapping.close()
    os.close(fd)
    os.unlink(f"/dev/shm/{key}")


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    settings = Settings(access_log=False, max_positions=100_000, max_table_elements=1_000_000)
    with TestClient(create_app(settings), raise_server_exceptions=False) as test_client:
        yield test_client


def numeric_leaves(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Paths of the numbers in ``value`` (of a list of more than 4 numbers, the first and the last only)."""
    if isinstance(value, dict):
        for key, child in value.items():
            yield from numeric_leaves(child, (*path, key))
    elif isinstance(value, list) and value:
        numbers = all(isinstance(item, int | float) and not isinstance(item, bool) for item in value)
        indices = [0, len(value) - 1] if numbers and len(value) > 4 else range(len(value))
        for index in indices:
            yield from numeric_leaves(value[index], (*path, index))
    elif isinstance(value, int | float) and not isinstance(value, bool):
        yield path


def assert_not_5xx(response: Any, what: str, sent: str = "") -> None:
    """A 4xx is problem+json; a JSON 200 holds no integer outside int64 but the ``sent`` literal echoed (the trace
    of a wrapped or float-rounded value: a Shaw clip of 2**63 - 1 once answered 2**64 - 1, a length of 2**63 - 1
    was derived as 2**63, a max_position_embeddings of 1e308 came back as a 309-digit integer)."""
    assert response.status_code < 500, f"{what}: {response.status_code} {response.text[:300]}"
    if response.status_code >= 400:
        assert response.headers["content-type"].startswith("application/problem+json"), what
    elif response.headers.get("content-type", "").startswith("application/json"):
        outside = [n for n in integers_in(response.json()) if not -(2**63) <= n < 2**63 and str(n) != sent]
        assert not outside, f"{what}: integers outside int64 in the answer: {outside[:3]}"


def integers_in(value: Any) -> Iterator[int]:
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, list):
        for item in value:
            yield from integers_in(item)
    elif isinstance(value, int) and not isinstance(value, bool):
        yield value


def post_with_each_hostile_number(
    client: TestClient, path: str, body: dict[str, Any], after_each: Callable[[], object] = lambda: None
) -> None:
    """Post ``body`` once per numeric leaf and hostile literal; no answer may be a 5xx."""
    for leaf in numeric_leaves(body):
        for name, literal in HOSTILE.items():
            response = client.post(
                path, content=with_literal(body, leaf, literal), headers={"content-type": "application/json"}
            )
            assert_not_5xx(response, f"{path} {'/'.join(map(str, leaf))} = {name}", literal)
            after_each()


@pytest.mark.parametrize("case", sorted(JSON_CASES))
def test_every_number_of_a_json_request_survives_hostile_values(client: TestClient, case: str) -> None:
    path, body = JSON_CASES[case]
    baseline = client.post(path, json=body)
    assert baseline.status_code == 200, baseline.text  # the fuzzed values reach real code
    post_with_each_hostile_number(client, path, body)


@pytest.mark.parametrize("case", sorted(TENSOR_CASES))
def test_every_number_of_safetensors_parameters_survives_hostile_values(client: TestClient, case: str) -> None:
    path, tensors, params = TENSOR_CASES[case]
    headers = {"content-type": "application/x-safetensors"}
    baseline = client.post(path, content=save(tensors, metadata={"ropeserve": json.dumps(params)}), headers=headers)
    assert baseline.status_code == 200, baseline.text
    for leaf in numeric_leaves(params):
        for name, literal in HOSTILE.items():
            body = save(tensors, metadata={"ropeserve": with_literal(params, leaf, literal)})
            assert_not_5xx(client.post(path, content=body, headers=headers), f"{path} {leaf} = {name}")


def test_every_number_of_a_shared_memory_request_survives_hostile_values(client: TestClient, shm_key: str) -> None:
    region = SHM_REGION | {"key": shm_key}
    assert client.post("/v1/shm/regions", json=region).status_code == 201
    try:
        baseline = client.post("/v1/rope/apply", json=SHM_ROTATION)
        assert baseline.status_code == 200, baseline.text
        post_with_each_hostile_number(client, "/v1/rope/apply", SHM_ROTATION)
    finally:
        client.delete("/v1/shm/regions/fuzz")
    post_with_each_hostile_number(
        client, "/v1/shm/regions", region, after_each=lambda: client.delete("/v1/shm/regions/fuzz")
    )


def request_models() -> set[type[BaseModel]]:
    """Every request model of the API: the StrictModel subclasses, recursively, that the service defines (models
    that other tests define for themselves are not the API's)."""
    found: set[type[BaseModel]] = set()
    pending = list(StrictModel.__subclasses__())
    while pending:
        model = pending.pop()
        found.add(model)
        pending.extend(model.__subclasses__())
    return {model for model in found if model.__module__.startswith("ropeserve.")}


def _is_numeric(annotation: Any) -> bool:
    return annotation in (int, float) or any(_is_numeric(arg) for arg in get_args(annotation))


def test_the_base_requests_set_every_numeric_field_of_every_request_model() -> None:
    bodies = [body for _, body in JSON_CASES.values()] + [params for _, _, params in TENSOR_CASES.values()]
    bodies += [SHM_REGION, SHM_ROTATION]
    fuzzed = {leaf[i] for body in bodies for leaf in numeric_leaves(body) for i in range(len(leaf))}
    numeric = {
        f"{model.__name__}.{name}"
        for model in request_models()
        for name, field in model.model_fields.items()
        if _is_numeric(field.annotation)
    }
    missing = sorted(field for field in numeric if field.split(".")[1] not in fuzzed)
    assert not missing, f"numeric request fields no base request sets (add them above): {missing}"
