"""One pure-ASGI middleware for cross-cutting concerns: request id, body limits, auth, metrics, access log.

Body limits: safetensors bodies are capped at ``max_body_bytes``, bodies of any other content type (JSON) at
``max_json_body_bytes``; a declared ``Content-Length`` over the cap is answered 413 before anything is read, and
streamed bodies are capped while they arrive. Every body received is charged to the app's ``BodyBudget`` as
its bytes arrive, JSON bodies at ``JSON_MEMORY_FACTOR`` times their size (503 + Retry-After past
``max_inflight_body_bytes``), and a body that pauses longer than ``body_idle_timeout_s`` is answered 408
(``api/idle_watch.py``: at most an eighth of the timeout late). In each case the endpoint's read sees a
disconnect, its output is discarded and the middleware answers with ``Connection: close`` itself. While the
server drains, every answer carries ``Connection: close`` so that no keep-alive connection is left idle when the
listener closes.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import time
from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client import Counter, Histogram
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ropeserve.api.idle_watch import IdleWatch, IdleWatches
from ropeserve.api.negotiation import SAFETENSORS_MEDIA_TYPES, media_type_of
from ropeserve.api.problems import PROBE_PATHS, problem_response
from ropeserve.api.route_index import Lanes
from ropeserve.errors import Busy, PayloadTooLarge, RequestTimeout, ServiceError, Unauthorized, UnsupportedMediaType
from ropeserve.logs import ACCESS_LOGGER, FIELDS_ATTRIBUTE, json_handler
from ropeserve.metrics import Metrics
from ropeserve.serving import BodyBudget, BodyClaim
from ropeserve.settings import JSON_MEMORY_FACTOR, Settings, credentials

access_logger = logging.getLogger(ACCESS_LOGGER)
Draining = Callable[[], bool]
CLIENT_CLOSED_REQUEST = 499
"""Recorded (never sent) when the client went away mid-upload: nginx's code, as the rotation routes use."""
METRIC_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH"})
"""Methods kept as ``method`` label values (RFC 9110 and PATCH); any other method is counted as ``other``, so
clients cannot add label values (the HTTP parser accepts 35 methods). Routes are templates or ``unmatched``."""


def configure_access_log(enabled: bool) -> None:
    """JSON lines on stderr for ``ropeserve.access`` (one object per request, ``ropeserve.logs`` format)."""
    if not enabled or access_logger.handlers:
        return
    access_logger.addHandler(json_handler())
    access_logger.setLevel(logging.INFO)
    access_logger.propagate = False


READ_HEADERS = frozenset({b"x-request-id", b"content-type", b"content-encoding", b"content-length", b"authorization"})
"""The request headers the middleware reads (each one's first occurrence)."""
RequestHeaders = dict[bytes, str]


def read_headers(scope: Scope) -> RequestHeaders:
    """``READ_HEADERS`` of the request, found in one pass over its header list."""
    found: RequestHeaders = {}
    headers: Iterable[tuple[bytes, bytes]] = scope.get("headers", ())
    for key, value in headers:
        if key in READ_HEADERS and key not in found:
            found[key] = value.decode("latin-1")
    return found


def _credential(authorization: str | None, tokens: list[str]) -> str | None:
    """Which token ``Authorization: Bearer <token>`` carries (the scheme is case-insensitive, RFC 9110 §11.1), as
    a stable id (a hash prefix, never the token); None for none of them. Every token is compared, in constant
    time, whatever matches."""
    scheme, _, given = (authorization or "").strip().partition(" ")
    matches = [hmac.compare_digest(given.strip().encode(), token.encode()) for token in tokens]
    if scheme.lower() != "bearer" or not any(matches):
        return None
    return "token-" + hashlib.sha256(tokens[matches.index(True)].encode()).hexdigest()[:16]


