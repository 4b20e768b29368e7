"""Staging off CUDA degrades to plain copies (views where nothing changes, casts, no events, no waits); with a copy
stream the service stages off the event loop."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence

import torch
from safetensors.torch import save

from ropeserve.config import from_explicit
from ropeserve.rope.tables import TableCache
from ropeserve.serving import REQUIRED_TENSORS, RotationOptions, RotationService, decode_safetensors
from ropeserve.serving.rotation import INLINE_PREPARE_ELEMENTS
from ropeserve.serving.staging import DeviceStaging
from ropeserve.settings import Settings


def test_cpu_staging_keeps_request_memory_when_nothing_changes() -> None:
    staging = DeviceStaging(torch.device("cpu"))
    x = torch.arange(12, dtype=torch.float32).view(3, 4)
    on_device, ready = staging.to_device(x, None)
    assert on_device is x and ready is None and staging.stream is None


def test_cpu_staging_casts_into_new_memory() -> None:
    staging = DeviceStaging(torch.device("cpu"))
    x = torch.randn(3, 4)
    on_device, ready = staging.to_device(x, torch.bfloat16)
    assert on_device.dtype == torch.bfloat16 and torch.equal(on_device, x.to(torch.bfloat16)) and ready is None
    assert on_device.data_ptr() != x.data_ptr()


def test_cpu_staging_returns_results_as_they_are() -> None:
    staging = DeviceStaging(torch.device("cpu"))
    q, k = torch.randn(2, 3), torch.randn(2, 1)
    staging.wait([None, None])
    assert [x is y for x, y in zip(staging.to_host([q, None, k]), [q, None, k], strict=True)] == [True] * 3


class ThreadRecordingStaging(DeviceStaging):
    """CPU staging that claims a copy stream (as on CUDA) and records which thread stages each tensor."""

    def __init__(self) -> None:
        super().__init__(torch.device("cpu"))
        self.stream = object()  # type: ignore[assignment]
        self.threads: list[int] = []

    def to_device(self, x: torch.Tensor, dtype: torch.dtype | None) -> tuple[torch.Tensor, None]:
        self.threads.append(threading.get_ident())
        return x.to(dtype=dtype or x.dtype), None

    def wait(self, ready: object) -> None:
        pass

    def to_host(self, tensors: Sequence[torch.Tensor | None]) -> list[torch.Tensor | None]:
        return list(tensors)


def test_service_stages_off_the_event_loop_when_copies_are_host_work() -> None:
    """With a copy stream (CUDA), the pinned copies of a body run in a thread, not on the event loop."""
    service = RotationService(Settings(access_log=False), torch.device("cpu"), TableCache())
    staging = ThreadRecordingStaging()
    service.staging = staging
    tensors = {"q": torch.randn(8, 2 * 16), "k": torch.randn(8, 16), "positions": torch.arange(8)}
    payload = decode_safetensors(bytearray(save(tensors)), max_elements=10**6, required=REQUIRED_TENSORS)
    options = RotationOptions(from_explicit({"rope_theta": 10_000.0, "head_dim": 16}), layout="flat")

    async def rotate() -> tuple[int, object]:
        await service.start()
        try:
            result = await service.rotate(payload, options)
        finally:
            await service.stop()
        return threading.get_ident(), result

    loop_thread, result = asyncio.run(rotate())
    assert len(staging.threads) == 2 and loop_thread not in staging.threads
    assert result.metadata["batch"]["size"] == 1


def test_service_prepares_a_large_cpu_body_off_the_event_loop() -> None:
    """On CPU (no copy stream) a small body is prepared on the event loop, one beyond INLINE_PREPARE_ELEMENTS (its
    cast to the asked dtype is host work sized by the body) in a thread; both answers are the same rotation."""
    service = RotationService(Settings(access_log=False), torch.device("cpu"), TableCache())
    prepared_in: list[int] = []
    real_prepare = service.prepare

    def recording(payload: object, options: RotationOptions) -> object:
        prepared_in.append(threading.get_ident())
        return real_prepare(payload, options)  # type: ignore[arg-type]

    service.prepare = recording  # type: ignore[method-assign,assignment]
    params = from_explicit({"rope_theta": 10_000.0, "head_dim": 16})
    options = RotationOptions(params, layout="flat", dtype=torch.float32)
    tokens = INLINE_PREPARE_ELEMENTS // 32 + 1  # q [T, 32] alone is past the bound
    big = {"q": torch.randn(tokens, 2 * 16).to(torch.bfloat16), "positions": torch.arange(tokens)}
    small = {"q": big["q"][:8].clone(), "positions": torch.arange(8)}

    async def rotate() -> tuple[int, list[torch.Tensor]]:
        await service.start()
        try:
            answers = []
            for tensors in (small, big):
                payload = decode_safetensors(bytearray(save(tensors)), max_elements=10**7, required=REQUIRED_TENSORS)
                answers.append((await service.rotate(payload, options)).tensors["q"])
        finally:
            await service.stop()
        return threading.get_ident(), answers

    loop_thread, (small_q, big_q) = asyncio.run(rotate())
    assert prepared_in[0] == loop_thread and prepared_in[1] != loop_thread
    assert torch.equal(big_q[:8], small_q)
