"""The exact-path index picks the route starlette's scan would pick, for every path and method of the app."""

from __future__ import annotations

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from starlette.routing import BaseRoute, Match

from ropeserve.api import create_app
from ropeserve.api.route_index import ExactPathIndex, index_routes
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
