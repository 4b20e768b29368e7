"""The client against a real ropeserve (uvicorn subprocess on loopback, see conftest.py).

Every endpoint the client has a method for must be on the server (checked against its OpenAPI document).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest
import torch

import ropeserve_client as rc

ROPE_8 = {"rope_type": "default", "rope_theta": 10000.0, "head_dim": 8}


@pytest.fixture(scope="module")
def live_paths(ropeserve_url: str) -> set[str]:
    return set(httpx.get(f"{ropeserve_url}/openapi.json", timeout=10).json()["paths"])


@pytest.fixture
def client(ropeserve_url: str) -> Iterator[rc.Client]:
    with rc.Client(ropeserve_url) as client:
        yield client


def needs(live_paths: set[str], path: str) -> None:
    assert path in live_paths, f"{path} is not on the server"


def test_operations_endpoints(client: rc.Client) -> None:
    assert client.live() == {"status": "live"}
    assert client.ready() == client.health() == {"status": "ready"}
    info = client.info()
    assert "llama-3.1-8b" in info["presets"] and "yarn" in info["rope_types"]
    assert "ropeserve_http_requests_total" in client.metrics()


def test_readme_example_values(client: rc.Client) -> None:
    result = client.cos_sin([1], rope=ROPE_8)
    assert result["cos"].shape == (1, 8) and result["cos"].dtype == torch.float32
    expected_cos = torch.tensor([0.5403023, 0.9950042, 0.99995, 0.9999995] * 2)
    expected_sin = torch.tensor([0.841471, 0.0998334, 0.0099998, 0.001] * 2)
    torch.testing.assert_close(result["cos"][0], expected_cos, rtol=0, atol=1e-6)
    torch.testing.assert_close(result["sin"][0], expected_sin, rtol=0, atol=1e-6)
    assert result.meta["rope_type"] == "default" and result.request_id


def test_safetensors_and_json_wires_agree(ropeserve_url: str) -> None:
    with rc.Client(ropeserve_url) as binary, rc.Client(ropeserve_url, wire="json", array_backend="numpy") as text:
        exact = binary.cos_sin("0:64", preset="llama-3.1-8b", dtype="bfloat16")
        via_json = text.cos_sin(range(64), preset="llama-3.1-8b", dtype="bfloat16")
    assert exact["cos"].dtype == torch.bfloat16 and via_json["cos"].dtype == np.float32
    assert np.array_equal(exact["cos"].float().numpy(), via_json["cos"])
    assert exact.meta["attention_factor"] == via_json.meta["attention_factor"]


def test_server_errors_arrive_typed(client: rc.Client, ropeserve_url: str) -> None:
    with pytest.raises(rc.InvalidInput) as invalid:
        client.cos_sin([1], rope={**ROPE_8, "rope_type": "nope"})
    assert invalid.value.field and "nope" in invalid.value.detail and invalid.value.request_id
    with pytest.raises(rc.LimitExceeded) as limit:
        client.cos_sin(range(2_000_000), rope=ROPE_8)
    assert limit.value.limit == client.info()["limits"]["max_positions"]
    with pytest.raises(rc.NotFound):
        client.request("POST", "/v1/no-such-endpoint", json={})
    with rc.Client(ropeserve_url, wire="json") as text, pytest.raises(rc.NotAcceptable):
        text.cos_sin(range(10_000), preset="llama-3.1-8b")


def test_async_client_runs_concurrent_requests(ropeserve_url: str) -> None:
    async def scenario() -> list[rc.TensorResult]:
        async with rc.AsyncClient(ropeserve_url) as client:
            calls = [client.cos_sin(range(n), preset="qwen3-8b") for n in range(1, 9)]
            return list(await asyncio.gather(*calls))

    results = asyncio.run(scenario())
    assert [result["cos"].shape[0] for result in results] == list(range(1, 9))


def test_classic_position_encodings(client: rc.Client, live_paths: set[str]) -> None:
    needs(live_paths, "/v1/pe/sinusoidal")
    assert client.sinusoidal("0:4", dim=8)["table"].shape == (4, 8)
    alibi = client.alibi(num_heads=8, query_len=3, key_len=5)
    assert alibi["slopes"].shape == (8,) and alibi["bias"].shape == (8, 3, 5)
    relative = client.relative(query_len=4, key_len=6, num_buckets=8)
    assert relative["relative_index"].shape == (4, 6) and relative.meta["table_rows"] == 8
    assert client.sincos_2d(grid_h=2, grid_w=3, dim=8, cls_token=True)["table"].shape == (7, 8)


def test_resample_sends_and_receives_safetensors(client: rc.Client, live_paths: set[str]) -> None:
    needs(live_paths, "/v1/pe/resample")
    table = torch.randn(1 + 4 * 4, 16, dtype=torch.bfloat16)
    result = client.resample(table, source_grid=[4, 4], target_grid=[6, 2], prefix_rows=1)
    assert result["table"].shape == (1 + 6 * 2, 16) and result["table"].dtype == torch.bfloat16
    assert torch.equal(result["table"][0], table[0])


def test_one_d_positions(client: rc.Client, live_paths: set[str]) -> None:
    needs(live_paths, "/v1/positions")
    result = client.positions(attention_mask=[[0, 1, 1], [1, 1, 1]])
    assert next(iter(result.values())).tolist() == [[0, 0, 1], [0, 1, 2]]


def test_mrope_positions_and_decode(client: rc.Client, live_paths: set[str]) -> None:
    needs(live_paths, "/v1/mrope/positions")
    prefill = client.mrope_positions(family="qwen2_vl", rows=[[{"text": 2}, {"image": [1, 4, 4]}, {"text": 1}]])
    position_ids = prefill["position_ids"]
    assert position_ids.shape == (3, 1, 7)
    needs(live_paths, "/v1/mrope/decode-positions")
    deltas = prefill["mrope_position_deltas"]
    decode = client.mrope_decode_positions(mrope_position_deltas=deltas, cache_lengths=[7], num_new=2)
    assert decode["position_ids"].shape == (3, 1, 2)


def test_apply_rope_matches_cos_sin(client: rc.Client, live_paths: set[str]) -> None:
    needs(live_paths, "/v1/rope/apply")
    q, k = torch.randn(1, 4, 5, 8), torch.randn(1, 2, 5, 8)
    rotated = client.apply_rope(q, k, positions=list(range(5)), rope=ROPE_8, layout="bhtd")
    table = client.cos_sin(range(5), rope=ROPE_8)
    cos, sin = table["cos"][None, None], table["sin"][None, None]
    expected_q = q * cos + torch.cat((-q[..., 4:], q[..., :4]), dim=-1) * sin
    torch.testing.assert_close(rotated["q"], expected_q)
    assert rotated["k"].shape == k.shape


def test_apply_rope_with_the_callers_table_over_a_socket(client: rc.Client, live_paths: set[str]) -> None:
    """A real uvicorn: ropeserve's own table sent back gives the plain answer; vLLM's [B, S, H*D] layout too."""
    needs(live_paths, "/v1/rope/apply")
    own = client.cos_sin(range(8), rope=ROPE_8)
    cache = torch.cat((own["cos"][:, :4], own["sin"][:, :4]), dim=-1)
    q, k = torch.randn(2, 3, 4 * 8), torch.randn(2, 3, 8)
    positions = torch.tensor([[0, 1, 2], [5, 6, 7]])
    plain = client.apply_rope(q, k, positions=positions, rope=ROPE_8, layout="batched_flat")
    rotated = client.apply_rope(q, k, positions=positions, rope=ROPE_8, layout="batched_flat", table=cache)
    assert torch.equal(rotated["q"], plain["q"]) and torch.equal(rotated["k"], plain["k"])
    assert rotated.meta["table"]["max_abs_error"] == 0.0
    flat = client.apply_rope(
        q.flatten(0, 1), k.flatten(0, 1), positions=positions.flatten(), rope=ROPE_8, layout="flat"
    )
    assert torch.equal(plain["q"].flatten(0, 1), flat["q"])
    with pytest.raises(rc.InvalidInput) as too_far:
        client.apply_rope(q, k, positions=positions + 1, rope=ROPE_8, layout="batched_flat", table=cache)
    assert too_far.value.field == "positions"


def test_concurrent_rotations_with_their_own_tables_stay_apart(ropeserve_url: str, live_paths: set[str]) -> None:
    """Same shapes and params (one batch key but for the table): each answer is rotated with its own table."""
    needs(live_paths, "/v1/rope/apply")

    def rotated_as_expected(seed: int) -> bool:
        generator = torch.Generator().manual_seed(seed)
        cos, sin = torch.randn(32, 4, generator=generator), torch.randn(32, 4, generator=generator)
        q, positions = torch.randn(6, 2 * 8, generator=generator), torch.randint(0, 32, (6,), generator=generator)
        with rc.Client(ropeserve_url) as own_client:
            got = own_client.apply_rope(q, positions=positions, rope=ROPE_8, layout="flat", table=(cos, sin))
        heads = q.view(6, 2, 8)
        cos_rows, sin_rows = (torch.cat((t, t), dim=-1)[positions][:, None] for t in (cos, sin))
        expected = heads * cos_rows + torch.cat((-heads[..., 4:], heads[..., :4]), dim=-1) * sin_rows
        return torch.equal(got["q"], expected.reshape(6, 16))

    with ThreadPoolExecutor(max_workers=8) as pool:
        assert all(pool.map(rotated_as_expected, range(24)))


def test_config_lint(client: rc.Client, live_paths: set[str]) -> None:
    needs(live_paths, "/v1/config/validate")
    config = {"model_type": "llama", "rope_scaling": {"rope_type": "yarn", "factor": -1}, "head_dim": 64}
    report = client.validate_config(config, engines=["vllm"])
    assert not report.clean and any(finding.severity == "error" for finding in report.findings)
