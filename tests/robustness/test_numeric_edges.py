"""Numeric edge cases through the API: clear 4xx naming the field, or a documented defined answer."""

from __future__ import annotations

import json
import math
from typing import Any

import httpx
import pytest
import torch
from hostile_json import HUGE_INT, with_literal
from safetensors.torch import load, save

from support import (
    RESAMPLE,
    ROPE,
    ROPE_APPLY,
    SAFETENSORS,
    TENSOR_ENDPOINTS,
    assert_problem,
    raw_safetensors,
    rope_body,
)

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


# ------------------------------------------------------- issue 13 items 4, 5 and 10: 4xx naming the field, never 500
DEEP_HEADER = b'{"x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
LONG_INT_HEADER = b'{"q": {"dtype": "F32", "shape": [' + b"9" * 5000 + b'], "data_offsets": [0, 0]}}'
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096}
LLAMA_CONFIG = {"model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32, "max_position_embeddings": 8192}
QWEN25_ROWS = [[{"text": 2}, {"video": [2, 4, 4], "second_per_grid_t": 1.0}, {"text": 2}]]
ZERO_WIDTH_TABLE = save(
    {"table": torch.zeros(17, 0)},
    metadata={"ropeserve": json.dumps({"source_grid": [4, 4], "target_grid": [3, 3], "prefix_rows": 1})},
)


def explicit(rope: dict[str, Any], key: str, literal: str) -> str:
    return with_literal({"rope": ROPE | rope | {key: 0}, "positions": [1]}, ("rope", key), literal)


HOSTILE_JSON: dict[str, tuple[str, str, str]] = {
    "rope_theta 10**400": (COS_SIN, explicit({}, "rope_theta", HUGE_INT), "rope.rope_theta"),
    "factor 10**400": (COS_SIN, explicit({"rope_type": "linear"}, "factor", HUGE_INT), "rope.factor"),
    "original_max_position_embeddings 10**400": (
        COS_SIN,
        explicit(YARN, "original_max_position_embeddings", HUGE_INT),
        "rope.original_max_position_embeddings",
    ),
    "max_position_embeddings 10**400": (
        COS_SIN,
        explicit({}, "max_position_embeddings", HUGE_INT),
        "rope.max_position_embeddings",
    ),
    "hidden_size 10**400": (
        COS_SIN,
        with_literal({"config": LLAMA_CONFIG, "positions": [1]}, ("config", "hidden_size"), HUGE_INT),
        "hidden_size",
    ),
    "model_max_length 10**400": (
        "/v1/config/validate",
        with_literal(
            {"config": LLAMA_CONFIG, "tokenizer_config": {"model_max_length": 0}},
            ("tokenizer_config", "model_max_length"),
            HUGE_INT,
        ),
        "model_max_length",
    ),
    "lint max_position_embeddings 10**400": (
        "/v1/config/validate",
        with_literal({"config": LLAMA_CONFIG}, ("config", "max_position_embeddings"), HUGE_INT),
        "max_position_embeddings",
    ),
    "lint hidden_size 10**400": (
        "/v1/config/validate",
        with_literal({"config": LLAMA_CONFIG}, ("config", "hidden_size"), HUGE_INT),
        "hidden_size",
    ),
    "lint engine of 5000 digits": (
        "/v1/config/validate",
        json.dumps({"config": LLAMA_CONFIG, "intent": {"engines": ["vllm==" + "9" * 5000]}}),
        "engines",
    ),
    "yarn beta_fast 1e308": (COS_SIN, explicit(YARN, "beta_fast", "1e308"), "rope.beta_fast"),
    "yarn beta_slow 5e-324": (COS_SIN, explicit(YARN, "beta_slow", "5e-324"), "rope.beta_slow"),
    "vision_config list (mrope)": (
        "/v1/mrope/positions",
        json.dumps({"config": {"model_type": "qwen2_vl", "vision_config": [1]}, "rows": [[{"text": 3}]]}),
        "vision_config",
    ),
    "vision_config list (vision)": (
        "/v1/vision/rope",
        json.dumps({"config": {"vision_config": [1]}, "grid_thw": [[1, 2, 2]], "head_dim": 16}),
        "vision_config",
    ),
    "position_ids 2**64": (
        "/v1/mrope/cos-sin",
        json.dumps({"preset": "qwen2.5-vl-7b", "position_ids": [[2**64], [0], [0]]}),
        "position_ids",
    ),
    "vision theta Infinity": (
        "/v1/vision/rope",
        '{"grid_thw": [[1, 2, 2]], "head_dim": 16, "theta": Infinity}',
        "theta",
    ),
    # item 5: results past int64 are a 422, not a wrapped (negative) id
    "decode past int64": ("/v1/positions", json.dumps({"cache_lengths": [2**63 - 1], "num_new": 2}), "cache_lengths"),
    "packed past int64": (
        "/v1/positions",
        json.dumps({"segment_lengths": [3], "past_lengths": [2**63 - 2]}),
        "past_lengths",
    ),
    "mask past int64": (
        "/v1/positions",
        json.dumps({"attention_mask": [[1, 1, 1]], "past_lengths": [2**63 - 2]}),
        "past_lengths",
    ),
    "mrope decode past int64": (
        "/v1/mrope/decode-positions",
        json.dumps({"mrope_position_deltas": [5], "cache_lengths": [2**63 - 3]}),
        "cache_lengths",
    ),
    "second_per_grid_t 1e308": (
        "/v1/mrope/positions",
        with_literal({"family": "qwen2_5_vl", "rows": QWEN25_ROWS}, ("rows", 0, 1, "second_per_grid_t"), "1e308"),
        "second_per_grid_t",
    ),
    "tokens_per_second 1e308": (
        "/v1/mrope/positions",
        json.dumps({"family": "qwen2_5_vl", "tokens_per_second": 1e308, "rows": QWEN25_ROWS}),
        "tokens_per_second",
    ),
    # item 10: a typo in an explicit rope object is an error, not a silent default
    "explicit rope typo rope_thetaa": (
        COS_SIN,
        json.dumps({"rope": {"rope_thetaa": 500000.0, "head_dim": 16}, "positions": [1]}),
        "rope.rope_thetaa",
    ),
    "explicit rope typo rope_typ": (
        COS_SIN,
        json.dumps({"rope": {"rope_typ": "linear", "factor": 4.0, "head_dim": 16}, "positions": [1]}),
        "rope.rope_typ",
    ),
    "explicit rope key of another type": (
        COS_SIN,
        json.dumps({"rope": {"rope_type": "default", "factor": 4.0, "head_dim": 16}, "positions": [1]}),
        "rope.factor",
    ),
}


@pytest.mark.parametrize(("path", "text", "field"), list(HOSTILE_JSON.values()), ids=list(HOSTILE_JSON))
def test_hostile_json_is_a_422_naming_the_field(guarded: httpx.Client, path: str, text: str, field: str) -> None:
    """Each of these was a 500 (or, for int64 results, a 200 with wrapped ids) before issue 13. The field is
    matched by its last key, in whichever notation (JSON pointer or dotted path) the problem writes it."""
    response = guarded.post(path, content=text, headers={"content-type": "application/json"})
    document = assert_problem(response, {422})
    assert field in document.get("field", ""), document


@pytest.mark.parametrize(
    ("path", "body", "detail"),
    [
        *[(path, raw_safetensors(DEEP_HEADER), "nested 100001 deep") for path in TENSOR_ENDPOINTS],
        *[(path, raw_safetensors(LONG_INT_HEADER), "an integer of 5000 digits") for path in TENSOR_ENDPOINTS],
    ],
    ids=[f"{kind} {path}" for kind in ("deep header", "5000-digit header integer") for path in TENSOR_ENDPOINTS],
)
def test_hostile_safetensors_header_is_a_400(guarded: httpx.Client, path: str, body: bytes, detail: str) -> None:
    document = assert_problem(guarded.post(path, content=body, headers=SAFETENSORS), {400})
    assert document["field"] == "body" and detail in document["detail"], document


def test_zero_width_resample_table_is_a_422(guarded: httpx.Client) -> None:
    document = assert_problem(guarded.post(RESAMPLE, content=ZERO_WIDTH_TABLE, headers=SAFETENSORS), {422})
    assert document["field"] == "table", document


def test_lint_of_extreme_finite_values_is_a_report(guarded: httpx.Client) -> None:
    """YaRN beta_fast 1e308 and video_fps 1e308 crashed the linter; they are linted (200), like any config value."""
    config = LLAMA_CONFIG | {"rope_scaling": YARN | {"beta_fast": 1e308}}
    response = guarded.post("/v1/config/validate", json={"config": config, "intent": {"video_fps": 1e308}})
    assert response.status_code == 200, response.text
    assert response.json()["model"]["layers"] == {"full_attention": "yarn"}


def test_the_largest_int64_positions_are_exact(guarded: httpx.Client) -> None:
    """The overflow checks are exact: positions ending at 2**63 - 1 are served, one more is refused."""
    response = guarded.post("/v1/positions", json={"cache_lengths": [2**63 - 2], "num_new": 2})
    assert response.status_code == 200, response.text
    assert response.json()["positions"] == [[2**63 - 2, 2**63 - 1]]
    response = guarded.post("/v1/positions", json={"segment_lengths": [2], "past_lengths": [2**63 - 2]})
    assert response.json()["positions"] == [2**63 - 2, 2**63 - 1]
