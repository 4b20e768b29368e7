"""Staging off CUDA degrades to plain copies: views where nothing changes, casts, no events, no waits."""

from __future__ import annotations

import torch

from ropeserve.serving.staging import DeviceStaging


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
