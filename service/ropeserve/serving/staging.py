"""Host ↔ device staging for the rotation service: pinned host memory and a copy stream of its own on CUDA.

``to_device`` (event loop) copies a request tensor into pinned memory and queues its host-to-device copy on
the copy stream, returning at once with the device tensor and a ``ready`` event; the worker thread makes the
compute stream wait for that event on the device (``wait``), so no host thread waits for the copy and copies
of later requests overlap the kernels of earlier ones. ``to_host`` (worker thread) queues the device-to-host
copies into pinned memory on the copy stream behind the kernel and waits for them there, off the event
loop, so the response is encoded from host memory.

On any other device (CPU; the meta device in tests) the same calls are plain copies: ``to_device`` is
``Tensor.to`` (a view when nothing changes), ``wait`` does nothing, ``to_host`` returns its tensors.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

Ready = torch.cuda.Event | None
"""A copy's completion on the copy stream (CUDA), or None where copies complete before the call returns."""


class DeviceStaging:
    """Copies between request memory and ``device`` (see the module docstring)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None

    def to_device(self, x: torch.Tensor, dtype: torch.dtype | None) -> tuple[torch.Tensor, Ready]:
        """``x`` on the device in ``dtype`` (its own when None), and the event its copy completes at.

        CUDA: the copy runs on the copy stream from a pinned copy of ``x``; the device tensor is marked as
        used by the current (compute) stream so its memory is not reused before the kernel has run.
        """
        dtype = dtype or x.dtype
        if self.stream is None:
            return x.to(device=self.device, dtype=dtype), None
        pinned = x if x.is_pinned() else torch.empty(x.shape, dtype=x.dtype, pin_memory=True).copy_(x)
        compute = torch.cuda.current_stream(self.device)
        with torch.cuda.stream(self.stream):
            on_device = pinned.to(self.device, non_blocking=True).to(dtype)
            ready = torch.cuda.Event()
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
            done = torch.cuda.Event()
            done.record(self.stream)
        done.synchronize()
        return hosted
