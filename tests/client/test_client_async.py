"""AsyncClient: the same operations, retries and errors as Client, awaited."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
import torch
from client_mocks import Recorder, problem
from safetensors.torch import save

import ropeserve_client as rc

ANSWER = httpx.Response(
    200,
    content=save({"positions": torch.arange(4)}, metadata={"ropeserve": json.dumps({"count": 4})}),
    headers={"content-type": "application/x-safetensors"},
)


def async_client(recorder: Recorder, **options: object) -> rc.AsyncClient:
    transport = httpx.MockTransport(recorder.handle_async)
    return rc.AsyncClient("http://rs.test", transport=transport, **options)  # type: ignore[arg-type]


def test_async_methods_return_awaitables_of_the_same_results() -> None:
    recorder = Recorder(ANSWER)

    async def scenario() -> list[rc.TensorResult]:
        async with async_client(recorder) as client:
            return list(await asyncio.gather(*(client.positions(cache_lengths=[i]) for i in range(5))))

    results = asyncio.run(scenario())
    assert [result["positions"].tolist() for result in results] == [[0, 1, 2, 3]] * 5
    assert json.loads(recorder.requests[0].content) == {"cache_lengths": [0]}


def test_async_retries_honour_retry_after_and_errors_are_typed() -> None:
    sleeps: list[float] = []
    recorder = Recorder(problem(429, "overloaded", retry_after=2), problem(422, "invalid-input", field="positions"))

    async def record_sleep(seconds: float) -> None:
        sleeps.append(seconds)

    async def scenario() -> None:
        client = async_client(recorder, retry=rc.RetryPolicy(jitter=0.0))
        client._sleep = record_sleep  # type: ignore[method-assign]
        async with client:
            await client.cos_sin([0], preset="llama-3.1-8b")

    with pytest.raises(rc.InvalidInput) as info:
        asyncio.run(scenario())
    assert sleeps == [2.0] and info.value.field == "positions"


def test_sync_and_async_clients_expose_the_same_endpoints() -> None:
    def endpoints(cls: type) -> set[str]:
        return {name for name in dir(cls) if not name.startswith("_") and name not in {"close", "aclose"}}

    assert endpoints(rc.Client) == endpoints(rc.AsyncClient)
    assert rc.Client.cos_sin.__doc__ and "positions" in rc.Client.cos_sin.__doc__
