"""Tensor bodies in and out: safetensors requests (415/413/400/422 guards via the serving codec) and results as
JSON (small) or safetensors (``Accept: application/x-safetensors``), written without joining tensor bytes."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np
import torch
from fastapi import Request
from fastapi.responses import Response
from starlette.types import Receive, Scope, Send

from ropeserve.api.fast_json import FastJSONResponse
from ropeserve.config.jsonsafe import first_non_finite
from ropeserve.errors import InvalidInput, NotAcceptable, UnsupportedMediaType
from ropeserve.serving.codec import (
    ALLOWED_DTYPES,
    METADATA_KEY,
    EncodedSafetensors,
    SafetensorsPayload,
    decode_safetensors,
    encode_safetensors,
    read_body,
)
from ropeserve.settings import Settings

SAFETENSORS_MEDIA_TYPES = ("application/x-safetensors", "application/octet-stream")
SEND_CHUNK_BYTES = 1 << 20
"""Largest slice handed to the server per send, so a big tensor is never copied whole into its write buffer."""
TRANSPORT_HIGH_WATER_BYTES = 1 << 16
"""The transport's write-buffer high-water mark: asyncio's and uvloop's default, pinned by ``ropeserve serve``."""
TAIL_COPY_BYTES = 4 * TRANSPORT_HIGH_WATER_BYTES
"""The last bytes of a safetensors answer are sent as a copy of this size (see ``SafetensorsResponse``)."""

TENSOR_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "JSON by default; a safetensors file (tensors + JSON metadata under "
        f"'{METADATA_KEY}') when Accept names application/x-safetensors.",
        "content": {
            "application/json": {},
            "application/x-safetensors": {"schema": {"type": "string", "format": "binary"}},
        },
    }
}


class SafetensorsResponse(Response):
    """Sends an ``EncodedSafetensors`` chunk by chunk: header, then views of the tensors' bytes.

    The views may lie on a pooled request buffer, which ``on_sent`` hands back for the next request. uvicorn's
    ``send`` returns once the bytes are queued, not written: the transport keeps a reference (no copy) to the
    part the socket has not taken yet, up to its high-water mark ``TRANSPORT_HIGH_WATER_BYTES`` (beyond it, the
    next ``send`` waits). So the last ``TAIL_COPY_BYTES`` (> the high-water mark) go out as one ``bytes`` copy:
    when the final ``send`` returns, at most a high-water mark of bytes is pending, the transport writes in
    order, so everything pending lies inside that copy and no byte of the pooled buffer is referenced any more.
    """

    media_type = SAFETENSORS_MEDIA_TYPES[0]

    def __init__(
        self,
        encoded: EncodedSafetensors,
        headers: Mapping[str, str] | None = None,
        on_sent: Callable[[], None] | None = None,
    ) -> None:
        """``on_sent`` runs once the last byte has been handed to the server (not on a failed send)."""
        self.encoded, self.on_sent = encoded, on_sent
        super().__init__(headers={**(headers or {}), "content-length": str(encoded.length)})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        pieces, tail = split_tail(self.encoded.chunks, TAIL_COPY_BYTES)
        for chunk in pieces:
            for start in range(0, len(chunk), SEND_CHUNK_BYTES):
                piece = chunk[start : start + SEND_CHUNK_BYTES]
                await send({"type": "http.response.body", "body": piece, "more_body": True})
        await send({"type": "http.response.body", "body": tail, "more_body": False})
        if self.on_sent is not None:
            self.on_sent()


def split_tail(chunks: Iterable[bytes | memoryview], tail_bytes: int) -> tuple[list[memoryview], bytes]:
    """``chunks`` as views of all but their last ``tail_bytes`` bytes, and those last bytes as one copy."""
    views = [memoryview(chunk).cast("B") for chunk in chunks]
    keep = max(0, sum(len(view) for view in views) - tail_bytes)
    head: list[memoryview] = []
    tail: list[memoryview] = []
    for view in views:
        cut = min(len(view), keep)
        head += [view[:cut]] if cut else []
        tail += [view[cut:]] if cut < len(view) else []
        keep -= cut
    return head, b"".join(tail)


