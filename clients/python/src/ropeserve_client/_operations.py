"""Operations: one request to send plus the parser of its answer. Shared by Client and AsyncClient (no I/O here).

An :class:`Operation` says what to send (method, path, JSON or safetensors body, extra headers), whether the answer
holds tensors (the client then negotiates safetensors), and how to turn a success answer into a result.
``_endpoints.py`` builds one per endpoint.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, Literal, TypeVar

import httpx
import numpy as np

from ropeserve_client._arrays import (
    SAFETENSORS_MEDIA_TYPE,
    decode_safetensors,
    encode_safetensors,
    json_ready,
    to_array,
)
from ropeserve_client._exceptions import DecodeError
from ropeserve_client._results import LintReport, TensorResult

__all__ = [
    "ConfigLike",
    "Operation",
    "PositionsLike",
    "get_json",
    "get_text",
    "json_post",
    "lint_post",
    "load_config",
    "position_spec",
    "rope_source",
    "tensor_post",
    "tensors_post",
]

T = TypeVar("T")
Backend = Literal["torch", "numpy"]
Parser = Callable[[httpx.Response, Backend], T]
ConfigLike = Mapping[str, Any] | str | os.PathLike[str]
"""A config.json as a mapping, or the path of a JSON file."""
PositionsLike = Sequence[int] | range | str | Any
"""Positions: a list, a ``range``, ``"start:stop[:step]"``, or a 1-D tensor/array."""

JSON_MEDIA_TYPE = "application/json"
TimeoutLike = float | httpx.Timeout | None


@dataclass(frozen=True)
class Operation(Generic[T]):
    """One request and the parser of its success answer."""

    method: str
    path: str
    parse: Parser[T]
    json: Any = None
    content: bytes | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    tensor_answer: bool = False
    """The answer holds tensors: the client asks for safetensors (or JSON when configured to)."""
    retry: bool = True
    """Retry 429/502/503/504 and connection failures (off for readiness probes, which must report the truth)."""
    timeout: TimeoutLike | httpx._client.UseClientDefault = httpx.USE_CLIENT_DEFAULT
    """This request's timeout (seconds, ``httpx.Timeout`` or None for none); by default the client's."""

    def with_call_options(
        self,
        timeout: TimeoutLike | httpx._client.UseClientDefault = httpx.USE_CLIENT_DEFAULT,
        extra_headers: Mapping[str, str] | None = None,
    ) -> Operation[T]:
        """This operation with a per-call timeout and extra request headers (they win over the defaults)."""
        headers = {**self.headers, **(extra_headers or {})}
        return dataclasses.replace(self, timeout=timeout, headers=headers)


# --------------------------------------------------------------------------------------------------------------
# Answer parsers
# --------------------------------------------------------------------------------------------------------------


def _media_type(response: httpx.Response) -> str:
    content_type: str = response.headers.get("content-type", "")
    return content_type.split(";")[0].strip().lower()


def parse_json(response: httpx.Response, backend: Backend) -> dict[str, Any]:
    try:
        body = response.json()
    except ValueError as exc:
        raise DecodeError(f"expected JSON from {response.request.url.path}, got {_media_type(response)!r}") from exc
    return body if isinstance(body, dict) else {"value": body}


def parse_text(response: httpx.Response, backend: Backend) -> str:
    return response.text


def parse_empty(response: httpx.Response, backend: Backend) -> dict[str, Any]:
    """An answer without a body (204)."""
    return {}


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _numeric_list(value: Any) -> bool:
    """A non-empty (nested) list whose leaves are all numbers."""
    if not isinstance(value, list) or not value:
        return False
    return all(_numeric_list(item) if isinstance(item, list) else _is_number(item) for item in value)


def _json_array(value: list[Any], backend: Backend) -> Any:
    array = np.asarray(value)
    if array.dtype.kind == "f":
        array = array.astype(np.float32)
    return to_array(array, backend)


def parse_tensors(response: httpx.Response, backend: Backend) -> TensorResult:
    """Safetensors answers decode exactly; in JSON answers every top-level numeric (nested) list is a tensor."""
    request_id = response.headers.get("x-request-id")
    if _media_type(response) in (SAFETENSORS_MEDIA_TYPE, "application/octet-stream"):
        tensors, meta = decode_safetensors(response.content, backend)
        return TensorResult(tensors=tensors, meta=meta, request_id=request_id)
    body = parse_json(response, backend)
    tensors = {key: _json_array(value, backend) for key, value in body.items() if _numeric_list(value)}
    meta = {key: value for key, value in body.items() if key not in tensors}
    return TensorResult(tensors=tensors, meta=meta, request_id=request_id)


def parse_lint(response: httpx.Response, backend: Backend) -> LintReport:
    return LintReport.from_json(parse_json(response, backend), response.headers.get("x-request-id"))


# --------------------------------------------------------------------------------------------------------------
# Request bodies
# --------------------------------------------------------------------------------------------------------------


def drop_none(values: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON-ready items of ``values`` that are not None."""
    return {key: json_ready(value) for key, value in values.items() if value is not None}


