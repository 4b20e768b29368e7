"""Error tree shared by every layer (no web imports); the API renders it as RFC 9457 problem+json.

ServiceError                      500  internal
├── InvalidInput                  422  invalid-input      (bad config, inconsistent shapes, ...)
│   └── LimitExceeded             422  limit-exceeded     (positions, table or tensor elements)
├── MalformedPayload              400  malformed-payload  (unparsable JSON / safetensors bytes)
├── Unauthorized                  401  unauthorized
├── RequestTimeout                408  request-timeout    (head or body too slow; the connection closes)
├── NotFound                      404  not-found          (an unknown shared-memory region or object)
├── NotAcceptable                 406  not-acceptable     (Accept names no media type we produce)
├── Conflict                      409  conflict           (a region registered differently, unlinked or shrunk)
├── PayloadTooLarge               413  payload-too-large  (body size, refused before it is read)
├── UnsupportedMediaType          415  unsupported-media-type
├── Overloaded                    429  overloaded         (queue full; Retry-After)
├── NotReady                      503  not-ready          (warming up or draining; Retry-After)
└── Busy                          503  busy               (request bodies or connections at their cap; Retry-After)
"""

from __future__ import annotations

from typing import Any, ClassVar

PROBLEM_BASE_URI = "https://ropeserve.dev/problems/"


def field_path(field: str) -> str:
    """The one notation of ``field`` in problem documents: dotted keys and ``[index]``.

    ``rope.rope_type``, ``config.rope_scaling.rope_type``, ``rows[0].segments[1]``; ``body`` or a header name
    when the whole body or a header is at fault. JSON pointers raised deeper down (``/rope_scaling/factor``,
    ``/text_config/rope_theta``) are rewritten here, so clients meet one notation.
    """
    if not field.startswith("/"):
        return field
    path = ""
    for part in field[1:].split("/"):
        key = part.replace("~1", "/").replace("~0", "~")
        path += f"[{key}]" if key.isdigit() else f".{key}"
    return path.lstrip(".")


class ServiceError(Exception):
    """Base of all errors the service answers with a problem document."""

    status: ClassVar[int] = 500
    slug: ClassVar[str] = "internal"
    title: ClassVar[str] = "Internal error"

    def __init__(
        self,
        detail: str,
        *,
        field: str | None = None,
        headers: dict[str, str] | None = None,
        **extensions: Any,
    ) -> None:
        super().__init__(detail)
        self.detail = detail
        self.field = field
        self.headers = headers or {}
        self.extensions = extensions

    @property
    def type_uri(self) -> str:
        return PROBLEM_BASE_URI + self.slug

    def to_problem(self, instance: str | None = None) -> dict[str, Any]:
        """The RFC 9457 body: type, title, status, detail, and ``field`` when one input is to blame."""
        body: dict[str, Any] = {
            "type": self.type_uri,
            "title": self.title,
            "status": self.status,
            "detail": self.detail,
        }
        if self.field is not None:
            body["field"] = field_path(self.field)
        if instance is not None:
            body["instance"] = instance
        body.update(self.extensions)
        return body


class InvalidInput(ServiceError, ValueError):
    status = 422
    slug = "invalid-input"
    title = "Invalid input"


class LimitExceeded(InvalidInput):
    slug = "limit-exceeded"
    title = "Request exceeds a configured limit"


class MalformedPayload(ServiceError, ValueError):
    status = 400
    slug = "malformed-payload"
    title = "Malformed payload"


class Unauthorized(ServiceError):
    status = 401
    slug = "unauthorized"
    title = "Missing or invalid bearer token"


class RequestTimeout(ServiceError):
    status = 408
    slug = "request-timeout"
    title = "Request timeout"


class NotFound(ServiceError):
    status = 404
    slug = "not-found"
    title = "Not found"


class Conflict(ServiceError):
    status = 409
    slug = "conflict"
    title = "Conflict"


class NotAcceptable(ServiceError):
    status = 406
    slug = "not-acceptable"
    title = "No acceptable response media type"


class PayloadTooLarge(ServiceError):
    status = 413
    slug = "payload-too-large"
    title = "Payload too large"


class UnsupportedMediaType(ServiceError):
    status = 415
    slug = "unsupported-media-type"
    title = "Unsupported media type"


class Overloaded(ServiceError):
    status = 429
    slug = "overloaded"
    title = "Too many requests queued"


class NotReady(ServiceError):
    status = 503
    slug = "not-ready"
    title = "Service not ready"


class Busy(ServiceError):
    status = 503
    slug = "busy"
    title = "Server busy"


def check_limit(count: int, limit: int, what: str, field: str | None = None) -> None:
    """Raise LimitExceeded when ``count`` exceeds ``limit``; call before doing the work."""
    if count > limit:
        raise LimitExceeded(f"{what}: {count} exceeds the limit of {limit}", field=field, limit=limit)
