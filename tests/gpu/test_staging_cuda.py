"""CUDA staging: pinned host memory, copies on the copy stream, the compute stream waiting on the device."""

from __future__ import annotations

import pytest
import torch

from ropeserve.serving import staging as staging_module
from ropeserve.serving.staging import DeviceStaging

pytestmark = pytest.mark.gpu


def test_cuda_staging_round_trip_through_pinned_memory() -> None:
    staging = DeviceStaging(torch.device("cuda"))
    x = torch.randn(64, 256)
    on_device, ready = staging.to_device(x, torch.bfloat16)
    assert on_device.is_cuda and ready is not None and staging.stream is not None
    staging.wait([ready])
    doubled = on_device * 2
    (back,) = staging.to_host([doubled])
    assert back is not None and back.is_pinned() and torch.equal(back, (x.to(torch.bfloat16) * 2))


def test_cuda_staging_copies_many_requests_before_any_kernel_waits() -> None:
    staging = DeviceStaging(torch.device("cuda"))
    inputs = [torch.full((1 << 20,), float(i)) for i in range(8)]
    staged = [staging.to_device(x, None) for x in inputs]
    staging.wait([ready for _, ready in staged])
    sums = torch.stack([x.sum() for x, _ in staged])
    (host,) = staging.to_host([sums])
    assert host is not None and host.tolist() == [float(i * (1 << 20)) for i in range(8)]


def test_cuda_staging_in_chunks_keeps_every_byte(monkeypatch: pytest.MonkeyPatch) -> None:
    """Several pinned chunks and a short last one, from a body view and from pinned memory, with a cast."""
    monkeypatch.setattr(staging_module, "STAGE_CHUNK_BYTES", 4096)
    staging = DeviceStaging(torch.device("cuda"))
    x = torch.randn(3 * 1024 + 77, 5)
    for source in (x, x.pin_memory()):
        for dtype in (None, torch.bfloat16):
            on_device, ready = staging.to_device(source, dtype)
            staging.wait([ready])
            assert torch.equal(on_device.cpu(), x.to(dtype or x.dtype))
