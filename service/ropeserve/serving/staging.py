"""Host ↔ device staging for the rotation service: pinned host memory and a copy stream of its own on CUDA.

``to_device`` copies a request tensor into pinned memory chunk by chunk, queueing each chunk's host-to-device
copy on the copy stream as soon as it is pinned (so the DMA of one chunk overlaps the host copy of the next),
and returns with the device tensor and a ``ready`` event without waiting for the DMA; the worker thread makes
the compute stream wait for that event on the device (``wait``), so no host thread waits for the copy and
copies of later requests overlap the kernels of earlier ones. The service calls it off the event loop.
``to_host`` (worker thread) queues the device-to-host copies into pinned memory on the copy stream behind the
kernel and waits for them there, off the event loop, so the response is encoded from host memory.

Pinned memory comes from torch's caching host allocator: it is held while a request's copies are in flight
or its answer is being sent, and kept for reuse afterwards (at most the peak of concurrent bodies).

On any other device (CPU; the meta device in tests) the same calls are plain copies: ``to_device`` is
``Tensor.to`` (a view when nothing changes), ``wait`` does nothing, ``to_host`` returns its tensors.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

STAGE_CHUNK_BYTES = 4 << 20
"""Bytes per pinned chunk of ``to_device``: the DMA of one overlaps the host copy of the next."""

Ready = torch.cuda.Event | None
"""A copy's completion on the copy stream (CUDA), or None where copies complete before the call returns."""


class DeviceStaging:
    """Copies between request memory and ``device`` (see the module docstring)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None  # type: ignore[no-untyped-call]

    def to_device(self, x: torch.Tensor, dtype: torch.dtype | None) -> tuple[torch.Tensor, Ready]:
        """``x`` on the device in ``dtype`` (its own when None), and the event its copy completes at.

        CUDA: the copy runs on the copy stream from a pinned copy of ``x`` made ``STAGE_CHUNK_BYTES`` at a
        time; the device tensor is marked as used by the current (compute) stream so its memory is not reused
        before the kernel has run.
        """
        dtype = dtype or x.dtype
        if self.stream is None:
            return x.to(device=self.device, dtype=dtype), None
        source = x.reshape(-1)
        pinned = source if x.is_pinned() else torch.empty(source.shape, dtype=x.dtype, pin_memory=True)
        compute = torch.cuda.current_stream(self.device)
        step = max(1, STAGE_CHUNK_BYTES // x.element_size())
        with torch.cuda.stream(self.stream):
            staged = torch.empty(source.shape, dtype=x.dtype, device=self.device)
            for begin in range(0, source.numel(), step):
                chunk = slice(begin, begin + step)
                if pinned is not source:
                    pinned[chunk].copy_(source[chunk])
                staged[chunk].copy_(pinned[chunk], non_blocking=True)
            on_device = staged.view(x.shape).to(dtype)
            ready = torch.cuda.Event()  # type: ignore[no-untyped-call]
            ready.record(self.stream)
        on_device.record_stream(compute)
        return on_device, ready

    def wait(self, ready: Sequence[Ready]) -> None:
        """Make the compute stream wait (on the device, not the host) for these copies."""
        compute = torch.cuda.current_stream(self.device) if self.stream is not None else None
        for event in ready:
            if compute is not None and event is not None:
                compute.wait_event(event)

    def to_host(self, tensors: Sequence[torch.Tensor | None]) -> list[torch.Tensor | None]:
        """The tensors in pinned host memory, copied on the copy stream after the compute stream's work so
        far; returns once the copies are done (a wait in the calling thread, which is the worker's)."""
        if self.stream is None:
            return list(tensors)
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        hosted: list[torch.Tensor | None] = []
        with torch.cuda.stream(self.stream):
            for x in tensors:
                if x is None:
                    hosted.append(None)
                    continue
                x.record_stream(self.stream)
                host = torch.empty(x.shape, dtype=x.dtype, pin_memory=True)
                hosted.append(host.copy_(x, non_blocking=True))
            done = torch.cuda.Event()  # type: ignore[no-untyped-call]
            done.record(self.stream)
        done.synchronize()
        return hosted
