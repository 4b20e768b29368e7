"""``transport="shm"`` of the Python client against a live server: same answers as HTTP, regions made, reused
only when no result views them, and removed at close."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch

from ropeserve_client import AsyncClient, Client
from ropeserve_client._shm import KEY_PREFIX, SHM_DIRECTORY

ROPE = {"rope_theta": 10_000.0, "head_dim": 16}
MROPE_PRESET = "qwen2.5-vl-7b"


def qk(seed: int, dtype: torch.dtype = torch.bfloat16, head_dim: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    q = torch.randn(1, 4, 32, head_dim, generator=generator).to(dtype)
    k = torch.randn(1, 2, 32, head_dim, generator=generator).to(dtype)
    return q, k


def own_objects(client: Client | AsyncClient) -> set[Path]:
    return {SHM_DIRECTORY / region.key for region in client._shm.regions}


def test_shm_rotation_equals_http_for_torch_and_numpy(ropeserve_url: str) -> None:
    q, k = qk(0)
    positions = torch.arange(100, 132)
    with Client(ropeserve_url) as client:
        over_http = client.apply_rope(q, k, positions=positions, rope=ROPE)
        shared = client.apply_rope(q, k, positions=positions, rope=ROPE, transport="shm")
        assert torch.equal(shared["q"], over_http["q"]) and torch.equal(shared["k"], over_http["k"])
        assert shared.meta["dtype"] == "bfloat16"
        assert torch.equal(q, qk(0)[0])  # the caller's tensors are not touched
        q32 = q.float().numpy()
        with Client(ropeserve_url, array_backend="numpy") as numpy_client:
            from_numpy = numpy_client.apply_rope(q32, positions=list(range(32)), rope=ROPE, transport="shm")
            expected = numpy_client.apply_rope(q32, positions=list(range(32)), rope=ROPE)
        assert isinstance(from_numpy["q"], np.ndarray)
        np.testing.assert_array_equal(from_numpy["q"], expected["q"])


def test_shm_mrope_equals_http(ropeserve_url: str) -> None:
    q, k = qk(1, torch.float32, head_dim=128)
    positions = torch.stack([torch.arange(32), torch.arange(32) // 4, torch.arange(32) % 4])
    with Client(ropeserve_url) as client:
        over_http = client.apply_mrope(q, k, positions=positions, preset=MROPE_PRESET)
        shared = client.apply_mrope(q, k, positions=positions, preset=MROPE_PRESET, transport="shm")
    assert torch.equal(shared["q"], over_http["q"]) and torch.equal(shared["k"], over_http["k"])


def test_regions_are_reused_only_when_no_result_views_them(ropeserve_url: str) -> None:
    with Client(ropeserve_url) as client:
        kept = client.apply_rope(*qk(2), positions=torch.arange(32), rope=ROPE, transport="shm")
        kept_q = kept["q"].clone()
        for seed in (3, 4):  # results dropped at once: one more region, reused
            client.apply_rope(*qk(seed), positions=torch.arange(32), rope=ROPE, transport="shm")
        assert len(client._shm.regions) == 2
        assert torch.equal(kept["q"], kept_q)  # the kept result was not overwritten
        del kept
        client.apply_rope(*qk(5), positions=torch.arange(32), rope=ROPE, transport="shm")
        assert len(client._shm.regions) == 2
        objects = own_objects(client)
        assert all(path.exists() for path in objects)
        listed = httpx.get(ropeserve_url + "/v1/shm/regions").json()["regions"]
        assert {"/" + path.name for path in objects} <= {region["key"] for region in listed}
    assert not any(path.exists() for path in objects)  # close() unlinks
    listed = httpx.get(ropeserve_url + "/v1/shm/regions").json()["regions"]
    assert not {"/" + path.name for path in objects} & {region["key"] for region in listed}  # and unregisters


def test_a_region_the_server_forgot_is_registered_again(ropeserve_url: str) -> None:
    with Client(ropeserve_url) as client:
        client.apply_rope(*qk(6), positions=torch.arange(32), rope=ROPE, transport="shm")
        name = client._shm.regions[0].name
        assert httpx.delete(f"{ropeserve_url}/v1/shm/regions/{name}").status_code == 204
        again = client.apply_rope(*qk(6), positions=torch.arange(32), rope=ROPE, transport="shm")
        assert torch.equal(again["q"], client.apply_rope(*qk(6), positions=torch.arange(32), rope=ROPE)["q"])


def test_async_client_shm(ropeserve_url: str) -> None:
    async def run() -> tuple[torch.Tensor, torch.Tensor, set[Path]]:
        async with AsyncClient(ropeserve_url) as client:
            q, k = qk(7)
            shared = await client.apply_rope(q, k, positions=torch.arange(32), rope=ROPE, transport="shm")
            over_http = await client.apply_rope(q, k, positions=torch.arange(32), rope=ROPE)
            objects = own_objects(client)
        return shared["q"], over_http["q"], objects

    shared, over_http, objects = asyncio.run(run())
    assert torch.equal(shared, over_http)
    assert objects and not any(path.exists() for path in objects)


def test_unknown_transport_is_refused(ropeserve_url: str) -> None:
    with Client(ropeserve_url) as client, pytest.raises(ValueError, match="transport"):
        client.apply_rope(*qk(8), positions=torch.arange(32), rope=ROPE, transport="tcp")
    assert KEY_PREFIX.startswith("ropeserve")  # the server's default key prefix admits the client's objects


def test_threads_sharing_a_client_get_their_own_results(ropeserve_url: str) -> None:
    """Calls from several threads at once never stage into the same region: each result is its own rotation."""
    with Client(ropeserve_url) as client:

        def one(seed: int) -> tuple[int, torch.Tensor]:
            result = client.apply_rope(*qk(seed), positions=torch.arange(32), rope=ROPE, transport="shm")
            return seed, result["q"]

        with ThreadPoolExecutor(4) as pool:
            results = list(pool.map(one, range(20, 32)))
        for seed, rotated in results:  # all results still held: none was overwritten by a later call
            assert torch.equal(rotated, client.apply_rope(*qk(seed), positions=torch.arange(32), rope=ROPE)["q"]), seed
        assert len(client._shm.regions) <= 8


def test_one_kept_tensor_keeps_its_region(ropeserve_url: str) -> None:
    """Keeping only ``q`` of a result (its k view gone) still holds the region: the next call takes another."""
    with Client(ropeserve_url) as client:
        kept_q = client.apply_rope(*qk(40), positions=torch.arange(32), rope=ROPE, transport="shm")["q"]
        expected = kept_q.clone()
        client.apply_rope(*qk(41), positions=torch.arange(32), rope=ROPE, transport="shm")
        assert torch.equal(kept_q, expected)
        assert len(client._shm.regions) == 2


def test_region_endpoints_register_list_and_unregister(ropeserve_url: str) -> None:
    key = f"{KEY_PREFIX}endpoint_test_{np.random.default_rng().integers(1 << 30)}"
    path = SHM_DIRECTORY / key
    path.write_bytes(bytes(4096))
    try:
        with Client(ropeserve_url) as client:
            registered = client.register_region("mine", "/" + key, 4096, read_only=True)
            assert registered["name"] == "mine"
            assert "mine" in str(client.list_regions())
            assert client.unregister_region("mine") == {}
            assert "mine" not in str(client.list_regions())
    finally:
        path.unlink(missing_ok=True)
