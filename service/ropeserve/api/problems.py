"""Render every failure as RFC 9457 ``application/problem+json`` and declare it in OpenAPI."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match, Route

from ropeserve.api.json_route import content_type_error
from ropeserve.errors import PROBLEM_BASE_URI, ServiceError

PROBLEM_MEDIA_TYPE = "application/problem+json"
PROBE_PATHS = frozenset({"/health", "/health/live", "/health/ready", "/metrics"})
"""Paths exempt from auth by default (probes and scrapes)."""
logger = logging.getLogger("ropeserve.api")

PROBLEM_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["type", "title", "status", "detail"],
    "properties": {
        "type": {"type": "string", "format": "uri"},
        "title": {"type": "string"},
        "status": {"type": "integer"},
        "detail": {"type": "string"},
        "field": {
            "type": "string",
            "description": "The offending input: dotted keys and [index] (config.rope_scaling.factor, "
            "rows[0].segments[1]); body, or a header name, when the whole body or a header is at fault.",
        },
        "instance": {"type": "string"},
    },
}
STATUS_DESCRIPTIONS = {
    400: "Malformed payload (invalid JSON or safetensors bytes)",
    401: "Missing or invalid bearer token",
    406: "No acceptable response media type",
    413: "Payload too large",
    415: "Unsupported media type",
    422: "Invalid input or limit exceeded",
    429: "Overloaded (Retry-After)",
    500: "Internal error (logged; no details leak)",
    503: "Not ready or draining (Retry-After)",
}


def problem_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses=`` entries declaring problem+json bodies for ``statuses``."""
    return {
        status: {
            "description": STATUS_DESCRIPTIONS.get(status, "Error"),
            "content": {PROBLEM_MEDIA_TYPE: {"schema": PROBLEM_SCHEMA}},
        }
        for status in statuses
    }


def declare_common_problems(app: FastAPI) -> None:
    """Declare, in the OpenAPI schema, the statuses any operation can answer: 500 everywhere, 401 off the
    probe paths (optional auth), and 400/413/415/422 on every operation that takes a body."""
    build_schema = app.openapi

    def openapi_with_problems() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        schema = build_schema()
        for path, item in schema.get("paths", {}).items():
            for method, operation in item.items():
                statuses = [500] + ([] if path in PROBE_PATHS else [401])
                if method in ("post", "put", "patch"):
                    statuses += [400, 413, 415, 422]
                for status, spec in problem_responses(*statuses).items():
                    declared = operation["responses"].get(str(status))
                    if declared is None or PROBLEM_MEDIA_TYPE not in declared.get("content", {}):
                        operation["responses"][str(status)] = spec  # replaces FastAPI's plain-JSON 422
        app.openapi_schema = schema
        return schema

    app.openapi = openapi_with_problems  # type: ignore[method-assign]


def problem_response(body: dict[str, Any], headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(body, status_code=body["status"], headers=headers, media_type=PROBLEM_MEDIA_TYPE)


def _generic_problem(status: int, slug: str, title: str, detail: str, field: str | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"type": PROBLEM_BASE_URI + slug, "title": title, "status": status, "detail": detail}
    if field is not None:
        body["field"] = field
    return body


async def _service_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ServiceError)
    request.state.error_type = exc.slug
    return problem_response(exc.to_problem(instance=request.url.path), exc.headers)


def _is_union_tag(part: Any) -> bool:
    """pydantic names the union member it tried (``list[int]``, ``PositionRange``): not a field."""
    return isinstance(part, str) and ("[" in part or part[:1].isupper())


def _location(loc: tuple[Any, ...]) -> str:
    """pydantic's error location in ``field_path`` notation (``positions[0]``, ``rope.rope_theta``)."""
    parts = [part for part in loc if part not in ("body", "query", "path", "header") and not _is_union_tag(part)]
    path = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in parts)
    return path.lstrip(".") or "body"


def _json_syntax_detail(error: dict[str, Any], document: Any) -> str:
    """Where a JSON body stops parsing, as line and column (1-based) plus the parser's reason."""
    location = tuple(error.get("loc", ()))
    reason = (error.get("ctx") or {}).get("error", "invalid JSON")
    if not location or not isinstance(location[-1], int):  # pydantic's own parser: its reason names line and column
        return f"the body is not valid JSON: {reason}"
    position = location[-1]
    text = document if isinstance(document, str) else ""
    line = text.count("\n", 0, position) + 1
    column = position - text.rfind("\n", 0, position)
    return f"the body is not valid JSON: {reason} at line {line}, column {column} (character {position})"


def _unparsed_body(errors: Sequence[Mapping[str, Any]]) -> bool:
    """FastAPI validates the raw bytes when the Content-Type does not name JSON: the body was never parsed."""
    return any(tuple(e.get("loc", ())) == ("body",) and isinstance(e.get("input"), bytes | bytearray) for e in errors)


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = exc.errors()
    first = errors[0] if errors else {"loc": ("body",), "msg": "invalid request"}
    field = _location(tuple(first.get("loc", ())))
    detail = "; ".join(f"{_location(tuple(e.get('loc', ())))}: {e.get('msg')}" for e in errors[:5])
    if first.get("type") == "json_invalid":
        request.state.error_type = "malformed-payload"
        detail = _json_syntax_detail(first, exc.body)
        return problem_response(_generic_problem(400, "malformed-payload", "Malformed payload", detail, "body"))
    if _unparsed_body(errors):
        return await _service_error(request, content_type_error(request))
    request.state.error_type = "invalid-input"
    body = _generic_problem(422, "invalid-input", "Invalid input", detail, field)
    return problem_response(body)


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    slug = {404: "not-found", 405: "method-not-allowed"}.get(exc.status_code, "http-error")
    request.state.error_type = slug
    body = _generic_problem(
        exc.status_code, slug, str(exc.detail), f"{request.method} {request.url.path}: {exc.detail}"
    )
    headers = dict(exc.headers or {})
    if exc.status_code == 405:
        headers["Allow"] = ", ".join(_allowed_methods(request))
    return problem_response(body, headers)


def _allowed_methods(request: Request) -> list[str]:
    """Every method some route serves on this path (starlette names only the first route's methods)."""
    probe = {**request.scope, "method": ""}
    methods = {
        method
        for route in request.app.router.routes
        if isinstance(route, Route) and route.methods and route.matches(probe)[0] == Match.PARTIAL
        for method in route.methods
    }
    return sorted(methods)


async def _unexpected_error(request: Request, exc: Exception) -> JSONResponse:
    """Starlette re-raises the error after this answer and uvicorn then closes the connection: say so, or the
    client's next request on it would meet a reset."""
    logger.exception("unhandled error on %s %s", request.method, request.url.path)
    request.state.error_type = "internal"
    body = _generic_problem(500, "internal", "Internal error", "an unexpected error occurred; it has been logged")
    return problem_response(body, {"Connection": "close"})


def install_problem_handlers(app: FastAPI) -> None:
    app.add_exception_handler(ServiceError, _service_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(Exception, _unexpected_error)
