"""``/v1/rope/apply`` and ``/v1/mrope/apply`` with the caller's own cos/sin table in the body (``cos_sin_cache``, or
``cos`` and ``sin``) against transformers' ``apply_rotary_pos_emb`` fed with rows of that table; vLLM's
``[B, S, H*D]`` layout (``batched_flat``) against the ``[T, H*D]`` answer; every refusal as problem+json.

The tables here are random (not rope values at all), so an answer equal to transformers' can only come from
rotating with the caller's rows."""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch
from fastapi.testclient import TestClient
from safetensors.torch import load, save
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb
from transformers.models.qwen2_vl.modeling_qwen2_vl import apply_rotary_pos_emb as qwen2_vl_apply_rotary_pos_emb

from ropeserve.api import create_app
from ropeserve.config import normalize_config
from ropeserve.rope import rope_cos_sin
from ropeserve.serving import rotation
from ropeserve.settings import Settings

SAFETENSORS = {"content-type": "application/x-safetensors"}
ROPE = {"rope_theta": 10_000.0, "head_dim": 16}
ROWS, HEAD_DIM = 64, 16
QWEN2_VL = {
    "model_type": "qwen2_vl",
    "hidden_size": 256,
    "num_attention_heads": 2,
    "rope_theta": 1_000_000.0,
    "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
}
"""head_dim 128: 64 frequency slots, T/H/W sections of 16, 24 and 24 (chunked, as Qwen2-VL)."""
MAX_TABLE_ELEMENTS = 1 << 14


@pytest.fixture(scope="module")
def client() -> TestClient:
    settings = Settings(access_log=False, max_table_elements=MAX_TABLE_ELEMENTS)
    with TestClient(create_app(settings), raise_server_exceptions=False) as test_client:
        yield test_client


def post(client: TestClient, path: str, tensors: dict[str, torch.Tensor], params: dict[str, Any]) -> Any:
    return client.post(path, content=save(tensors, metadata={"ropeserve": json.dumps(params)}), headers=SAFETENSORS)


def rotate(
    client: TestClient, path: str, tensors: dict[str, torch.Tensor], params: dict[str, Any]
) -> tuple[dict, dict]:
    response = post(client, path, tensors, params)
    assert response.status_code == 200, response.text
    header = json.loads(response.content[8 : 8 + int.from_bytes(response.content[:8], "little")])
    return load(response.content), json.loads(header["__metadata__"]["ropeserve"])


