"""Route class of the JSON endpoints: FastAPI's routing, OpenAPI and errors, with a direct request handler.

FastAPI's generic request handler (body reading, dependency solving, response validation) costs about 0.15 ms
per request here, more than computing a small answer (``benchmarks/bench_small.py``). The JSON endpoints all
have one shape: one pydantic body model, the ``Request``, and dependencies that need only the request
(``RuntimeDep``), and they return a ``Response``. For that shape ``JSONRoute`` hands the endpoint its arguments
directly, following FastAPI's own rules step by step:

- the body is JSON only when ``Content-Type`` names JSON (``application/json`` or ``*/*+json``, FastAPI's strict
  default), else 415; an empty body is FastAPI's ``missing`` error (422);
- the body is parsed by ``decode_json``, in a worker thread from ``JSON_THREAD_MIN_BYTES`` up, so that a large
  body never holds the event loop; malformed JSON is FastAPI's ``json_invalid`` error (400, with line and
  column), any other parser failure (nesting past the recursion limit) FastAPI's 400;
- the model is validated by FastAPI's own body field, so every error has the location and text FastAPI gives it;
- dependencies are called with the request, ``app.dependency_overrides`` honoured.

An endpoint of any other shape keeps FastAPI's handler, with the same threaded JSON parsing; so does one whose
body FastAPI reads otherwise (an embedded body, a lax Content-Type rule) or that ``include_router`` gives more
dependencies (the route as merged with its routers is the one examined: ``effective``).
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, cast

import fastapi.routing
from fastapi import Request
from fastapi.datastructures import DefaultPlaceholder
from fastapi.dependencies.models import Dependant
from fastapi.exceptions import HTTPException, RequestValidationError
from fastapi.responses import Response
from fastapi.routing import APIRoute
from starlette.concurrency import run_in_threadpool
from starlette.routing import request_response

from ropeserve.api.negotiation import media_type_of
from ropeserve.errors import UnsupportedMediaType

JSON_THREAD_MIN_BYTES = 1 << 16
"""JSON bodies of this size and more are parsed in a worker thread."""
decode_json = json.loads
"""The JSON parser of request bodies (a module attribute, so tests can slow it down)."""
BODY_LOCATION = ("body",)
MISSING_BODY = {"type": "missing", "loc": BODY_LOCATION, "msg": "Field required", "input": None}
"""FastAPI's error for a required body that was not sent (``tests/api/test_json_route.py`` compares them)."""


async def parse_json_body(body: bytes) -> Any:  # noqa: ANN401 - any JSON value
    """``body`` parsed, inline when small, in the threadpool from ``JSON_THREAD_MIN_BYTES`` up."""
    if len(body) < JSON_THREAD_MIN_BYTES:
        return decode_json(body)
    return await run_in_threadpool(decode_json, body)


class ThreadedJSONRequest(Request):
    """A request whose JSON body is parsed by ``parse_json_body`` (FastAPI's handler calls ``json()``)."""

    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = await parse_json_body(await self.body())
        return self._json


def names_json(content_type: str | None) -> bool:
    """FastAPI's strict rule: the media type is ``application/json`` or ``application/*+json`` (``email.message``
    reads a type with other than one ``/`` as ``text/plain``)."""
    main, _, subtype = media_type_of(content_type).partition("/")
    return main == "application" and "/" not in subtype and (subtype == "json" or subtype.endswith("+json"))


def content_type_error(request: Request) -> UnsupportedMediaType:
    """415 for a body whose Content-Type does not name JSON."""
    given = request.headers.get("content-type")
    return UnsupportedMediaType(
        "send the body as JSON with 'Content-Type: application/json' "
        + (f"(got {given!r})" if given else "(the request had no Content-Type)"),
        field="content-type",
    )


async def read_json_body(request: Request) -> Any:  # noqa: ANN401 - any JSON value
    """The request's JSON body: FastAPI's ``missing`` error when empty, 415 unless Content-Type names JSON, 400 when
    it does not parse."""
    body = await request.body()
    if not body:
        raise RequestValidationError([MISSING_BODY], body=None)
    if not names_json(request.headers.get("content-type")):
        raise content_type_error(request)
    try:
        return await parse_json_body(body)
    except json.JSONDecodeError as error:
        invalid = {"type": "json_invalid", "loc": ("body", error.pos), "msg": "JSON decode error", "input": {}}
        raise RequestValidationError([{**invalid, "ctx": {"error": error.msg}}], body=error.doc) from error
    except Exception as error:  # RecursionError on deep nesting, as FastAPI words it
        raise HTTPException(status_code=400, detail="There was an error parsing the body") from error


RequestDependency = Callable[[Request], Any]