def _unsupported_encoding(headers: RequestHeaders) -> UnsupportedMediaType | None:
    """Bodies are read as sent: any Content-Encoding but ``identity`` is a 415 (RFC 9110 §15.5.16)."""
    encoding = headers.get(b"content-encoding")
    if encoding is None or all(part.strip().lower() in ("", "identity") for part in encoding.split(",")):
        return None
    return UnsupportedMediaType(
        f"request bodies are not decoded: send the body without Content-Encoding (got {encoding!r})",
        field="content-encoding",
        headers={"Accept-Encoding": "identity"},
    )


def body_terms(headers: RequestHeaders, settings: Settings) -> tuple[int, int]:
    """This request's body cap and budget factor: ``max_body_bytes`` and 1 for safetensors,
    ``max_json_body_bytes`` and ``JSON_MEMORY_FACTOR`` for any other content type."""
    if media_type_of(headers.get(b"content-type")) in SAFETENSORS_MEDIA_TYPES:
        return settings.max_body_bytes, 1
    return settings.max_json_body_bytes, JSON_MEMORY_FACTOR


def too_large(size: str | int, limit: int) -> PayloadTooLarge:
    return PayloadTooLarge(
        f"body of {size} bytes exceeds the limit of {limit} for this content type",
        field="body",
        headers={"Connection": "close"},
        limit=limit,
    )


