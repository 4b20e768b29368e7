"""AsyncClient over httpx.ASGITransport: the real app in-process, with the rotation service installed.

Covers the safetensors-in/safetensors-out rotation endpoints whether or not ``create_app`` wires them yet
(``routes_rotation.install`` is idempotent).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import httpx
import pytest
import torch

import ropeserve_client as rc

routes_rotation = pytest.importorskip("ropeserve.api.routes_rotation")
ROPE_8 = {"rope_type": "default", "rope_theta": 10000.0, "head_dim": 8}


def run_in_app(scenario: Callable[[rc.AsyncClient], Awaitable[None]]) -> None:
    from ropeserve.api import create_app
    from ropeserve.settings import Settings

    app = create_app(Settings(access_log=False, device="cpu"))
    routes_rotation.install(app)

    async def main() -> None:
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with rc.AsyncClient("http://ropeserve.asgi", transport=transport) as client:
                await scenario(client)

    asyncio.run(main())


def test_rotation_matches_the_cos_sin_tables() -> None:
    async def scenario(client: rc.AsyncClient) -> None:
        q, k = torch.randn(2, 4, 5, 8), torch.randn(2, 2, 5, 8)
        rotated = await client.apply_rope(q, k, positions=list(range(5)), rope=ROPE_8, layout="bhtd")
        table = await client.cos_sin(range(5), rope=ROPE_8)
        cos, sin = table["cos"][None, None], table["sin"][None, None]
        torch.testing.assert_close(rotated["q"], q * cos + torch.cat((-q[..., 4:], q[..., :4]), dim=-1) * sin)
        torch.testing.assert_close(rotated["k"], k * cos + torch.cat((-k[..., 4:], k[..., :4]), dim=-1) * sin)
        assert rotated.meta["layout"] == "bhtd" and rotated.meta["batch"]["tokens"] >= 5

    run_in_app(scenario)


def test_mrope_rotation_keeps_shape_and_dtype_and_errors_are_typed() -> None:
    async def scenario(client: rc.AsyncClient) -> None:
        q = torch.randn(1, 6, 28, 128, dtype=torch.bfloat16)
        k = torch.randn(1, 6, 4, 128, dtype=torch.bfloat16)
        positions = torch.arange(6).repeat(3, 1)
        rotated = await client.apply_mrope(q, k, positions=positions, preset="qwen2.5-vl-7b", layout="bthd")
        assert rotated["q"].shape == q.shape and rotated["q"].dtype == torch.bfloat16
        assert rotated.meta["mrope"]["section"] == [16, 24, 24]
        as_float = await client.apply_rope(q, None, positions=range(6), preset="llama-3.1-8b", layout="bthd",
                                           dtype="float32")  # fmt: skip
        assert as_float["q"].dtype == torch.float32 and "k" not in as_float
        with pytest.raises(rc.InvalidInput) as missing_section:
            await client.apply_mrope(q, k, positions=positions, preset="llama-3.1-8b", layout="bthd")
        assert missing_section.value.field == "mrope_section"
        with pytest.raises(rc.InvalidInput) as bad_positions:
            await client.apply_rope(q, k, positions=torch.arange(6.0), preset="llama-3.1-8b", layout="bthd")
        assert bad_positions.value.field == "positions"

    run_in_app(scenario)


def test_apply_rope_sends_the_callers_table_with_one_argument() -> None:
    """``table=``: a cos_sin_cache or a (cos, sin) pair; the server rotates with it (a scaled copy of ropeserve's
    own table gives a scaled rotation) and compares it with its own."""

    async def scenario(client: rc.AsyncClient) -> None:
        own = await client.cos_sin(range(16), rope=ROPE_8)
        cos, sin = 2 * own["cos"][:, :4], 2 * own["sin"][:, :4]  # an attention factor of 2 that ropeserve lacks
        q, k = torch.randn(5, 2 * 8), torch.randn(5, 8)
        positions = [3, 1, 4, 1, 5]
        plain = await client.apply_rope(q, k, positions=positions, rope=ROPE_8, layout="flat")
        from_cache = await client.apply_rope(
            q, k, positions=positions, rope=ROPE_8, layout="flat", table=torch.cat((cos, sin), dim=-1)
        )
        from_pair = await client.apply_rope(q, k, positions=positions, rope=ROPE_8, layout="flat", table=(cos, sin))
        assert torch.equal(from_cache["q"], from_pair["q"]) and torch.equal(from_cache["k"], from_pair["k"])
        torch.testing.assert_close(from_cache["q"], 2 * plain["q"])
        assert from_cache.meta["table"]["first_differing_position"] == 0 and plain.meta["table"] is None
        with pytest.raises(rc.InvalidInput) as beyond:
            await client.apply_rope(q, k, positions=[0, 1, 2, 3, 16], rope=ROPE_8, layout="flat", table=(cos, sin))
        assert beyond.value.field == "positions"
        with pytest.raises(ValueError, match="HTTP only"):
            await client.apply_rope(q, k, positions=positions, rope=ROPE_8, table=(cos, sin), transport="shm")

    run_in_app(scenario)


def test_apply_rope_table_and_vision_apply_through_the_client() -> None:
    async def scenario(client: rc.AsyncClient) -> None:
        table = await client.cos_sin(range(16), rope=ROPE_8)
        cache = torch.cat((table["cos"][:, :4], table["sin"][:, :4]), dim=-1)  # vLLM's layout
        q, k = torch.randn(5, 2 * 8), torch.randn(5, 8)
        own = await client.apply_rope(q, k, positions=[3, 1, 4, 1, 5], rope=ROPE_8, layout="flat")
        with_table = await client.apply_rope_table(q, k, positions=[3, 1, 4, 1, 5], cos_sin_cache=cache, rope=ROPE_8)
        assert torch.equal(with_table["q"], own["q"]) and torch.equal(with_table["k"], own["k"])
        assert with_table.meta["table"]["first_differing_position"] is None
        vision = {"grid_thw": [[1, 2, 2]], "spatial_merge_size": 2, "head_dim": 8}
        rotated = await client.apply_vision_rope(torch.randn(4, 2, 8), **vision)
        assert rotated["q"].shape == (4, 2, 8)

    run_in_app(scenario)