@dataclass(frozen=True)
class DirectCall:
    """How to call one endpoint without FastAPI's dependency solver: the body field, where the request goes, and
    the request-only dependencies by parameter name."""

    route: APIRoute
    body_name: str
    request_name: str | None
    dependencies: dict[str, RequestDependency]
    endpoint_is_async: bool

    @classmethod
    def of(cls, route: APIRoute) -> DirectCall | None:
        """The plan for ``route`` (or the route as ``include_router`` merged it with its routers: ``effective``), or
        None when its endpoint has another shape than the JSON endpoints' or FastAPI reads its body otherwise (an
        embedded body, a lax Content-Type)."""
        dependant = route.dependant
        if route.response_field is not None or len(dependant.body_params) != 1 or _has_other_inputs(dependant):
            return None
        if route._embed_body_fields or _value(route.strict_content_type) is not True:
            return None
        if not dependant.body_params[0].field_info.is_required():
            return None
        dependencies = {dep.name: dep.call for dep in dependant.dependencies if dep.name and dep.call}
        if len(dependencies) != len(dependant.dependencies) or not all(
            _request_only(dep) for dep in dependant.dependencies
        ):
            return None
        body_name, endpoint_is_async = dependant.body_params[0].name, inspect.iscoroutinefunction(route.endpoint)
        return cls(route, body_name, dependant.request_param_name, dependencies, endpoint_is_async)

    async def handle(self, request: Request) -> Response:
        arguments: dict[str, Any] = {self.body_name: self._validated_body(await read_json_body(request))}
        if self.request_name is not None:
            arguments[self.request_name] = request
        provider = self.route.dependency_overrides_provider or request.app  # the app, when included in one
        overrides = getattr(provider, "dependency_overrides", None)
        for name, dependency in self.dependencies.items():
            value = (overrides.get(dependency, dependency) if overrides else dependency)(request)
            arguments[name] = await value if inspect.isawaitable(value) else value
        if self.endpoint_is_async:
            result = await self.route.endpoint(**arguments)
        else:
            result = await run_in_threadpool(self.route.endpoint, **arguments)
        if not isinstance(result, Response):
            raise TypeError(f"{self.route.path}: a JSONRoute endpoint must return a Response")
        return result

    def _validated_body(self, document: Any) -> Any:  # noqa: ANN401 - the body model
        field = self.route.body_field
        assert field is not None  # a route with one body parameter has its body field
        value, errors = field.validate(document, {}, loc=BODY_LOCATION)
        if errors:
            raise RequestValidationError(errors, body=document)
        return value


def _value(setting: Any) -> Any:  # noqa: ANN401 - any route setting
    """A route setting, its default when left unset."""
    return setting.value if isinstance(setting, DefaultPlaceholder) else setting


def effective(route: APIRoute) -> APIRoute:
    """``route`` as FastAPI builds its handler now: within ``include_router``, merged with the routers' settings
    (their dependencies, Content-Type rule, overrides provider); else the route itself. FastAPI 0.165 merges
    lazily and names the merged route in a private context variable; read defensively, as earlier versions
    build the merged route itself."""
    context_var = getattr(fastapi.routing, "_effective_route_context_var", None)  # FastAPI 0.165's lazy include
    context = context_var.get() if context_var is not None else None  # earlier FastAPI: routes are made merged
    return cast(APIRoute, context) if context is not None and context.original_route is route else route


def _has_other_inputs(dependant: Dependant) -> bool:
    """Path, query, header or cookie parameters, or FastAPI-provided objects other than the request."""
    params = (dependant.path_params, dependant.query_params, dependant.header_params, dependant.cookie_params)
    special = (
        dependant.websocket_param_name,
        dependant.http_connection_param_name,
        dependant.response_param_name,
        dependant.background_tasks_param_name,
        dependant.security_scopes_param_name,
    )
    return any(params) or any(name is not None for name in special)


def _request_only(dependency: Dependant) -> bool:
    """A dependency whose only parameter is the request (``get_runtime``)."""
    return (
        dependency.request_param_name is not None
        and not dependency.dependencies
        and not dependency.body_params
        and not _has_other_inputs(dependency)
        and not inspect.isgeneratorfunction(dependency.call)
        and not inspect.isasyncgenfunction(dependency.call)
    )


class JSONRoute(APIRoute):
    """Route class of the JSON endpoints: ``DirectCall`` when the endpoint has their shape, else FastAPI's
    handler given a ``ThreadedJSONRequest``.

    A route made for an app (``app.add_routes``) with the direct handler and no body size limit of FastAPI's is
    served by starlette's ``request_response``: FastAPI's copy of it adds two ``AsyncExitStack`` per request
    (about 3 us), which only dependencies with ``yield`` and uploaded files use, and ``DirectCall`` serves
    neither. Within ``include_router`` FastAPI serves the merged route with its own wrapper around the same
    handler."""

    def __init__(self, path: str, endpoint: Callable[..., Any], **kwargs: Any) -> None:  # noqa: ANN401 - APIRoute's
        super().__init__(path, endpoint, **kwargs)
        direct = DirectCall.of(self)
        self.serves_directly = direct is not None and getattr(self, "max_body_size", None) is None
        """``self.app`` is the direct handler: it needs nothing from the router (``route_index.direct_lanes``)."""
        if direct is not None and self.serves_directly:  # FastAPI 0.165's per-route limit keeps FastAPI's wrapper
            self.app = request_response(direct.handle)

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        direct = DirectCall.of(effective(self))
        if direct is not None:
            return direct.handle
        handler = super().get_route_handler()

        async def handle(request: Request) -> Response:
            return await handler(ThreadedJSONRequest(request.scope, request.receive))

        return handle
