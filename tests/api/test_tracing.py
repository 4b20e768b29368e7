"""OpenTelemetry tracing: off by default, and then neither the SDK nor an exporter is imported (FastAPI itself
imports only the no-op OpenTelemetry API); on, OTLP/HTTP spans reach a collector (a recording HTTP server on
loopback) with the caller's traceparent as parent and one span per phase."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch
from fastapi.testclient import TestClient
from safetensors.torch import save

from ropeserve.api import create_app
from ropeserve.settings import Settings

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_SPAN_ID = "00f067aa0ba902b7"
ROTATION_PHASES = ["read", "decode", "prepare", "queue", "compute", "encode"]


def fresh_process_output(code: str) -> str:
    """What ``code`` prints in a fresh interpreter without ``ROPESERVE_*`` settings (it must exit 0)."""
    env_free = {key: value for key, value in os.environ.items() if not key.startswith("ROPESERVE_")}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env_free)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_tracing_is_off_by_default_and_nothing_is_imported() -> None:
    code = (
        "import sys\n"
        "from fastapi.testclient import TestClient\n"
        "from ropeserve.api import create_app\n"
        "from ropeserve.settings import Settings\n"
        "app = create_app(Settings(access_log=False))\n"
        "with TestClient(app) as client:\n"
        "    assert client.get('/v1/info').status_code == 200\n"
        "print(sorted(m for m in sys.modules if m.startswith(('opentelemetry.sdk', 'opentelemetry.exporter'))))\n"
        "print([m.cls.__name__ for m in app.user_middleware])\n"
    )
    imported, middleware = fresh_process_output(code).splitlines()
    assert imported == "[]" and "TracingMiddleware" not in middleware


def test_fastapi_native_telemetry_stays_off_under_a_global_tracer_provider() -> None:
    """FastAPI 0.165's own instrumentation follows the global providers: once any library sets one, it would add a
    span per request beside ropeserve's (tracing off here: there must be no span at all)."""
    code = (
        "from opentelemetry import trace\n"
        "from opentelemetry.sdk.trace import TracerProvider\n"
        "from opentelemetry.sdk.trace.export import SimpleSpanProcessor\n"
        "from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter\n"
        "exporter = InMemorySpanExporter()\n"
        "provider = TracerProvider()\n"
        "provider.add_span_processor(SimpleSpanProcessor(exporter))\n"
        "trace.set_tracer_provider(provider)\n"
        "from fastapi.testclient import TestClient\n"
        "from ropeserve.api import create_app\n"
        "from ropeserve.settings import Settings\n"
        "with TestClient(create_app(Settings(access_log=False))) as client:\n"
        "    assert client.post('/v1/positions', json={'cu_seqlens': [0, 3]}).status_code == 200\n"
        "print(len(exporter.get_finished_spans()))\n"
    )
    assert fresh_process_output(code) == "0"


class Collector(BaseHTTPRequestHandler):
    received: list[tuple[str, str, bytes]] = []

    def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
        body = self.rfile.read(int(self.headers["content-length"]))
        self.received.append((self.path, self.headers["content-type"], body))
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture()
def collector() -> Iterator[tuple[str, list[tuple[str, str, bytes]]]]:
    Collector.received = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Collector)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1/traces", Collector.received
    finally:
        server.shutdown()
        server.server_close()


def rotation_body() -> bytes:
    tensors = {"q": torch.randn(4, 2 * 16), "positions": torch.arange(4)}
    params = {"rope": {"rope_theta": 10_000.0, "head_dim": 16}, "layout": "flat"}
    return save(tensors, metadata={"ropeserve": json.dumps(params)})


def test_spans_reach_the_otlp_endpoint_with_the_callers_parent_and_the_phases(collector) -> None:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    endpoint, received = collector
    headers = {"content-type": "application/x-safetensors", "traceparent": f"00-{TRACE_ID}-{PARENT_SPAN_ID}-01"}
    with TestClient(create_app(Settings(access_log=False, otlp_traces_endpoint=endpoint))) as client:
        assert client.post("/v1/rope/apply", content=rotation_body(), headers=headers).status_code == 200
    # leaving the lifespan flushed the batch processor
    assert received and all(path == "/v1/traces" and kind == "application/x-protobuf" for path, kind, _ in received)
    spans = []
    for _, _, body in received:
        request = ExportTraceServiceRequest.FromString(body)
        for resource_spans in request.resource_spans:
            service = {a.key: a.value.string_value for a in resource_spans.resource.attributes}["service.name"]
            assert service == "ropeserve"
            spans += [span for scope_spans in resource_spans.scope_spans for span in scope_spans.spans]
    (server,) = [span for span in spans if span.name == "POST /v1/rope/apply"]
    assert server.trace_id.hex() == TRACE_ID and server.parent_span_id.hex() == PARENT_SPAN_ID
    children = sorted(
        (span for span in spans if span.parent_span_id == server.span_id), key=lambda s: s.start_time_unix_nano
    )
    assert [span.name for span in children] == ROTATION_PHASES
    assert all(server.start_time_unix_nano <= s.start_time_unix_nano <= s.end_time_unix_nano for s in children)
    attributes = {a.key: a.value for a in server.attributes}
    assert attributes["http.route"].string_value == "/v1/rope/apply"
    assert attributes["http.response.status_code"].int_value == 200