def random_half_table(rows: int, width: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A caller's half-width cos and sin [rows, width]: random values, nothing like ropeserve's."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(rows, width, generator=generator), torch.randn(rows, width, generator=generator)


def table_tensors(form: str, cos_half: torch.Tensor, sin_half: torch.Tensor) -> dict[str, torch.Tensor]:
    """The body's table in one of the accepted forms (NeoX pairing)."""
    if form == "cos_sin_cache":
        return {"cos_sin_cache": torch.cat((cos_half, sin_half), dim=-1)}
    if form == "half":
        return {"cos": cos_half, "sin": sin_half}
    return {"cos": torch.cat((cos_half, cos_half), dim=-1), "sin": torch.cat((sin_half, sin_half), dim=-1)}


def full(half: torch.Tensor) -> torch.Tensor:
    return torch.cat((half, half), dim=-1)


@pytest.mark.parametrize("form", ["cos_sin_cache", "half", "full"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_rope_apply_with_the_callers_table_equals_transformers(
    client: TestClient, dtype: torch.dtype, form: str
) -> None:
    cos_half, sin_half = (t.to(dtype) for t in random_half_table(ROWS, HEAD_DIM // 2, seed=1))
    q, k = torch.randn(2, 3, 5, HEAD_DIM).to(dtype), torch.randn(2, 1, 5, HEAD_DIM).to(dtype)
    positions = torch.randint(0, ROWS, (2, 5), generator=torch.Generator().manual_seed(2))
    tensors = {"q": q, "k": k, "positions": positions, **table_tensors(form, cos_half, sin_half)}
    out, meta = rotate(client, "/v1/rope/apply", tensors, {"rope": ROPE, "layout": "bhtd"})
    expected_q, expected_k = apply_rotary_pos_emb(q, k, full(cos_half)[positions], full(sin_half)[positions])
    assert torch.equal(out["q"], expected_q) and torch.equal(out["k"], expected_k)
    assert meta["table"]["rows"] == ROWS and meta["table"]["first_differing_position"] == 0
    assert meta["table"]["max_abs_error"] > 0.1 and meta["attention_factor"] is None


def test_mrope_apply_with_the_callers_table_equals_transformers(client: TestClient) -> None:
    """Each frequency slot takes its row from the T, H or W position (transformers' Qwen2-VL rotary picks the
    sections of the angles; with a table, of the rows)."""
    cos_half, sin_half = random_half_table(ROWS, 64, seed=3)
    q, k = torch.randn(1, 2, 6, 128), torch.randn(1, 2, 6, 128)
    positions = torch.randint(0, ROWS, (3, 6), generator=torch.Generator().manual_seed(4))
    tensors = {"q": q, "k": k, "positions": positions, "cos_sin_cache": torch.cat((cos_half, sin_half), dim=-1)}
    out, _ = rotate(client, "/v1/mrope/apply", tensors, {"config": QWEN2_VL, "layout": "bhtd"})

    def per_slot(half: torch.Tensor) -> torch.Tensor:  # [3, T, 64] rows -> [1, T, 128], section i from axis i % 3
        chunks = half[positions].split([16, 24, 24], dim=-1)
        return full(torch.cat([chunk[i % 3] for i, chunk in enumerate(chunks)], dim=-1))[None]

    expected_q, expected_k = qwen2_vl_apply_rotary_pos_emb(q, k, per_slot(cos_half), per_slot(sin_half))
    assert torch.equal(out["q"], expected_q) and torch.equal(out["k"], expected_k)


@pytest.mark.parametrize(
    ("path", "params", "positions"),
    [
        ("/v1/rope/apply", {"rope": ROPE}, torch.tensor([[3, 0, 63, 9], [1, 1, 2, 40]])),
        ("/v1/mrope/apply", {"config": QWEN2_VL}, torch.tensor([[3, 0, 63, 9], [1, 1, 2, 40], [5, 6, 7, 8]])),
    ],
)
def test_ropeserves_own_table_sent_back_gives_the_plain_answer(
    client: TestClient, path: str, params: dict, positions: torch.Tensor
) -> None:
    head_dim = HEAD_DIM if "rope" in params else 128
    config = {"rope_parameters": ROPE, "head_dim": HEAD_DIM} if "rope" in params else QWEN2_VL
    own = rope_cos_sin(normalize_config(config).params(), torch.arange(ROWS), cache=None)
    half = head_dim // 2
    cache = torch.cat((own.cos[:, :half], own.sin[:, :half]), dim=-1)
    q, k = torch.randn(2, 4, 2 * head_dim).to(torch.bfloat16), torch.randn(2, 4, head_dim).to(torch.bfloat16)
    params = {**params, "layout": "batched_flat"}
    plain, plain_meta = rotate(client, path, {"q": q, "k": k, "positions": positions}, params)
    with_table, meta = rotate(client, path, {"q": q, "k": k, "positions": positions, "cos_sin_cache": cache}, params)
    assert torch.equal(with_table["q"], plain["q"]) and torch.equal(with_table["k"], plain["k"])
    expected = {"rows": ROWS, "max_abs_error": 0.0, "non_finite": False, "first_differing_position": None, "atol": 0.0}
    assert meta["table"] == expected and plain_meta["table"] is None


@pytest.mark.parametrize(
    ("path", "params", "positions"),
    [
        ("/v1/rope/apply", {"rope": ROPE}, torch.tensor([[0, 1, 2, 3, 4], [9, 8, 7, 6, 5]])),
        ("/v1/mrope/apply", {"config": QWEN2_VL}, torch.randint(0, 50, (3, 2, 5))),
    ],
)
@pytest.mark.parametrize("with_table", [False, True])
def test_batched_flat_layout_equals_the_flat_answer(
    client: TestClient, path: str, params: dict, positions: torch.Tensor, with_table: bool
) -> None:
    head_dim = HEAD_DIM if "rope" in params else 128
    q, k = torch.randn(2, 5, 3 * head_dim), torch.randn(2, 5, head_dim)
    table = table_tensors("cos_sin_cache", *random_half_table(ROWS, head_dim // 2, seed=5)) if with_table else {}
    batched, _ = rotate(
        client, path, {"q": q, "k": k, "positions": positions, **table}, params | {"layout": "batched_flat"}
    )
    flat_inputs = {"q": q.flatten(0, 1), "k": k.flatten(0, 1), "positions": positions.flatten(-2), **table}
    flat, _ = rotate(client, path, flat_inputs, params | {"layout": "flat"})
    assert batched["q"].shape == q.shape and batched["k"].shape == k.shape
    assert torch.equal(batched["q"].flatten(0, 1), flat["q"]) and torch.equal(batched["k"].flatten(0, 1), flat["k"])


def cache_of(rows: int = ROWS, width: int = HEAD_DIM) -> torch.Tensor:
    return table_tensors("cos_sin_cache", *random_half_table(rows, width // 2, seed=6))["cos_sin_cache"]


BASE = {"q": torch.randn(4, 2 * HEAD_DIM), "positions": torch.tensor([0, 5, 9, 63])}
REFUSALS: dict[str, tuple[dict[str, Any], dict[str, Any], str]] = {
    "position past the table": (
        {"cos_sin_cache": cache_of(), "positions": torch.tensor([0, 1, 2, 64])},
        {},
        "positions",
    ),
    "negative position": ({"cos_sin_cache": cache_of(), "positions": torch.tensor([0, -1, 2, 3])}, {}, "positions"),
    "cache of the wrong width": ({"cos_sin_cache": cache_of(width=HEAD_DIM + 2)}, {}, "cos_sin_cache"),
    "cache of three dims": ({"cos_sin_cache": cache_of()[None]}, {}, "cos_sin_cache"),
    "cos and sin of other shapes": ({"cos": torch.zeros(ROWS, 8), "sin": torch.zeros(ROWS - 1, 8)}, {}, "sin"),
    "cos of a width neither half nor full": ({"cos": torch.zeros(ROWS, 6), "sin": torch.zeros(ROWS, 6)}, {}, "cos"),
    "cos without sin": ({"cos": torch.zeros(ROWS, 8)}, {}, "cos_sin_cache"),
    "cache and cos": ({"cos_sin_cache": cache_of(), "cos": torch.zeros(ROWS, 8)}, {}, "cos_sin_cache"),
    "integer table": ({"cos_sin_cache": cache_of().to(torch.int32)}, {}, "cos_sin_cache"),
    "float64 table": ({"cos_sin_cache": cache_of().double()}, {}, "cos_sin_cache"),
    "float64 sin": ({"cos": torch.zeros(ROWS, 8), "sin": torch.zeros(ROWS, 8, dtype=torch.float64)}, {}, "sin"),
    "q of the wrong dtype": ({"cos_sin_cache": cache_of(), "q": torch.zeros(4, 32, dtype=torch.int32)}, {}, "q"),
    "table rotary_dim other than the params'": ({"cos_sin_cache": cache_of()}, {"rotary_dim": 8}, "cos_sin_cache"),
    "2-D q in batched_flat": ({"cos_sin_cache": cache_of()}, {"layout": "batched_flat"}, "q"),
    "batched_flat q not a multiple of head_dim": (
        {"cos_sin_cache": cache_of(), "q": torch.zeros(1, 4, 2 * HEAD_DIM + 1)},
        {"layout": "batched_flat"},
        "q",
    ),
    "negative atol": ({"cos_sin_cache": cache_of()}, {"atol": -1.0}, "atol"),
}


def problem_of(response: Any, slug: str = "invalid-input") -> dict[str, Any]:
    assert response.status_code == 422, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    document = response.json()
    assert document["type"].endswith("/" + slug) and document["status"] == 422
    return document


@pytest.mark.parametrize("case", REFUSALS)
def test_each_refusal_is_a_problem_naming_the_field(client: TestClient, case: str) -> None:
    change, params, field = REFUSALS[case]
    for path in ("/v1/rope/apply", "/v1/rope/apply-table"):
        response = post(client, path, {**BASE, **change}, {"rope": ROPE, "layout": "flat", **params})
        assert problem_of(response)["field"] == field


def test_apply_table_refuses_a_body_without_a_table(client: TestClient) -> None:
    assert problem_of(post(client, "/v1/rope/apply-table", BASE, {"rope": ROPE}))["field"] == "cos_sin_cache"


def test_a_table_past_the_limit_is_refused_before_any_work(client: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    """max_table_elements bounds cos+sin; nothing is compared or copied for a table past it."""
    work: list[str] = []
    monkeypatch.setattr(rotation, "compare_table", lambda *args, **kwargs: work.append("compare"))
    monkeypatch.setattr(rotation.CallerTable, "of", classmethod(lambda cls, *args: work.append("copy")))
    rows = MAX_TABLE_ELEMENTS // HEAD_DIM + 1  # 2 * rows * HEAD_DIM/2 elements: one row too many
    response = post(
        client, "/v1/rope/apply", {**BASE, "cos_sin_cache": cache_of(rows)}, {"rope": ROPE, "layout": "flat"}
    )
    document = problem_of(response, "limit-exceeded")
    assert document["field"] == "cos_sin_cache" and document["limit"] == MAX_TABLE_ELEMENTS
    assert work == []


def test_comparing_a_table_grows_the_shared_table_no_further_than_the_limit() -> None:
    """The comparison reads ropeserve's rows from the shared cache, which grows to a power of two of rows: for a
    caller's table within max_table_elements that growth may pass it (600 rows x 8 of cos + sin: 9,600 elements
    of 10,000; the cached table grew to 1,024 rows: 16,384), which ropeserve's own table refuses for the same
    positions. Past the limit, ropeserve's rows are computed for the comparison alone."""
    limit, rows = 10_000, 600
    rope = {"rope_theta": 10_000.0, "head_dim": HEAD_DIM}
    own = rope_cos_sin(normalize_config({"rope_parameters": rope, "head_dim": HEAD_DIM}).params(), torch.arange(rows))
    cache = torch.cat((own.cos[:, : HEAD_DIM // 2], own.sin[:, : HEAD_DIM // 2]), dim=-1)
    body = {**BASE, "cos_sin_cache": cache, "positions": torch.tensor([0, 5, rows - 1, 3])}
    with TestClient(create_app(Settings(access_log=False, max_table_elements=limit))) as client:
        tables = client.app.state.runtime.tables._tables  # type: ignore[attr-defined]
        before = set(tables)
        _, meta = rotate(client, "/v1/rope/apply", body, {"rope": rope, "layout": "flat"})
        assert meta["table"]["rows"] == rows and meta["table"]["first_differing_position"] is None
        grown = [2 * tables[key].rows[0].numel() for key in set(tables) - before]
        assert grown and max(grown) <= limit
        refused = post(client, "/v1/rope/apply", {**BASE, "positions": body["positions"]}, {"rope": rope})
        assert problem_of(refused, "limit-exceeded")["field"] == "positions"  # ropeserve's own table, likewise
