"""Route lookup by exact path: the app's routes found with one dict lookup instead of a pattern match per route.

Starlette tries each route's pattern in turn (about 1 us each here); with the service's ~40 routes a probe tried
15 of them and a rotation more. ``ExactPathIndex`` is put first in the app's route list and answers for the
(method, path) pairs of parameter-free routes that the scan itself would pick: for each it checks, once, that no
route before it in the list matches that path and method. Anything else (unknown paths, a method a path does not
serve, paths with parameters, mounts) is not in the index and falls through to the scan, so 404s, 405s and every
other route keep starlette's own matching; a matched request carries the chosen route in ``scope["route"]`` as if
the scan had found it.

``direct_lanes`` goes one step further for the JSON routes with a direct handler (``json_route.JSONRoute``): the
service middleware calls them itself, behind starlette's ``ExceptionMiddleware`` with the app's own handlers, and
skips what lies between (FastAPI's exit-stack middleware, the router, the index, the route's dispatch: about 20 us
per request here, ``benchmarks/bench_small.py``).
"""

from __future__ import annotations

from collections.abc import Sequence

from fastapi.routing import APIRoute
from starlette.applications import Starlette
from starlette.middleware.exceptions import ExceptionMiddleware
from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Receive, Scope, Send

Lanes = dict[tuple[str, str], ASGIApp]
"""``(method, path) -> ASGI app`` of the routes the service middleware serves directly (``direct_lanes``)."""


class ExactPathIndex(BaseRoute):
    """``(method, path) -> route`` for the parameter-free routes of ``routes`` that a scan would choose."""

    def __init__(self, routes: Sequence[BaseRoute]) -> None:
        self.by_key: dict[tuple[str, str], APIRoute] = {}
        for position, route in enumerate(routes):
            if not isinstance(route, APIRoute) or route.param_convertors:
                continue
            for method in sorted(route.methods or ()):
                scope = {"type": "http", "path": route.path, "root_path": "", "method": method}
                if not any(earlier.matches(scope)[0] == Match.FULL for earlier in routes[:position]):
                    self.by_key.setdefault((method, route.path), route)

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        if scope["type"] != "http":
            return Match.NONE, {}
        route = self.by_key.get((scope["method"], scope["path"]))
        if route is None or scope.get("root_path"):
            return Match.NONE, {}
        return route.matches(scope)  # FULL, with the route's own child scope ("route", "endpoint", no params)

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        route: APIRoute = scope["route"]
        await route.handle(scope, receive, send)


def index_routes(routes: list[BaseRoute]) -> None:
    """Put an ``ExactPathIndex`` of ``routes`` at their front (after every route is added; replaces an older one)."""
    plain = [route for route in routes if not isinstance(route, ExactPathIndex)]
    routes[:] = [ExactPathIndex(plain), *plain]


class DirectLane:
    """One route served from the service middleware: its handler behind starlette's ``ExceptionMiddleware`` with the
    app's exception handlers (as the app's own middleware stack has them), given the scope the router gives it."""

    def __init__(self, route: APIRoute, app: Starlette) -> None:
        handlers = {key: handler for key, handler in app.exception_handlers.items() if key not in (500, Exception)}
        self.route, self.router = route, app.router
        self.app = ExceptionMiddleware(route.app, handlers=handlers, debug=app.debug)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        scope.update(endpoint=self.route.endpoint, path_params={}, route=self.route)
        scope.setdefault("router", self.router)
        await self.app(scope, receive, send)


def direct_lanes(app: Starlette) -> Lanes:
    """A ``DirectLane`` per indexed ``(method, path)`` whose route serves directly (``serves_directly``: the JSON
    routes' own handler, which needs nothing from the router). Built when the middleware stack is (at the first
    request), so exception handlers added until then are the ones used, as for the app's ``ExceptionMiddleware``."""
    index = next((route for route in app.router.routes if isinstance(route, ExactPathIndex)), None)
    if index is None:
        return {}
    return {
        key: DirectLane(route, app) for key, route in index.by_key.items() if getattr(route, "serves_directly", False)
    }
