"""One pure-ASGI middleware for cross-cutting concerns: request id, body limit, auth, metrics, access log.

The body limit answers 413 from ``Content-Length`` before anything is read, and caps streamed bodies
while they arrive (the endpoint's read fails with PayloadTooLarge as soon as the cap is crossed).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import sys
import time
import uuid
from typing import Any

from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ropeserve.api.problems import PROBE_PATHS, problem_response
from ropeserve.errors import PayloadTooLarge, ServiceError, Unauthorized
from ropeserve.metrics import Metrics
from ropeserve.settings import Settings, credentials

access_logger = logging.getLogger("ropeserve.access")
CLIENT_CLOSED_REQUEST = 499
"""Recorded (never sent) when the client went away mid-upload: nginx's code, as the rotation routes use."""


def configure_access_log(enabled: bool) -> None:
    """JSON lines on stderr for ``ropeserve.access`` (one object per request)."""
    if not enabled or access_logger.handlers:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    access_logger.addHandler(handler)
    access_logger.setLevel(logging.INFO)
    access_logger.propagate = False


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return value.decode("latin-1")
    return None


def _credential(authorization: str, tokens: list[str]) -> str | None:
    """Which token the header carries, as a stable id (a hash prefix, never the token); None for none of them.
    Every token is compared, in constant time, whatever matches."""
    matches = [hmac.compare_digest(authorization.encode(), f"Bearer {token}".encode()) for token in tokens]
    if not any(matches):
        return None
    return "token-" + hashlib.sha256(tokens[matches.index(True)].encode()).hexdigest()[:16]


class _Exchange:
    """One request's response side: adds headers, records the status, and enforces the streamed body cap.

    When the body crosses the cap the app sees a disconnect, its output is discarded, and the middleware
    answers 413 itself.
    """

    def __init__(self, send: Send, request_id: str, body_limit: int) -> None:
        self.raw_send, self.request_id, self.body_limit = send, request_id, body_limit
        self.started = time.perf_counter()
        self.status = 500
        self.body_seen = 0
        self.overflow: PayloadTooLarge | None = None

    def capped(self, receive: Receive) -> Receive:
        async def capped_receive() -> Message:
            message = await receive()
            if message["type"] == "http.request":
                self.body_seen += len(message.get("body", b""))
                if self.body_seen > self.body_limit:
                    self.overflow = PayloadTooLarge(
                        f"body exceeds the limit of {self.body_limit} bytes",
                        field="body",
                        headers={"Connection": "close"},
                        limit=self.body_limit,
                    )
                    return {"type": "http.disconnect"}
            return message

        return capped_receive

    async def send_app(self, message: Message) -> None:
        if self.overflow is None:
            await self.send_own(message)

    async def send_own(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
            headers = list(message.get("headers", []))
            headers.append((b"x-request-id", self.request_id.encode("latin-1")))
            headers.append((b"x-total-time", f"{time.perf_counter() - self.started:.6f}".encode()))
            message = {**message, "headers": headers}
        await self.raw_send(message)


class ServiceMiddleware:
    def __init__(self, app: ASGIApp, settings: Settings, metrics: Metrics) -> None:
        self.app, self.settings, self.metrics = app, settings, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = _header(scope, b"x-request-id") or uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = request_id
        exchange = _Exchange(send, request_id, self.settings.max_body_bytes)
        self.metrics.in_flight.inc()
        try:
            refusal = self._refusal(scope)
            if refusal is None:
                await self._run_app(scope, receive, exchange)
                refusal = exchange.overflow
            if refusal is not None:
                scope["state"]["error_type"] = refusal.slug
                response = problem_response(refusal.to_problem(instance=scope["path"]), refusal.headers)
                await response(scope, receive, exchange.send_own)
        finally:
            self.metrics.in_flight.dec()
            self._record(scope, exchange.status, time.perf_counter() - exchange.started, request_id)

    async def _run_app(self, scope: Scope, receive: Receive, exchange: _Exchange) -> None:
        try:
            await self.app(scope, exchange.capped(receive), exchange.send_app)
        except ClientDisconnect:
            if exchange.overflow is None:  # the client left mid-upload: nobody to answer, not a server error
                exchange.status = CLIENT_CLOSED_REQUEST
                scope["state"]["error_type"] = "client-closed"
        except Exception:
            if exchange.overflow is None:
                raise

    def _refusal(self, scope: Scope) -> ServiceError | None:
        """An error to answer without running the app: bad token, or a declared body over the limit."""
        tokens = credentials(self.settings)
        protected = scope["path"] not in PROBE_PATHS or self.settings.auth_protect_probes
        if tokens and protected:
            credential = _credential(_header(scope, b"authorization") or "", tokens)
            if credential is None:
                return Unauthorized("send 'Authorization: Bearer <token>'", headers={"WWW-Authenticate": "Bearer"})
            scope["state"]["credential"] = credential
        declared = _header(scope, b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.settings.max_body_bytes:
            return PayloadTooLarge(
                f"body of {declared} bytes exceeds the limit of {self.settings.max_body_bytes}",
                field="body",
                headers={"Connection": "close"},
                limit=self.settings.max_body_bytes,
            )
        return None

    def _record(self, scope: Scope, status: int, seconds: float, request_id: str) -> None:
        route = getattr(scope.get("route"), "path", None) or "unmatched"
        method = scope.get("method", "")
        labels = {"route": route, "method": method, "status": str(status)}
        self.metrics.requests.labels(**labels).inc()
        self.metrics.request_duration.labels(**labels).observe(seconds)
        error_type = scope.get("state", {}).get("error_type")
        if status >= 400:
            self.metrics.errors.labels(error_type=error_type or "http-error", status=str(status)).inc()
        if access_logger.handlers:
            entry: dict[str, Any] = {
                "ts": round(time.time(), 3),
                "request_id": request_id,
                "method": method,
                "path": scope.get("path"),
                "route": route,
                "status": status,
                "duration_s": round(seconds, 6),
                "client": (scope.get("client") or ("", 0))[0],
            }
            if error_type:
                entry["error_type"] = error_type
            access_logger.info(json.dumps(entry))
