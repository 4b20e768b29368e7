"""The exact-path index picks the route starlette's scan would pick, for every path and method of the app; the
service middleware's direct lanes answer the JSON routes exactly as the router does."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from fastapi.testclient import TestClient
from starlette.routing import BaseRoute, Match

from ropeserve.api import create_app
from ropeserve.api.middleware import ServiceMiddleware
from ropeserve.api.route_index import ExactPathIndex, index_routes
from ropeserve.errors import InvalidInput
from ropeserve.settings import Settings

METHODS = ("GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS")


def scan(routes: list[BaseRoute], scope: dict[str, object]) -> tuple[Match, BaseRoute | None]:
    """Starlette's rule: the first full match, else the first partial one."""
    partial = None
    for route in routes:
        match, _ = route.matches(dict(scope))
        if match == Match.FULL:
            return match, route
        if match == Match.PARTIAL and partial is None:
            partial = route
    return (Match.PARTIAL, partial) if partial else (Match.NONE, None)


@pytest.fixture(scope="module")
def app() -> FastAPI:
    return create_app(Settings(device="cpu", shm_enabled=True))


def test_the_index_is_first_and_holds_the_service_routes(app: FastAPI) -> None:
    index = app.router.routes[0]
    assert isinstance(index, ExactPathIndex)
    paths = {path for _, path in index.by_key}
    assert {"/v1/positions", "/v1/rope/cos-sin", "/v1/config/validate", "/health/live", "/metrics"} <= paths


def test_every_path_and_method_gets_the_route_the_scan_gets(app: FastAPI) -> None:
    index, rest = app.router.routes[0], app.router.routes[1:]
    assert isinstance(index, ExactPathIndex)
    paths = {getattr(route, "path", "") for route in rest} | {"/nowhere", "/v1", "/v1/positions/", "/docs/assets/x"}
    for path in sorted(paths):
        for method in METHODS:
            scope = {"type": "http", "path": path, "root_path": "", "method": method, "headers": []}
            indexed, child = index.matches(dict(scope))
            expected, route = scan(rest, scope)
            if indexed == Match.FULL:
                assert (expected, child["route"]) == (Match.FULL, route), (method, path)
            else:
                assert (method, path) not in index.by_key


def test_an_earlier_route_that_matches_keeps_the_path_out_of_the_index() -> None:
    app = FastAPI()

    @app.get("/items/{name}")
    async def by_name(name: str) -> dict[str, str]:
        return {"route": "pattern", "name": name}

    @app.get("/items/all")
    async def every() -> dict[str, str]:
        return {"route": "exact"}

    @app.post("/items/all")
    async def create() -> dict[str, str]:
        return {"route": "exact post"}

    index_routes(app.router.routes)
    index = app.router.routes[0]
    assert isinstance(index, ExactPathIndex)
    assert ("GET", "/items/all") not in index.by_key and ("POST", "/items/all") in index.by_key
    client = TestClient(app)
    assert client.get("/items/all").json() == {"route": "pattern", "name": "all"}
    assert client.post("/items/all").json() == {"route": "exact post"}
    assert client.delete("/items/all").status_code == 405


def test_indexing_twice_keeps_one_index(app: FastAPI) -> None:
    routes = list(app.router.routes)
    index_routes(routes)
    assert sum(isinstance(route, ExactPathIndex) for route in routes) == 1
    assert len(routes) == len(app.router.routes)


def service_client(monkeypatch: pytest.MonkeyPatch | None = None) -> TestClient:
    """The service app; with ``monkeypatch``, its middleware gets no direct lanes (every request via the router)."""
    if monkeypatch is not None:
        monkeypatch.setattr("ropeserve.api.app.direct_lanes", lambda app: {})
    return TestClient(create_app(Settings(device="cpu")), raise_server_exceptions=False)


def service_middleware(client: TestClient) -> ServiceMiddleware:
    layer = client.app.middleware_stack  # type: ignore[attr-defined]
    while not isinstance(layer, ServiceMiddleware):
        layer = layer.app
    return layer


LANE_REQUESTS: list[tuple[str, dict[str, Any]]] = [
    ("/v1/positions", {"json": {"segment_lengths": [3, 2]}}),
    ("/v1/positions", {"json": {"segment_lengths": [3, -2]}}),  # 422 from the endpoint (InvalidInput)
    ("/v1/positions", {"json": {"segment_lengths": "x"}}),  # 422 from body validation
    ("/v1/positions", {"content": b'{"segment_lengths": [1,', "headers": {"content-type": "application/json"}}),
    ("/v1/positions", {"content": b"{}", "headers": {"content-type": "text/plain"}}),  # 415
    ("/v1/positions", {"content": b"", "headers": {"content-type": "application/json"}}),  # missing body
    ("/v1/mrope/positions", {"json": {"family": "qwen2_vl", "rows": [[{"text": 3}, {"image": [1, 4, 4]}]]}}),
    ("/v1/mrope/positions", {"json": {"family": "nope", "rows": [[{"text": 3}]]}}),
    ("/v1/config/validate", {"json": {"config": {"model_type": "llama", "rope_theta": -1}}}),
    ("/v1/config/validate", {"json": {"config": [], "unknown": 1}}),
]


def comparable(response: httpx.Response) -> tuple[int, dict[str, str], bytes]:
    headers = {key: value for key, value in response.headers.items() if key not in ("x-request-id", "x-total-time")}
    return response.status_code, headers, response.content


def test_direct_lanes_serve_the_json_routes_and_nothing_else() -> None:
    with service_client() as client:
        client.get("/health/live")
        lanes = service_middleware(client).lanes
        index = client.app.router.routes[0]  # type: ignore[attr-defined]
        assert isinstance(index, ExactPathIndex)
        direct = {key for key, route in index.by_key.items() if getattr(route, "serves_directly", False)}
        assert set(lanes) == direct
        assert {("POST", "/v1/positions"), ("POST", "/v1/mrope/positions"), ("POST", "/v1/config/validate")} <= direct
        assert ("GET", "/health/live") not in lanes and ("POST", "/v1/rope/apply") not in lanes


def test_a_direct_lane_answers_as_the_router_does(monkeypatch: pytest.MonkeyPatch) -> None:
    with service_client() as laned:
        answers = [comparable(laned.post(path, **request)) for path, request in LANE_REQUESTS]
        metrics = laned.get("/metrics").text
    with service_client(monkeypatch) as routed:
        assert service_middleware(routed).lanes == {}
        assert answers == [comparable(routed.post(path, **request)) for path, request in LANE_REQUESTS]
    assert {status for status, _, _ in answers} == {200, 400, 415, 422}
    assert 'route="/v1/mrope/positions"' in metrics and 'route="unmatched"' not in metrics


def test_a_late_exception_handler_reaches_the_lanes() -> None:
    """Lanes are built with the middleware stack (first request), like the app's own ExceptionMiddleware."""
    app = create_app(Settings(device="cpu"))

    async def teapot(request: Request, error: Exception) -> JSONResponse:
        return JSONResponse({"teapot": str(error)}, status_code=418)

    app.add_exception_handler(InvalidInput, teapot)
    with TestClient(app) as client:
        answer = client.post("/v1/positions", json={"segment_lengths": [3, -2]})
    assert answer.status_code == 418 and "teapot" in answer.json()