class _Exchange:
    """One request's response side: adds headers, records the status, and guards the body as it arrives (cap,
    budget, idle timeout). When a guard trips the app sees a disconnect, its output is discarded, and the
    middleware answers ``overflow`` itself."""

    def __init__(
        self,
        send: Send,
        request_id: str,
        terms: tuple[int, int],
        claim: BodyClaim,
        idle: IdleWatch,
        draining: Draining,
    ) -> None:
        self.raw_send, self.request_id, self.claim = send, request_id, claim
        self.body_limit, self.memory_factor = terms
        self.idle, self.draining = idle, draining
        self.started = time.perf_counter()
        self.status = 500
        self.body_seen = 0
        self.body_done = False
        self.responded = False
        self.overflow: ServiceError | None = None

    def guarded(self, receive: Receive) -> Receive:
        async def guarded_receive() -> Message:
            if self.body_done:
                return await receive()
            try:
                message = await self.idle.receive(receive)
            except TimeoutError:
                return self.refuse(
                    RequestTimeout(
                        f"no body bytes for {self.idle.timeout_s:g} s (ROPESERVE_BODY_IDLE_TIMEOUT_S)",
                        field="body",
                        headers={"Connection": "close"},
                    )
                )
            if message["type"] == "http.request":
                self.body_done = not message.get("more_body", False)
                self.body_seen += len(message.get("body", b""))
                if self.body_seen > self.body_limit:
                    return self.refuse(too_large(f"{self.body_seen}+", self.body_limit))
                try:
                    self.claim.grow_to(self.body_seen * self.memory_factor)
                except Busy as busy:
                    return self.refuse(busy)
            return message

        return guarded_receive

    def refuse(self, error: ServiceError) -> Message:
        self.overflow = error
        return {"type": "http.disconnect"}

    async def send_app(self, message: Message) -> None:
        if self.overflow is None:
            await self.send_own(message)

    async def send_own(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
            headers = list(message.get("headers", []))
            headers.append((b"x-request-id", self.request_id.encode("latin-1")))
            headers.append((b"x-total-time", f"{time.perf_counter() - self.started:.6f}".encode()))
            if self.draining() and not any(name.lower() == b"connection" for name, _ in headers):
                headers.append((b"connection", b"close"))
            message = {**message, "headers": headers}
            self.responded = True
        await self.raw_send(message)


class ServiceMiddleware:
    """``budget`` bounds the bytes of all bodies in flight; ``draining()`` says the server is about to close."""

    def __init__(
        self,
        app: ASGIApp,
        settings: Settings,
        metrics: Metrics,
        budget: BodyBudget,
        draining: Draining = lambda: False,
        lanes: Callable[[], Lanes] = dict,
    ) -> None:
        self.app, self.settings, self.metrics = app, settings, metrics
        self.lanes = lanes()
        """Routes served without the app's inner layers (``route_index.direct_lanes``); any other goes to ``app``."""
        self.budget, self.draining = budget, draining
        self.tokens = credentials(settings)
        self.idle_watches = IdleWatches(settings.body_idle_timeout_s)
        self.series: dict[tuple[str, str, int], tuple[Counter, Histogram]] = {}
        """(requests, request_duration) children per (route, method, status): labels() costs more than the
        update. Bounded as the labels are: route templates or ``unmatched``, ``METRIC_METHODS`` or ``other``."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = read_headers(scope)
        request_id = headers.get(b"x-request-id") or os.urandom(16).hex()
        scope.setdefault("state", {})["request_id"] = request_id
        claim = self.budget.claim()
        scope["state"]["body_claim"] = claim
        terms = body_terms(headers, self.settings)
        exchange = _Exchange(send, request_id, terms, claim, self.idle_watches.of_running_loop(), self.draining)
        self.metrics.in_flight.inc()
        try:
            refusal = self._refusal(scope, headers, terms[0])
            if refusal is None:
                await self._run_app(scope, receive, exchange)
                refusal = None if exchange.responded else exchange.overflow
            if refusal is not None:
                scope["state"]["error_type"] = refusal.slug
                response = problem_response(refusal.to_problem(instance=scope["path"]), refusal.headers)
                await response(scope, receive, exchange.send_own)
        finally:
            claim.release()
            self.metrics.in_flight.dec()
            self._record(scope, exchange.status, time.perf_counter() - exchange.started, request_id)

    async def _run_app(self, scope: Scope, receive: Receive, exchange: _Exchange) -> None:
        app = self.app if scope.get("root_path") else self.lanes.get((scope["method"], scope["path"]), self.app)
        try:
            await app(scope, exchange.guarded(receive), exchange.send_app)
        except ClientDisconnect:
            if exchange.overflow is None:  # the client left mid-upload: nobody to answer, not a server error
                exchange.status = CLIENT_CLOSED_REQUEST
                scope["state"]["error_type"] = "client-closed"
        except Exception:
            if exchange.overflow is None:
                raise

    def _refusal(self, scope: Scope, headers: RequestHeaders, limit: int) -> ServiceError | None:
        """An error to answer without running the app: bad token, encoded body, or a declared body over ``limit``."""
        tokens = self.tokens
        protected = scope["path"] not in PROBE_PATHS or self.settings.auth_protect_probes
        if tokens and protected:
            credential = _credential(headers.get(b"authorization"), tokens)
            if credential is None:
                return Unauthorized("send 'Authorization: Bearer <token>'", headers={"WWW-Authenticate": "Bearer"})
            scope["state"]["credential"] = credential
        if (unsupported := _unsupported_encoding(headers)) is not None:
            return unsupported
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            return too_large(declared, limit)
        return None

    def _series(self, route: str, method: str, status: int) -> tuple[Counter, Histogram]:
        key = (route, method, status)
        if (children := self.series.get(key)) is None:
            labels = {"route": route, "method": method, "status": str(status)}
            children = self.series[key] = (
                self.metrics.requests.labels(**labels),
                self.metrics.request_duration.labels(**labels),
            )
        return children

    def _record(self, scope: Scope, status: int, seconds: float, request_id: str) -> None:
        route = getattr(scope.get("route"), "path", None) or "unmatched"
        method = scope.get("method", "")
        requests, duration = self._series(route, method if method in METRIC_METHODS else "other", status)
        requests.inc()
        duration.observe(seconds)
        error_type = scope.get("state", {}).get("error_type")
        if status >= 400:
            self.metrics.errors.labels(error_type=error_type or "http-error", status=str(status)).inc()
        if self.settings.access_log and (self.settings.access_log_probes or scope.get("path") not in PROBE_PATHS):
            entry: dict[str, Any] = {
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
            access_logger.info("request", extra={FIELDS_ATTRIBUTE: entry})
