"""Python client for ropeserve: position ids, RoPE cos/sin, Q/K rotation, config lint over HTTP.

``Client`` (blocking) and ``AsyncClient`` (asyncio) expose one method per endpoint and return torch tensors when
torch is importable, numpy arrays otherwise. Errors are typed (see ``ropeserve_client._exceptions``); 429 and 503
answers are retried with exponential backoff and jitter, honouring ``Retry-After``.
"""

from ropeserve_client._clients import DEFAULT_LIMITS, DEFAULT_TIMEOUT, DEFAULT_URL, AsyncClient, Client
from ropeserve_client._exceptions import (
    APIError,
    ClientError,
    ConnectError,
    DecodeError,
    InternalError,
    InvalidInput,
    LimitExceeded,
    MalformedPayload,
    MethodNotAllowed,
    NotAcceptable,
    NotFound,
    NotReady,
    Overloaded,
    PayloadTooLarge,
    RequestTimeout,
    RopeserveError,
    ServerError,
    TransportError,
    Unauthorized,
    UnsupportedMediaType,
)
from ropeserve_client._operations import Operation
from ropeserve_client._results import Finding, LintReport, TensorResult
from ropeserve_client._retry import DEFAULT_RETRY, NO_RETRY, RetryPolicy
from ropeserve_client._version import __version__

__all__ = [
    "DEFAULT_LIMITS",
    "DEFAULT_RETRY",
    "DEFAULT_TIMEOUT",
    "DEFAULT_URL",
    "NO_RETRY",
    "APIError",
    "AsyncClient",
    "Client",
    "ClientError",
    "ConnectError",
    "DecodeError",
    "Finding",
    "InternalError",
    "InvalidInput",
    "LimitExceeded",
    "LintReport",
    "MalformedPayload",
    "MethodNotAllowed",
    "NotAcceptable",
    "NotFound",
    "NotReady",
    "Operation",
    "Overloaded",
    "PayloadTooLarge",
    "RequestTimeout",
    "RetryPolicy",
    "RopeserveError",
    "ServerError",
    "TensorResult",
    "TransportError",
    "Unauthorized",
    "UnsupportedMediaType",
    "__version__",
]