async def read_safetensors_request(
    request: Request,
    settings: Settings,
    *,
    required: Iterable[str],
    optional: Iterable[str] = (),
    allowed_dtypes: frozenset[str] = ALLOWED_DTYPES,
    timings: dict[str, float] | None = None,
    take: Callable[[int], memoryview | None] | None = None,
    keep: Callable[[bytearray], None] | None = None,
) -> SafetensorsPayload:
    """The request's safetensors body, decoded with every guard before any tensor is built.

    415 for another content type, 413 past ``max_body_bytes`` (before reading when Content-Length says so),
    400 for malformed bytes, 422 naming the tensor for dtype/shape/limit/presence problems. ``timings`` (if given)
    receives ``read_s`` and ``decode_s``; ``take`` may lend the body buffer and ``keep`` receives a grown one (see
    ``codec.read_body``).
    """
    media_type = media_type_of(request.headers.get("content-type"))
    if media_type not in SAFETENSORS_MEDIA_TYPES:
        raise UnsupportedMediaType(
            f"send a safetensors body as application/x-safetensors (got {media_type or 'no content type'!r})",
            field="content-type",
        )
    started = time.perf_counter()
    body = await read_body(request, settings.max_body_bytes, take, keep)
    read_done = time.perf_counter()
    payload = decode_safetensors(
        body,
        max_elements=settings.max_tensor_elements,
        required=tuple(required),
        optional=tuple(optional),
        allowed_dtypes=allowed_dtypes,
    )
    if timings is not None:
        timings.update(read_s=read_done - started, decode_s=time.perf_counter() - read_done)
    return payload


def media_type_of(content_type: str | None) -> str:
    """The media type of a Content-Type value, lower-cased without parameters ('' when absent)."""
    return (content_type or "").split(";")[0].strip().lower()


AnswerArray = torch.Tensor | np.ndarray
"""A tensor of an answer: a torch tensor, or a numpy array where the work was done in numpy."""


def json_array(name: str, tensor: AnswerArray) -> np.ndarray | int | float:
    """``tensor`` for the JSON encoder: a C-contiguous float64 (floats) or int64 array, a number for a 0-d tensor;
    a non-finite float (JSON cannot carry it) is a 422 naming the tensor."""
    array = _wide_array(tensor)
    if array.dtype == np.float64 and not bool(np.isfinite(array).all()):
        raise InvalidInput(
            f"'{name}' has non-finite values for these parameters (JSON cannot carry them); "
            "check the inputs, or ask for application/x-safetensors",
            field=name,
        )
    return array.item() if array.ndim == 0 else array


def _wide_array(tensor: AnswerArray) -> np.ndarray:
    """``tensor`` as a C-contiguous float64 or int64 CPU array (shared with it when it already is one)."""
    if isinstance(tensor, np.ndarray):
        return np.ascontiguousarray(tensor, dtype=np.float64 if tensor.dtype.kind in "fc" else np.int64)
    wide = torch.float64 if tensor.is_floating_point() else torch.int64
    if tensor.dtype == wide and tensor.device.type == "cpu" and tensor.is_contiguous() and not tensor.requires_grad:
        return tensor.numpy()
    return tensor.detach().cpu().to(wide).contiguous().numpy()


def as_tensor(tensor: AnswerArray) -> torch.Tensor:
    """``tensor`` as a torch tensor (a numpy array copied: an answer never shares memory the caller may not write)."""
    return torch.from_numpy(tensor.copy()) if isinstance(tensor, np.ndarray) else tensor


def wants_safetensors(request: Request, binary_default: bool = False) -> bool:
    """Safetensors when Accept names it; with ``binary_default`` also unless Accept asks for JSON only."""
    accept = request.headers.get("accept", "").lower()
    if any(media in accept for media in SAFETENSORS_MEDIA_TYPES):
        return True
    return binary_default and "application/json" not in accept


def tensor_response(
    request: Request,
    tensors: Mapping[str, AnswerArray],
    meta: dict[str, Any],
    json_max_elements: int,
    *,
    binary_default: bool = False,
) -> Response:
    """``meta`` plus ``tensors``: safetensors if asked for, else JSON (406 above ``json_max_elements``).

    A NaN or infinity in ``meta`` (no JSON can carry it) is a 422 naming its key, whatever the format.
    """
    non_finite = first_non_finite(meta)
    if non_finite is not None:
        raise InvalidInput(
            f"the result's {non_finite.lstrip('/')!r} is not finite for these inputs", field=non_finite.lstrip("/")
        )
    if wants_safetensors(request, binary_default):
        torch_tensors = {name: as_tensor(tensor) for name, tensor in tensors.items()}
        return SafetensorsResponse(encode_safetensors(torch_tensors, {METADATA_KEY: json.dumps(meta)}))
    elements = sum(math.prod(tensor.shape) for tensor in tensors.values())
    if elements > json_max_elements:
        raise NotAcceptable(
            f"the result has {elements} elements; JSON responses carry at most {json_max_elements}: "
            "send 'Accept: application/x-safetensors'",
            field="accept",
            limit=json_max_elements,
        )
    payload: dict[str, Any] = dict(meta)
    for name, tensor in tensors.items():
        payload[name] = json_array(name, tensor)
    return FastJSONResponse(payload)
