"""App factory: ``create_app(settings)`` wires routes, problem handlers, middleware and the lifespan."""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import signal
import socket
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from types import FrameType
from typing import Any

import torch
import uvicorn
from fastapi import APIRouter, FastAPI
from fastapi.middleware.cors import CORSMiddleware
from fastapi.routing import APIRoute

from ropeserve import __version__
from ropeserve.api import (
    routes_encodings,
    routes_health,
    routes_lint,
    routes_positions,
    routes_rope,
    routes_rotation,
    routes_shm,
    routes_tables,
)
from ropeserve.api.docs import install_docs, operation_id
from ropeserve.api.middleware import ServiceMiddleware, configure_access_log
from ropeserve.api.problems import declare_common_problems, install_problem_handlers
from ropeserve.api.route_index import direct_lanes, index_routes
from ropeserve.api.runtime import Runtime
from ropeserve.api.tracing import install_tracing
from ropeserve.config import from_explicit
from ropeserve.rope import rope_cos_sin
from ropeserve.settings import Settings, get_settings

logger = logging.getLogger("ropeserve")
server_log = logging.getLogger("uvicorn.error")
ROUTERS = [
    routes_positions.router,
    routes_rope.router,
    routes_lint.router,
    routes_encodings.router,
    routes_health.router,
    routes_tables.router,
]
"""In this order in the app's route list (the scan order for paths the exact-path index does not hold): the calls a
serving stack makes per step (positions, cos/sin) first, the probes (every few seconds) after the JSON routes."""
NO_NATIVE_TELEMETRY = {"tracing": False, "metrics": False, "logs": False}
"""FastAPI's own OpenTelemetry instrumentation (FastAPI 0.165 on) is off: ropeserve traces itself (``api/tracing.py``:
its spans and phases, off unless configured) and exports Prometheus metrics; FastAPI's would add a second span per
request once any library sets a global tracer provider, and asks the global providers on every request (a few us)."""
DESCRIPTION = (
    "Reference service for position encodings in LLM serving: position ids (1-D and M-RoPE), cos/sin for "
    "every RoPE variant, Q/K rotation over safetensors, and config lint. Errors are application/problem+json."
)


def warm_up(runtime: Runtime) -> None:
    """Run each hot path once so the first request pays no first-call cost; then mark ready."""
    params = from_explicit({"rope_type": "default", "rope_theta": 10000.0, "head_dim": 128})
    rope_cos_sin(params, torch.arange(1024), cache=runtime.tables, device=runtime.device)
    for hook in runtime.warmups:
        hook(runtime)
    runtime.set_ready(True)


def begin_drain(runtime: Runtime) -> None:
    """Stop advertising readiness (``/health/ready`` 503, ``ropeserve_ready`` 0); requests are still served."""
    runtime.draining = True
    runtime.set_ready(False)


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    runtime: Runtime = app.state.runtime
    runtime.draining = False
    for start in runtime.startups:
        await start(runtime)
    warm_up(runtime)
    logger.info("ropeserve %s ready on %s", __version__, runtime.device)
    try:
        yield
    finally:
        begin_drain(runtime)
        for stop in runtime.shutdowns:
            await stop(runtime)


def add_routes(app: FastAPI, router: APIRouter) -> None:
    """Add ``router``'s routes to the app's own list, where ``route_index`` finds them by exact path.
    ``include_router`` would keep the router as a nested level that every request walks twice (about 15 us per
    request here); these routers have no prefix or dependencies to apply. Each route is made anew for the app
    (``for_app``), as ``include_router`` does."""
    app.router.routes.extend(for_app(route, app) if isinstance(route, APIRoute) else route for route in router.routes)


def for_app(route: APIRoute, app: FastAPI) -> APIRoute:
    """A copy of ``route`` whose handler reads ``app.dependency_overrides``: FastAPI's handler takes its overrides
    provider when the route is made, and a router's own routes have none (nor should apps share route objects)."""
    return type(route)(
        route.path,
        route.endpoint,
        response_model=route.response_model,
        status_code=route.status_code,
        tags=route.tags,
        dependencies=route.dependencies,
        summary=route.summary,
        description=route.description,
        response_description=route.response_description,
        responses=route.responses,
        deprecated=route.deprecated,
        name=route.name,
        methods=route.methods,
        operation_id=route.operation_id,
        response_model_include=route.response_model_include,
        response_model_exclude=route.response_model_exclude,
        response_model_by_alias=route.response_model_by_alias,
        response_model_exclude_unset=route.response_model_exclude_unset,
        response_model_exclude_defaults=route.response_model_exclude_defaults,
        response_model_exclude_none=route.response_model_exclude_none,
        include_in_schema=route.include_in_schema,
        response_class=route.response_class,
        dependency_overrides_provider=app,
        callbacks=route.callbacks,
        openapi_extra=route.openapi_extra,
        generate_unique_id_function=route.generate_unique_id_function,
        strict_content_type=route.strict_content_type,
        max_body_size=route.max_body_size,
        form_limits=route.form_limits,
    )


