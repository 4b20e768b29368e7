"""``Client`` (sync) and ``AsyncClient``: the same endpoints over ``httpx.Client`` / ``httpx.AsyncClient``.

Everything except the send loop lives in :class:`BaseClient` (headers, Accept negotiation, retry decisions, answer
parsing) and in the operation builders, so the two classes differ only where one awaits and the other blocks.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from types import TracebackType
from typing import Any, Generic, Literal, Self, TypeVar

import httpx

from ropeserve_client._arrays import SAFETENSORS_MEDIA_TYPE, ArrayBackend, resolve_backend
from ropeserve_client._endpoints import Endpoints
from ropeserve_client._exceptions import (
    APIError,
    NotFound,
    TransportError,
    error_from_response,
    error_from_transport,
)
from ropeserve_client._operations import JSON_MEDIA_TYPE, Operation
from ropeserve_client._results import TensorResult
from ropeserve_client._retry import DEFAULT_RETRY, RetryPolicy, parse_retry_after
from ropeserve_client._shm import Region, ShmPool, stage
from ropeserve_client._version import __version__

__all__ = ["DEFAULT_LIMITS", "DEFAULT_TIMEOUT", "DEFAULT_URL", "AsyncClient", "BaseClient", "Client"]

T = TypeVar("T")
HttpClient = TypeVar("HttpClient", httpx.Client, httpx.AsyncClient)

DEFAULT_URL = "http://127.0.0.1:8000"
DEFAULT_TIMEOUT = httpx.Timeout(60.0, connect=5.0)
"""Connect within 5 s; 60 s for each read/write/pool wait (large rotations on a busy CPU take seconds)."""
DEFAULT_LIMITS = httpx.Limits(max_connections=64, max_keepalive_connections=16)
PROBLEM_MEDIA_TYPE = "application/problem+json"
Wire = Literal["safetensors", "json"]


class BaseClient(Generic[HttpClient]):
    """Configuration and all non-I/O behaviour shared by Client and AsyncClient.

    * **base_url** - server root (default ``$ROPESERVE_URL`` or ``http://127.0.0.1:8000``).
    * **token** - bearer token (default ``$ROPESERVE_TOKEN``).
    * **timeout** - seconds or an ``httpx.Timeout`` (default: connect 5 s, read/write 60 s).
    * **retry** - a :class:`RetryPolicy` (429/502/503/504/connection failures; ``NO_RETRY`` disables).
    * **array_backend** - ``auto`` (torch if importable, else numpy), ``torch`` or ``numpy``.
    * **wire** - how tensor answers travel: ``safetensors`` (default; exact dtypes, no size cap) or ``json``.
    * **headers**, **limits**, **transport** - passed to httpx; **http_client** - use this httpx client
      instead of making one (it is then not closed by :meth:`close`).
    """

    def __init__(
        self,
        base_url: str | None = None,
        *,
        token: str | None = None,
        timeout: float | httpx.Timeout = DEFAULT_TIMEOUT,
        retry: RetryPolicy = DEFAULT_RETRY,
        array_backend: ArrayBackend = "auto",
        wire: Wire = "safetensors",
        headers: dict[str, str] | None = None,
        limits: httpx.Limits = DEFAULT_LIMITS,
        transport: httpx.BaseTransport | httpx.AsyncBaseTransport | None = None,
        http_client: HttpClient | None = None,
    ) -> None:
        self.base_url = (base_url or os.environ.get("ROPESERVE_URL") or DEFAULT_URL).rstrip("/")
        self.retry = retry
        self.backend = resolve_backend(array_backend)
        self.wire = wire
        self._owns_http = http_client is None
        self._shm = ShmPool()
        token = token or os.environ.get("ROPESERVE_TOKEN")
        default_headers = {"user-agent": f"ropeserve-client/{__version__}", **(headers or {})}
        if token:
            default_headers["authorization"] = f"Bearer {token}"
        self._http: HttpClient = http_client or self._new_http(
            base_url=self.base_url, headers=default_headers, timeout=timeout, limits=limits, transport=transport
        )

    def _new_http(self, **options: Any) -> HttpClient:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.base_url!r}, backend={self.backend!r})"

    def _accept(self, operation: Operation[Any]) -> str:
        if operation.tensor_answer and self.wire == "safetensors":
            return f"{SAFETENSORS_MEDIA_TYPE}, {PROBLEM_MEDIA_TYPE}"
        return f"{JSON_MEDIA_TYPE}, {PROBLEM_MEDIA_TYPE}, */*;q=0.5"

    def _build_request(self, operation: Operation[Any]) -> httpx.Request:
        headers = {"accept": self._accept(operation), **operation.headers}
        return self._http.build_request(
            operation.method,
            operation.path,
            json=operation.json,
            content=operation.content,
            headers=headers,
            timeout=operation.timeout,
        )

    def _delay_after_answer(self, operation: Operation[Any], response: httpx.Response, attempt: int) -> float | None:
        """Seconds to wait before retrying this answer, or None to return or raise it now."""
        if not (operation.retry and self.retry.retries_status(response.status_code, attempt)):
            return None
        return self.retry.delay(attempt, parse_retry_after(response.headers.get("retry-after")))

    def _delay_after_error(self, operation: Operation[Any], error: httpx.TransportError, attempt: int) -> float:
        """Seconds to wait before retrying after a transport failure; raises the typed error when not retried."""
        if operation.retry and self.retry.retries_error(error, attempt):
            return self.retry.delay(attempt)
        raise error_from_transport(error) from error

    def _result(self, operation: Operation[T], response: httpx.Response) -> T:
        """The parsed result of a success answer; raises the typed APIError for an error answer."""
        if response.is_success:
            return operation.parse(response, self.backend)
        raise error_from_response(response, parse_retry_after(response.headers.get("retry-after")))


class Client(BaseClient[httpx.Client], Endpoints):
    """Blocking client; one pooled ``httpx.Client`` (connections are reused). Use as a context manager.

    ::

        with Client("http://127.0.0.1:8000") as client:
            table = client.cos_sin(range(16), preset="llama-3.1-8b")
            table["cos"].shape  # torch.Size([16, 128])
    """

    def _new_http(self, **options: Any) -> httpx.Client:
        return httpx.Client(**options)

    def _send(self, operation: Operation[T]) -> T:
        attempt = 0
        while True:
            try:
                response = self._http.send(self._build_request(operation))
            except httpx.TransportError as error:
                delay = self._delay_after_error(operation, error, attempt)
            else:
                answer_delay = self._delay_after_answer(operation, response, attempt)
                if answer_delay is None:
                    return self._result(operation, response)
                delay = answer_delay
            self._sleep(delay)
            attempt += 1

    def _sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    def _rotate_shm(self, path: str, tensors: dict[str, Any], params: dict[str, Any]) -> TensorResult:
        """A rotation through shared memory (``transport="shm"``; see ``ropeserve_client._shm``)."""
        call = stage(self._shm, path, tensors, params, self.backend)
        for region in call.retired:
            self._forget(region)
        try:
            if not call.region.registered:
                self._send(call.region.register())
                call.region.registered = True
            try:
                answer = self._send(call.operation)
            except NotFound:  # this server (or worker process) does not know the region: register it there, once
                self._send(call.region.register())
                answer = self._send(call.operation)
            return TensorResult(*call.finish(answer))
        finally:
            call.release()

    def _forget(self, region: Region) -> None:
        """Unlink a region and unregister it (best effort: the server may be gone)."""
        region.unlink()
        if region.registered:
            with contextlib.suppress(APIError, TransportError):
                self._send(region.unregister())

    def close(self) -> None:
        """Unregister and unlink shared-memory regions; close pooled connections (only those of an httpx client
        this object made)."""
        for region in self._shm.drain():
            self._forget(region)
        if self._owns_http:
            self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()


class AsyncClient(BaseClient[httpx.AsyncClient], Endpoints):
    """asyncio client; every endpoint method returns an awaitable. Use as an async context manager.

    ::

        async with AsyncClient("http://127.0.0.1:8000") as client:
            table = await client.cos_sin(range(16), preset="llama-3.1-8b")
    """

    def _new_http(self, **options: Any) -> httpx.AsyncClient:
        return httpx.AsyncClient(**options)

    async def _send(self, operation: Operation[T]) -> T:
        attempt = 0
        while True:
            try:
                response = await self._http.send(self._build_request(operation))
            except httpx.TransportError as error:
                delay = self._delay_after_error(operation, error, attempt)
            else:
                answer_delay = self._delay_after_answer(operation, response, attempt)
                if answer_delay is None:
                    return self._result(operation, response)
                delay = answer_delay
            await self._sleep(delay)
            attempt += 1

    async def _sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    async def _rotate_shm(self, path: str, tensors: dict[str, Any], params: dict[str, Any]) -> TensorResult:
        """As :meth:`Client._rotate_shm`, awaiting each request."""
        call = stage(self._shm, path, tensors, params, self.backend)
        for region in call.retired:
            await self._forget(region)
        try:
            if not call.region.registered:
                await self._send(call.region.register())
                call.region.registered = True
            try:
                answer = await self._send(call.operation)
            except NotFound:
                await self._send(call.region.register())
                answer = await self._send(call.operation)
            return TensorResult(*call.finish(answer))
        finally:
            call.release()

    async def _forget(self, region: Region) -> None:
        region.unlink()
        if region.registered:
            with contextlib.suppress(APIError, TransportError):
                await self._send(region.unregister())

    async def aclose(self) -> None:
        """Unregister and unlink shared-memory regions; close pooled connections (only those of an httpx client
        this object made)."""
        for region in self._shm.drain():
            await self._forget(region)
        if self._owns_http:
            await self._http.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        await self.aclose()
