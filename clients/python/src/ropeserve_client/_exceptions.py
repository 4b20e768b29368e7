"""Every exception the client raises, and the mapping from problem+json answers to them.

RopeserveError                       base of everything below
├── TransportError                   no HTTP answer (the httpx exception is ``__cause__``)
│   ├── ConnectError                 could not connect (refused, DNS, reset before an answer)
│   └── RequestTimeout               connect, read, write or pool timeout
├── DecodeError                      a success answer the client cannot decode (media type, safetensors bytes)
└── APIError                         the server answered an error (.status .slug .detail .field .problem)
    ├── ClientError                  any other 4xx
    │   ├── MalformedPayload         400 malformed-payload       (unparsable JSON / safetensors bytes)
    │   ├── Unauthorized             401 unauthorized            (missing or wrong bearer token)
    │   ├── NotFound                 404 not-found               (endpoint not on this server version)
    │   ├── MethodNotAllowed         405 method-not-allowed
    │   ├── NotAcceptable            406 not-acceptable          (e.g. a JSON answer over the size cap)
    │   ├── PayloadTooLarge          413 payload-too-large
    │   ├── UnsupportedMediaType     415 unsupported-media-type
    │   └── InvalidInput             422 invalid-input           (also a ValueError)
    │       └── LimitExceeded        422 limit-exceeded          (.limit)
    ├── Overloaded                   429 overloaded              retried; raised once retries run out
    └── ServerError                  any other 5xx
        ├── InternalError            500 internal
        └── NotReady                 503 not-ready               retried; raised once retries run out

The class comes from the problem's ``type`` slug (the last path segment of the type URI) when it is known, else
from the status code, else from the status class (4xx → ClientError, 5xx → ServerError).
"""

from __future__ import annotations

import json
from typing import Any, ClassVar

import httpx

__all__ = [
    "APIError",
    "ClientError",
    "ConnectError",
    "DecodeError",
    "InternalError",
    "InvalidInput",
    "LimitExceeded",
    "MalformedPayload",
    "MethodNotAllowed",
    "NotAcceptable",
    "NotFound",
    "NotReady",
    "Overloaded",
    "PayloadTooLarge",
    "RequestTimeout",
    "RopeserveError",
    "ServerError",
    "TransportError",
    "Unauthorized",
    "UnsupportedMediaType",
    "error_from_response",
    "error_from_transport",
]


class RopeserveError(Exception):
    """Base of every exception raised by ropeserve_client."""


class TransportError(RopeserveError):
    """The request got no HTTP answer."""


class ConnectError(TransportError):
    """The connection could not be made or broke before an answer."""


class RequestTimeout(TransportError):
    """A connect, read, write or pool timeout expired."""


class DecodeError(RopeserveError):
    """A success answer whose body the client cannot decode."""


class APIError(RopeserveError):
    """An error answer. ``problem`` is the RFC 9457 body (empty when the body was not problem+json)."""

    slug: ClassVar[str] = ""

    def __init__(
        self,
        status: int,
        problem: dict[str, Any],
        *,
        request_id: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        self.status = status
        self.problem = problem
        self.detail: str = str(problem.get("detail") or problem.get("title") or f"HTTP {status}")
        self.title: str = str(problem.get("title", ""))
        self.field: str | None = problem.get("field")
        self.type_uri: str = str(problem.get("type", ""))
        self.request_id = request_id
        self.retry_after = retry_after
        super().__init__(self._message())

    @property
    def type_slug(self) -> str:
        """The problem type's slug (``invalid-input``), whatever the class."""
        return problem_slug(self.type_uri)

    def _message(self) -> str:
        where = f" [field {self.field}]" if self.field else ""
        slug = self.type_slug or "error"
        return f"{self.status} {slug}: {self.detail}{where}"


class ClientError(APIError):
    """A 4xx answer: the request needs changing before it can succeed."""


class MalformedPayload(ClientError):
    slug = "malformed-payload"


class Unauthorized(ClientError):
    slug = "unauthorized"


class NotFound(ClientError):
    slug = "not-found"


class MethodNotAllowed(ClientError):
    slug = "method-not-allowed"


class NotAcceptable(ClientError):
    slug = "not-acceptable"


class PayloadTooLarge(ClientError):
    slug = "payload-too-large"


class UnsupportedMediaType(ClientError):
    slug = "unsupported-media-type"


class InvalidInput(ClientError, ValueError):
    slug = "invalid-input"


class LimitExceeded(InvalidInput):
    slug = "limit-exceeded"

    @property
    def limit(self) -> int | None:
        """The configured limit that was exceeded, when the server reported it."""
        value = self.problem.get("limit")
        return int(value) if isinstance(value, int | float) else None


class Overloaded(APIError):
    """429: the server's queue is full; the client retries it with backoff before raising."""

    slug = "overloaded"


class ServerError(APIError):
    """A 5xx answer."""


class InternalError(ServerError):
    slug = "internal"


class NotReady(ServerError):
    """503: warming up or draining; the client retries it with backoff before raising."""

    slug = "not-ready"


_BY_SLUG: dict[str, type[APIError]] = {
    cls.slug: cls
    for cls in (
        MalformedPayload,
        Unauthorized,
        NotFound,
        MethodNotAllowed,
        NotAcceptable,
        PayloadTooLarge,
        UnsupportedMediaType,
        InvalidInput,
        LimitExceeded,
        Overloaded,
        InternalError,
        NotReady,
    )
}
_BY_STATUS: dict[int, type[APIError]] = {
    400: MalformedPayload,
    401: Unauthorized,
    404: NotFound,
    405: MethodNotAllowed,
    406: NotAcceptable,
    413: PayloadTooLarge,
    415: UnsupportedMediaType,
    422: InvalidInput,
    429: Overloaded,
    500: InternalError,
    503: NotReady,
}


def problem_slug(type_uri: str) -> str:
    """``https://ropeserve.dev/problems/invalid-input`` → ``invalid-input``."""
    return type_uri.rstrip("/").rsplit("/", 1)[-1] if type_uri else ""


def error_class(status: int, slug: str) -> type[APIError]:
    """The exception class for an error answer: by slug, else by status, else by status class."""
    if slug in _BY_SLUG:
        return _BY_SLUG[slug]
    if status in _BY_STATUS:
        return _BY_STATUS[status]
    return ClientError if status < 500 else ServerError


def _problem_body(response: httpx.Response) -> dict[str, Any]:
    try:
        body = json.loads(response.content)
    except ValueError:
        text = response.content[:200].decode("utf-8", "replace").strip()
        return {"detail": text} if text else {}
    return body if isinstance(body, dict) else {"detail": str(body)}


def error_from_response(response: httpx.Response, retry_after: float | None = None) -> APIError:
    """The typed exception for an error ``response`` (problem+json, plain JSON or text bodies)."""
    problem = _problem_body(response)
    cls = error_class(response.status_code, problem_slug(str(problem.get("type", ""))))
    return cls(
        response.status_code,
        problem,
        request_id=response.headers.get("x-request-id"),
        retry_after=retry_after,
    )


def error_from_transport(exc: httpx.TransportError) -> TransportError:
    """Wrap an httpx transport failure (the caller raises it ``from exc``)."""
    cls = RequestTimeout if isinstance(exc, httpx.TimeoutException) else ConnectError
    request = getattr(exc, "_request", None)
    target = f" ({request.method} {request.url})" if request is not None else ""
    return cls(f"{type(exc).__name__}: {exc or 'no detail'}{target}")
