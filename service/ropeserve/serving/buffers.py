"""Request-body memory: reusable buffers for the tensor endpoints, and one budget for all bodies in flight.

A fresh multi-MiB ``bytearray`` costs one page fault per 4 KiB the first time it is written: on the
benchmark VM, reading a 64 MiB body into a new buffer took 145 ms against 85 ms into a reused one. Bodies
of at least ``min_bytes`` are therefore kept for reuse once answered: a body with a declared Content-Length
is read into an idle buffer of its size class (powers of two) when the pool holds one; otherwise it grows as
its bytes arrive (memory is never committed for bytes a client has only announced) and that buffer joins the
pool afterwards. A buffer returns to the pool only after its response has been sent in full and the transport
no longer references it (see ``api.negotiation.SafetensorsResponse``): until then the decoded tensors, the
in-place rotation and the response all share it. Any other outcome (an error, a disconnect, a cancelled
request whose kernel may still be running) simply drops the buffer for the garbage collector, so a buffer is
never handed out while something can still touch it. Idle buffers are kept up to ``idle_bytes`` in total
(0 turns reuse off).

``BodyBudget`` bounds the bytes of all bodies held at once: each request's ``BodyClaim`` grows with the bytes
received and with the size of a pooled buffer it was lent; a claim past the budget is refused with ``Busy``.
"""

from __future__ import annotations

import threading

from ropeserve.errors import Busy

MIN_POOLED_BYTES = 1 << 20


def size_class(size: int) -> int:
    """The power of two a body of ``size`` bytes is pooled under."""
    return 1 << (size - 1).bit_length()


class BodyBuffers:
    """Pool of idle body buffers; ``take`` lends an exact-size view on one, ``give_back`` returns a buffer."""

    def __init__(self, idle_bytes: int, min_bytes: int = MIN_POOLED_BYTES) -> None:
        self.idle_bytes, self.min_bytes = idle_bytes, min_bytes
        self._idle: dict[int, list[bytearray]] = {}
        self._idle_total = 0
        self._lock = threading.Lock()

    @property
    def idle(self) -> int:
        """Bytes held by idle buffers."""
        return self._idle_total

    def poolable(self, size: int) -> bool:
        return self.idle_bytes > 0 and self.min_bytes <= size <= self.idle_bytes

    def take(self, size: int) -> memoryview | None:
        """A writable view of exactly ``size`` bytes on an idle buffer; None when there is none (never allocates)."""
        if not self.poolable(size):
            return None
        with self._lock:
            idle = self._idle.get(size_class(size), [])
            fitting = next((i for i in range(len(idle) - 1, -1, -1) if len(idle[i]) >= size), None)
            if fitting is None:
                return None
            buffer = idle.pop(fitting)
            self._idle_total -= len(buffer)
        return memoryview(buffer)[:size]

    def give_back(self, buffer: bytearray) -> None:
        """Keep ``buffer`` for reuse while the idle total allows (only once nothing reads or writes it any more)."""
        if not self.poolable(len(buffer)):
            return
        with self._lock:
            if self._idle_total + len(buffer) <= self.idle_bytes:
                self._idle.setdefault(size_class(len(buffer)), []).append(buffer)
                self._idle_total += len(buffer)


class BodyBudget:
    """Bytes of all request bodies held at once, at most ``limit``; ``retry_after_s`` goes with a refusal."""

    def __init__(self, limit: int, retry_after_s: int = 1) -> None:
        self.limit, self.retry_after_s = limit, retry_after_s
        self._used = 0
        self._lock = threading.Lock()

    @property
    def used(self) -> int:
        return self._used

    def claim(self) -> BodyClaim:
        return BodyClaim(self)

    def _reserve(self, count: int) -> bool:
        with self._lock:
            if self._used + count > self.limit:
                return False
            self._used += count
            return True

    def _release(self, count: int) -> None:
        with self._lock:
            self._used -= count


class BodyClaim:
    """One request's share of a ``BodyBudget``: grows to the largest size asked for, released once."""

    def __init__(self, budget: BodyBudget) -> None:
        self.budget, self.held = budget, 0

    def grow_to(self, size: int) -> None:
        """Hold ``size`` bytes (no-op below what is held); ``Busy`` (503, Retry-After) past the budget."""
        if size > self.held:
            if not self.budget._reserve(size - self.held):
                raise Busy(
                    f"request bodies in flight would exceed {self.budget.limit} bytes; retry shortly",
                    field="body",
                    headers={"Retry-After": str(self.budget.retry_after_s), "Connection": "close"},
                    limit=self.budget.limit,
                )
            self.held = size

    def release(self) -> None:
        self.budget._release(self.held)
        self.held = 0


class BufferLease:
    """One request's use of the pool: an idle buffer lent (``take``) or its own grown one kept (``keep``),
    handed to the pool by ``give_back`` after the response is sent. ``claim`` (if any) is charged for a lent
    buffer before its first byte is written."""

    def __init__(self, pool: BodyBuffers, claim: BodyClaim | None = None) -> None:
        self.pool, self.claim = pool, claim
        self.buffer: bytearray | None = None

    def take(self, size: int) -> memoryview | None:
        view = self.pool.take(size)
        if view is not None:
            self.buffer = view.obj  # type: ignore[assignment]
            if self.claim is not None:
                try:
                    self.claim.grow_to(len(view.obj))  # type: ignore[arg-type]
                except Busy:
                    self.give_back()
                    raise
        return view

    def keep(self, buffer: bytearray) -> None:
        """Pool ``buffer`` (a body grown as it arrived) after the response, like a lent one."""
        self.buffer = buffer

    def give_back(self) -> None:
        """Return the buffer (idempotent; nothing to do when none was taken or kept)."""
        if self.buffer is not None:
            self.pool.give_back(self.buffer)
            self.buffer = None
