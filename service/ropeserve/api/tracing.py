"""Optional OpenTelemetry tracing, off by default: ``ROPESERVE_OTLP_TRACES_ENDPOINT`` turns it on.

Off, nothing of OpenTelemetry is imported and no middleware is added, so it costs nothing. On (``pip install
'ropeserve[tracing]'``), every HTTP request gets a server span named ``METHOD route``, child of the caller's
span when the request carries a W3C ``traceparent`` header; rotation requests add one child span per phase:
``read``, ``decode``, ``prepare``, ``queue``, ``compute`` (measured by the service, laid end to end from the
request's start) and ``encode`` (encoding and sending the answer). Spans go in batches to the OTLP/HTTP
endpoint (an OpenTelemetry Collector, Jaeger, Tempo: ``http://collector:4318/v1/traces``).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import TYPE_CHECKING

from fastapi import FastAPI
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ropeserve import __version__
from ropeserve.api.runtime import Runtime
from ropeserve.settings import Settings

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.trace import Span, Tracer

PHASE_TIMINGS_STATE = "phase_timings"
"""``request.state`` key where a route leaves its measured phases (seconds, ``read_s`` ...) for tracing."""
PHASES = (("read", "read_s"), ("decode", "decode_s"), ("prepare", "prepare_s"), ("queue", "queue_s"))
LAST_MEASURED_PHASE = ("compute", "compute_s")
SERVICE_NAME = "ropeserve"


def span_exporter(endpoint: str) -> SpanExporter:
    """The OTLP/HTTP (protobuf) exporter to ``endpoint``."""
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    except ImportError as missing:
        raise RuntimeError(
            "ROPESERVE_OTLP_TRACES_ENDPOINT is set but OpenTelemetry is not installed: pip install 'ropeserve[tracing]'"
        ) from missing

    return OTLPSpanExporter(endpoint=endpoint)


def tracer_provider(exporter: SpanExporter) -> TracerProvider:
    """A provider naming this service, exporting in batches off the request path."""
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": SERVICE_NAME, "service.version": __version__}))
    provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider


def install_tracing(app: FastAPI, settings: Settings) -> None:
    """Add the tracing middleware when an endpoint is set (outermost, so spans cover the whole request)."""
    if not settings.otlp_traces_endpoint:
        return
    provider = tracer_provider(span_exporter(settings.otlp_traces_endpoint))
    app.state.tracer_provider = provider
    app.add_middleware(TracingMiddleware, tracer=provider.get_tracer("ropeserve.api", __version__))

    async def flush(_: Runtime) -> None:
        provider.shutdown()

    runtime: Runtime = app.state.runtime
    runtime.shutdowns.append(flush)


class TracingMiddleware:
    """Pure ASGI: one server span per HTTP request, the caller's ``traceparent`` as its parent."""

    def __init__(self, app: ASGIApp, tracer: Tracer) -> None:
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.app, self.tracer, self.propagator = app, tracer, TraceContextTextMapPropagator()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        from opentelemetry.trace import SpanKind, Status, StatusCode

        carrier = {key.decode("latin-1"): value.decode("latin-1") for key, value in scope.get("headers", ())}
        parent = self.propagator.extract(carrier)
        method, started = scope.get("method", ""), time.time_ns()
        status = 500

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        with self.tracer.start_as_current_span(
            f"{method} {scope.get('path', '')}", context=parent, kind=SpanKind.SERVER, start_time=started
        ) as span:
            try:
                await self.app(scope, receive, send_status)
            finally:
                route = getattr(scope.get("route"), "path", None) or "unmatched"
                span.update_name(f"{method} {route}")
                span.set_attributes(
                    {"http.request.method": method, "http.route": route, "url.path": scope.get("path", "")}
                )
                span.set_attribute("http.response.status_code", status)
                if status >= 500:
                    span.set_status(Status(StatusCode.ERROR))
                timings = scope.get("state", {}).get(PHASE_TIMINGS_STATE)
                if timings:
                    self._phase_spans(span, started, timings)

    def _phase_spans(self, parent: Span, started_ns: int, timings: Mapping[str, float]) -> None:
        """Child spans from measured durations, end to end from the request start; ``encode`` runs until now."""
        from opentelemetry.trace import set_span_in_context

        context = set_span_in_context(parent)
        at = started_ns
        for name, key in (*PHASES, LAST_MEASURED_PHASE):
            if key in timings:
                end = at + int(timings[key] * 1e9)
                self.tracer.start_span(name, context=context, start_time=at).end(end_time=end)
                at = end
        self.tracer.start_span("encode", context=context, start_time=at).end(end_time=max(at, time.time_ns()))