def native_telemetry_off() -> dict[str, Any]:
    """FastAPI's ``telemetry`` argument turning its instrumentation off; nothing for a FastAPI without it."""
    return {"telemetry": NO_NATIVE_TELEMETRY} if "telemetry" in inspect.signature(FastAPI).parameters else {}


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()
    runtime = Runtime.create(settings)
    app = FastAPI(
        title="ropeserve",
        version=__version__,
        description=DESCRIPTION,
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        generate_unique_id_function=operation_id,
        **native_telemetry_off(),
    )
    install_docs(app)
    app.state.runtime = runtime
    for router in ROUTERS:
        add_routes(app, router)
    routes_rotation.install(app)
    routes_shm.install(app)
    index_routes(app.router.routes)
    runtime.metrics.build_info.labels(
        version=__version__, device=str(runtime.device), kernel=str(runtime.extensions.get("kernel", "native"))
    ).set(1)
    declare_common_problems(app)
    install_problem_handlers(app)
    configure_access_log(settings.access_log)
    app.add_middleware(
        ServiceMiddleware,
        settings=settings,
        metrics=runtime.metrics,
        budget=runtime.body_budget,
        draining=lambda: runtime.draining,
        lanes=lambda: direct_lanes(app),
    )
    install_tracing(app, settings)
    if settings.cors_origins:
        app.add_middleware(
            CORSMiddleware, allow_origins=settings.cors_origins, allow_methods=["*"], allow_headers=["*"]
        )
    return app


class DrainingServer(uvicorn.Server):
    """uvicorn's server with a drain phase for orchestrators and load balancers.

    At SIGTERM readiness turns 503 at once while the listener keeps serving for ``drain_delay_s``, so that
    balancers and Kubernetes endpoints stop routing here; then uvicorn's graceful shutdown stops accepting,
    waits up to ``drain_timeout_s`` for in-flight requests, runs the lifespan shutdown and the process exits 0.
    SIGINT (Ctrl-C), or a second SIGTERM, skips the rest of the delay. Connections the kernel has completed but
    the loop has not accepted yet are taken and served before the listener closes (closing it would reset them).
    """

    def __init__(self, config: uvicorn.Config, runtime: Runtime, drain_delay_s: float = 0.0) -> None:
        super().__init__(config)
        self.runtime, self.drain_delay_s = runtime, drain_delay_s
        self.drain_deadline: float | None = None
        self.drain_logged = False

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        begin_drain(self.runtime)
        if sig == signal.SIGTERM and self.drain_deadline is None:
            self.drain_deadline = time.monotonic() + self.drain_delay_s
            return
        super().handle_exit(sig, frame)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        await self._serve_accept_backlog()
        await super().shutdown(sockets)  # closes the listeners first thing, with no await before

    async def _serve_accept_backlog(self) -> None:
        """Serve every connection waiting in the listeners' accept queues, like any open connection. Clients
        reconnecting after a draining answer's ``Connection: close`` land there: closing the listener would
        reset them after their request was sent."""
        loop = asyncio.get_running_loop()
        for server in self.servers:
            for listener in server.sockets:
                with socket.socket(fileno=os.dup(listener.fileno())) as duplicate:
                    duplicate.setblocking(False)  # shared with the listener, which asyncio made non-blocking
                    while (connection := _accept_nowait(duplicate)) is not None:
                        await loop.connect_accepted_socket(self._create_protocol, connection)

    def _create_protocol(self) -> asyncio.Protocol:
        """A connection's protocol, as uvicorn builds it for its listeners."""
        return self.config.http_protocol_class(  # type: ignore[call-arg]
            config=self.config, server_state=self.server_state, app_state=self.lifespan.state
        )

    async def on_tick(self, counter: int) -> bool:
        if self.drain_deadline is not None and not self.should_exit:
            if not self.drain_logged:
                self.drain_logged = True
                server_log.info("Draining: readiness is 503; closing the listener in %.1f s", self.drain_delay_s)
            self.should_exit = time.monotonic() >= self.drain_deadline
        return await super().on_tick(counter)


def _accept_nowait(listener: socket.socket) -> socket.socket | None:
    """A connection already in ``listener``'s accept queue, non-blocking, or None when the queue is empty."""
    try:
        connection, _ = listener.accept()
    except OSError:  # BlockingIOError: nothing waiting; anything else: the listener is gone
        return None
    connection.setblocking(False)
    return connection
