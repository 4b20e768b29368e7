"""The HTTP/1.1 transport of ``ropeserve serve``: uvicorn's httptools protocol with connection guards.

uvicorn alone holds a connection that never completes its request head for as long as the client likes, and
accepts any number of connections. ``GuardedHttpToolsProtocol`` adds, per connection:

* a header timeout: a request head must be complete ``header_timeout_s`` after the connection opened (first
  request) or after its first byte (later requests; idle keep-alive time is uvicorn's ``timeout_keep_alive``).
  A partly sent head is answered ``408`` problem+json, then the connection closes; a silent one just closes;
* a connection cap: past ``max_connections`` open connections a new one is answered ``503`` problem+json with
  ``Retry-After`` and ``Connection: close`` at once, its input is discarded, and it closes when the client
  closes or after the header timeout;
* a graceful drain: at shutdown an idle keep-alive connection stays open for ``IDLE_CLOSE_GRACE_S`` so that a
  request already on its way is answered (with ``Connection: close``) instead of meeting a reset;
* the write-buffer high-water mark ``TRANSPORT_HIGH_WATER_BYTES`` that ``SafetensorsResponse`` relies on.

Body idle timeouts and body memory live in the app (``api.middleware``), where the body is read.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any, ClassVar

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from ropeserve.api.negotiation import TRANSPORT_HIGH_WATER_BYTES
from ropeserve.api.problems import PROBLEM_MEDIA_TYPE
from ropeserve.errors import Busy, RequestTimeout, ServiceError
from ropeserve.logs import logging_config
from ropeserve.settings import Settings

IDLE_CLOSE_GRACE_S = 1.0
"""How long an idle keep-alive connection stays open at shutdown. uvicorn waits for every open connection to
close before the lifespan shuts down, so a request that arrives in the grace (a client that reuses the
connection right after an answer sent before the drain began, without ``Connection: close``) is answered,
with ``Connection: close``, instead of meeting a reset; a client delayed by more than the grace can still
race the close, as with any HTTP server (RFC 9112 §9.3.1)."""
REASONS = {408: "Request Timeout", 503: "Service Unavailable"}


def canned_response(error: ServiceError) -> bytes:
    """``error`` as a complete HTTP/1.1 problem+json response that closes the connection."""
    body = json.dumps(error.to_problem()).encode()
    headers = {
        "content-type": PROBLEM_MEDIA_TYPE,
        "content-length": str(len(body)),
        **{name.lower(): value for name, value in error.headers.items()},
        "connection": "close",
    }
    head = f"HTTP/1.1 {error.status} {REASONS[error.status]}\r\n"
    head += "".join(f"{name}: {value}\r\n" for name, value in headers.items())
    return (head + "\r\n").encode("latin-1") + body


@dataclass(frozen=True)
class TransportLimits:
    header_timeout_s: float
    max_connections: int
    retry_after_s: int

    @classmethod
    def from_settings(cls, settings: Settings) -> TransportLimits:
        return cls(settings.header_timeout_s, settings.max_connections, settings.retry_after_s)


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """One connection; ``limits`` is set on the subclass ``protocol_class`` builds."""

    limits: ClassVar[TransportLimits]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.header_timer: asyncio.TimerHandle | None = None
        self.head_started = self.refused = self.draining = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        transport.set_write_buffer_limits(high=TRANSPORT_HIGH_WATER_BYTES)
        self._arm_header_timer()
        if len(self.connections) > self.limits.max_connections:
            self.refused = True
            busy = Busy(
                f"the server holds its maximum of {self.limits.max_connections} connections "
                "(ROPESERVE_MAX_CONNECTIONS); retry shortly",
                headers={"Retry-After": str(self.limits.retry_after_s)},
            )
            transport.write(canned_response(busy))
            if transport.can_write_eof():
                transport.write_eof()  # the answer, then FIN; reading on lets the client's request land unharmed
            else:
                transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_header_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if not self.refused:
            super().data_received(data)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.head_started = True
        if self.header_timer is None:
            self._arm_header_timer()

    def on_headers_complete(self) -> None:
        self._cancel_header_timer()
        self.head_started = False
        super().on_headers_complete()
        if self.draining and self.cycle is not None:
            self.cycle.keep_alive = False  # uvicorn then sends Connection: close and closes after the answer

    def shutdown(self) -> None:
        if self.cycle is None or self.cycle.response_complete:
            self.draining = True
            self.loop.call_later(IDLE_CLOSE_GRACE_S, self._close_if_idle)
        else:
            super().shutdown()

    def _close_if_idle(self) -> None:
        if (self.cycle is None or self.cycle.response_complete) and not self.head_started:
            self.transport.close()

    def _arm_header_timer(self) -> None:
        self.header_timer = self.loop.call_later(self.limits.header_timeout_s, self._header_timeout)

    def _cancel_header_timer(self) -> None:
        if self.header_timer is not None:
            self.header_timer.cancel()
            self.header_timer = None

    def _header_timeout(self) -> None:
        self.header_timer = None
        if self.transport.is_closing():
            return
        if self.cycle is not None and not self.cycle.response_complete:
            self._arm_header_timer()  # an answer is under way (the head is a pipelined next request): not yet
            return
        if self.head_started and not self.refused:
            timeout = RequestTimeout(
                f"the request head was not complete within {self.limits.header_timeout_s:g} s "
                "(ROPESERVE_HEADER_TIMEOUT_S)"
            )
            self.transport.write(canned_response(timeout))
        self.transport.close()


def protocol_class(limits: TransportLimits) -> type[GuardedHttpToolsProtocol]:
    return type("GuardedHttpToolsProtocol", (GuardedHttpToolsProtocol,), {"limits": limits})


def server_config(app: Any, settings: Settings, **overrides: Any) -> uvicorn.Config:
    """The uvicorn configuration ``ropeserve serve`` runs ``app`` with (``overrides``: e.g. ``fd`` in tests)."""
    options: dict[str, Any] = {
        "host": settings.host,
        "port": settings.port,
        "workers": 1,
        "log_level": settings.log_level,
        "log_config": logging_config(settings.log_level),
        "access_log": False,
        "server_header": False,  # no "server: uvicorn": the software is not advertised, one header less per answer
        "timeout_graceful_shutdown": int(settings.drain_timeout_s),
        "timeout_keep_alive": settings.keep_alive_timeout_s,
        "http": protocol_class(TransportLimits.from_settings(settings)),
    }
    return uvicorn.Config(app, **{**options, **overrides})
