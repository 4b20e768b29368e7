"""Reusable request-body buffers for the tensor endpoints.

A fresh multi-MiB ``bytearray`` costs one page fault per 4 KiB the first time it is written: on the
benchmark VM, reading a 64 MiB body into a new buffer took 145 ms against 85 ms into a reused one. Bodies
of at least ``min_bytes`` with a declared Content-Length are therefore read into pooled buffers (size
classes of powers of two), and a buffer returns to the pool only after its response has been sent in full:
until then the decoded tensors, the in-place rotation and the response all share it. Any other outcome
(an error, a disconnect, a cancelled request whose kernel may still be running) simply drops the buffer
for the garbage collector, so a buffer is never handed out while something can still touch it.
Idle buffers are kept up to ``idle_bytes`` in total (0 turns reuse off).
"""

from __future__ import annotations

import threading

MIN_POOLED_BYTES = 1 << 20


class BodyBuffers:
    """Pool of idle body buffers; ``take`` lends an exact-size view, ``give_back`` returns its buffer."""

    def __init__(self, idle_bytes: int, min_bytes: int = MIN_POOLED_BYTES) -> None:
        self.idle_bytes, self.min_bytes = idle_bytes, min_bytes
        self._idle: dict[int, list[bytearray]] = {}
        self._idle_total = 0
        self._lock = threading.Lock()

    @property
    def idle(self) -> int:
        """Bytes held by idle buffers."""
        return self._idle_total

    def take(self, size: int) -> memoryview | None:
        """A writable view of exactly ``size`` bytes on a pooled buffer; None when reuse is off or ``size`` small."""
        if self.idle_bytes <= 0 or size < self.min_bytes or size > self.idle_bytes:
            return None
        capacity = 1 << (size - 1).bit_length()
        with self._lock:
            idle = self._idle.get(capacity)
            buffer = idle.pop() if idle else None
            if buffer is not None:
                self._idle_total -= capacity
        return memoryview(buffer if buffer is not None else bytearray(capacity))[:size]

    def give_back(self, view: memoryview) -> None:
        """Return the buffer under ``view`` (only once nothing reads or writes it any more)."""
        buffer = view.obj
        assert isinstance(buffer, bytearray)
        with self._lock:
            if self._idle_total + len(buffer) <= self.idle_bytes:
                self._idle.setdefault(len(buffer), []).append(buffer)
                self._idle_total += len(buffer)


class BufferLease:
    """One request's use of the pool: ``take`` at most once, ``give_back`` after the response is sent."""

    def __init__(self, pool: BodyBuffers) -> None:
        self.pool = pool
        self.view: memoryview | None = None

    def take(self, size: int) -> memoryview | None:
        self.view = self.pool.take(size)
        return self.view

    def give_back(self) -> None:
        """Return the buffer (idempotent; nothing to do when none was taken)."""
        if self.view is not None:
            self.pool.give_back(self.view)
            self.view = None