def load_config(config: ConfigLike) -> dict[str, Any]:
    """A config mapping as is, or the JSON object in the file at ``config``."""
    if isinstance(config, Mapping):
        return dict(config)
    text = Path(config).read_text(encoding="utf-8")
    loaded = json.loads(text)
    if not isinstance(loaded, dict):
        raise ValueError(f"{config}: a config must be a JSON object")
    return loaded


def rope_source(
    *,
    preset: str | None = None,
    config: ConfigLike | None = None,
    rope: Mapping[str, Any] | None = None,
    layer_type: str | None = None,
) -> dict[str, Any]:
    """Where rope parameters come from: exactly one of ``preset``, ``config`` or ``rope`` (the server checks)."""
    loaded = load_config(config) if config is not None else None
    return drop_none({"preset": preset, "config": loaded, "rope": rope, "layer_type": layer_type})


def position_spec(positions: PositionsLike) -> Any:
    """JSON for a positions argument: ``range``/``"a:b[:s]"`` become ``{start, stop, step}``, arrays lists."""
    if isinstance(positions, range):
        return {"start": positions.start, "stop": positions.stop, "step": positions.step}
    if isinstance(positions, str):
        parts = positions.split(":")
        if len(parts) not in (2, 3) or not all(part.strip().lstrip("-").isdigit() for part in parts):
            raise ValueError(f"positions {positions!r}: expected 'start:stop' or 'start:stop:step'")
        numbers = [int(part) for part in parts]
        return {"start": numbers[0], "stop": numbers[1], "step": numbers[2] if len(parts) == 3 else 1}
    return json_ready(positions)


def get_json(path: str, *, retry: bool = True) -> Operation[dict[str, Any]]:
    return Operation("GET", path, parse_json, retry=retry)


def get_text(path: str) -> Operation[str]:
    return Operation("GET", path, parse_text)


def json_post(path: str, body: Mapping[str, Any]) -> Operation[dict[str, Any]]:
    """POST a JSON body; the answer is JSON."""
    return Operation("POST", path, parse_json, json=drop_none(body))


def lint_post(path: str, body: Mapping[str, Any]) -> Operation[LintReport]:
    return Operation("POST", path, parse_lint, json=drop_none(body))


def tensor_post(path: str, body: Mapping[str, Any]) -> Operation[TensorResult]:
    """POST a JSON body; the answer holds tensors."""
    return Operation("POST", path, parse_tensors, json=drop_none(body), tensor_answer=True)


def tensors_post(path: str, tensors: Mapping[str, Any], params: Mapping[str, Any]) -> Operation[TensorResult]:
    """POST a safetensors body (``tensors`` + JSON ``params`` in its metadata); the answer holds tensors."""
    present = {name: value for name, value in tensors.items() if value is not None}
    content = encode_safetensors(present, drop_none(params))
    headers = {"content-type": SAFETENSORS_MEDIA_TYPE}
    return Operation("POST", path, parse_tensors, content=content, headers=headers, tensor_answer=True)
