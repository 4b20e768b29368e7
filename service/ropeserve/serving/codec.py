"""safetensors as the wire format: a capped body reader, a guarded zero-copy decoder and a chunked encoder.

Layout (huggingface/safetensors): 8-byte little-endian u64 header length ``N``, an ``N``-byte UTF-8 JSON object
``{name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {str: str}}``, then the data buffer, which the
tensors tile without holes or overlaps. Request parameters travel as one JSON string under
``__metadata__["ropeserve"]``.

Every check runs before a tensor is built, in this order: body size (``read_body``), header length, header JSON,
metadata, each entry (keys, dtype allow-list, shape, element budget, offsets and byte span), tiling of the buffer,
required and allowed names. Each failure is a ``ropeserve.errors`` exception whose ``field`` names the tensor (or
``body`` / ``__metadata__``). Nothing is ever unpickled. Decoded tensors are views on the request buffer (a copy
only for a misaligned tensor), so a kernel may rotate them in place; the encoder returns the header and each
tensor's raw bytes as separate chunks, never a joined copy.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import torch
from pydantic import BaseModel, ValidationError

from ropeserve.config.jsonsafe import loads_bounded
from ropeserve.errors import InvalidInput, LimitExceeded, MalformedPayload, PayloadTooLarge

METADATA_KEY = "ropeserve"
"""``__metadata__`` key holding the request parameters (and the response's metadata) as a JSON string."""
METADATA_FIELD = f"__metadata__.{METADATA_KEY}"
HEADER_LENGTH_CAP = 1 << 20
"""Largest header accepted: parameters plus a full config.json fit in a few KiB."""
HEADER_ALIGNMENT = 8
"""The encoder pads the header with spaces so the data (and every tensor after it) starts 8-byte aligned."""

SAFETENSORS_DTYPES: dict[str, torch.dtype] = {
    "BOOL": torch.bool,
    "U8": torch.uint8,
    "I8": torch.int8,
    "I16": torch.int16,
    "U16": torch.uint16,
    "I32": torch.int32,
    "U32": torch.uint32,
    "I64": torch.int64,
    "U64": torch.uint64,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "F32": torch.float32,
    "F64": torch.float64,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
}
"""Every dtype name the format defines (names outside it are malformed, not merely refused)."""
DTYPE_NAMES = {dtype: name for name, dtype in SAFETENSORS_DTYPES.items()}
ALLOWED_DTYPES = frozenset({"F32", "BF16", "F16", "I32", "I64"})
"""Dtypes the rotation endpoints accept."""
ENTRY_KEYS = frozenset({"dtype", "shape", "data_offsets"})

Model = TypeVar("Model", bound=BaseModel)


class BodyStream(Protocol):
    """What ``read_body`` needs from a request (a Starlette ``Request`` fits)."""

    @property
    def headers(self) -> Mapping[str, str]: ...

    def stream(self) -> AsyncIterator[bytes]: ...


async def read_body(
    request: BodyStream,
    limit: int,
    take: Callable[[int], memoryview | None] | None = None,
    keep: Callable[[bytearray], None] | None = None,
) -> bytearray | memoryview:
    """The request body as a writable buffer; PayloadTooLarge (413) before reading when ``Content-Length`` says
    it is over ``limit``, or as soon as a streamed body crosses it.

    With a declared length, ``take(length)`` may lend an idle exact-size buffer to read into
    (``buffers.BodyBuffers``); otherwise the body grows in a new ``bytearray`` as its bytes arrive (never sized
    from the declared length alone), which ``keep`` (if given) receives once complete.
    """
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.strip().isdigit():
            raise MalformedPayload(f"Content-Length {declared!r} is not a byte count", field="content-length")
        _check_body_size(int(declared), limit)
        lent = take(int(declared)) if take else None
        if lent is not None:
            return await _read_into(request, lent)
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        _check_body_size(len(body), limit)
    if keep is not None:
        keep(body)
    return body


async def _read_into(request: BodyStream, buffer: memoryview) -> memoryview:
    """Fill ``buffer`` (the declared length) from the stream; MalformedPayload if the body is shorter or longer."""
    received = 0
    async for chunk in request.stream():
        end = received + len(chunk)
        if end > len(buffer):
            raise MalformedPayload(f"the body runs past its Content-Length {len(buffer)}", field="content-length")
        buffer[received:end] = chunk
        received = end
    if received != len(buffer):
        raise MalformedPayload(
            f"the body ended after {received} of its {len(buffer)} declared bytes", field="content-length"
        )
    return buffer


def _check_body_size(size: int, limit: int) -> None:
    if size > limit:
        raise PayloadTooLarge(
            f"body of {size}+ bytes exceeds the limit of {limit}",
            field="body",
            headers={"Connection": "close"},
            limit=limit,
        )


@dataclass(frozen=True)
class SafetensorsPayload:
    """A decoded body: ``tensors`` are views on the request buffer; ``metadata`` is the str→str map."""

    tensors: dict[str, torch.Tensor]
    metadata: dict[str, str]

    def params(self, model: type[Model]) -> Model:
        """The JSON object under ``__metadata__["ropeserve"]`` validated as ``model``.

        Missing or not an object → InvalidInput; unparsable JSON → MalformedPayload; a bad value →
        InvalidInput naming its key.
        """
        raw = self.metadata.get(METADATA_KEY)
        if raw is None:
            raise InvalidInput(f"the parameters go under {METADATA_FIELD} as a JSON string", field=METADATA_FIELD)
        try:
            return model.model_validate_json(raw)
        except ValidationError as error:
            first = error.errors()[0]
            if first["type"] == "json_invalid":
                raise MalformedPayload(f"{METADATA_FIELD} is not JSON: {first['msg']}", field=METADATA_FIELD) from None
            name = ".".join(str(part) for part in first["loc"]) or METADATA_FIELD
            raise InvalidInput(f"{name}: {first['msg']}", field=name) from None


@dataclass(frozen=True)
class _Entry:
    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    begin: int
    end: int


def decode_safetensors(
    body: bytearray | memoryview | bytes,
    *,
    max_elements: int,
    required: Iterable[str] = (),
    optional: Iterable[str] | None = None,
    allowed_dtypes: frozenset[str] = ALLOWED_DTYPES,
    header_cap: int = HEADER_LENGTH_CAP,
) -> SafetensorsPayload:
    """Check ``body`` completely, then return its tensors as views (see the module docstring).

    ``required`` names must be present; with ``optional`` given, no other names are allowed. ``max_elements``
    bounds the elements of all tensors together. ``bytes`` (and read-only views) are copied once into a writable
    buffer.
    """
    buffer = _writable(body)
    header, data_start = _read_header(buffer, header_cap)
    metadata = _metadata(header.pop("__metadata__", {}))
    entries = _entries(header, max_elements, allowed_dtypes, len(buffer) - data_start)
    _check_names(entries, set(required), None if optional is None else set(required) | set(optional))
    tensors = {entry.name: _view(buffer, data_start, entry) for entry in entries}
    return SafetensorsPayload(tensors, metadata)


def _writable(body: bytes | bytearray | memoryview) -> bytearray | memoryview:
    """``body`` itself when it is writable, else a writable copy of it."""
    if isinstance(body, bytearray) or (isinstance(body, memoryview) and not body.readonly):
        return body
    return bytearray(body)


def _read_header(buffer: bytearray | memoryview, header_cap: int) -> tuple[dict[str, Any], int]:
    """The header JSON object and where the data starts; MalformedPayload for any structural problem."""
    if len(buffer) < 8:
        raise MalformedPayload(
            f"a safetensors body starts with an 8-byte header length; got {len(buffer)} bytes", field="body"
        )
    (length,) = struct.unpack_from("<Q", buffer)
    if length > len(buffer) - 8:
        raise MalformedPayload(f"header length {length} runs past the {len(buffer)}-byte body", field="body")
    if length > header_cap:
        raise MalformedPayload(f"header length {length} exceeds the cap of {header_cap} bytes", field="body")
    try:
        text = bytes(buffer[8 : 8 + length]).decode("utf-8")
    except UnicodeDecodeError as error:
        raise MalformedPayload(f"the header is not UTF-8 JSON: {error}", field="body") from None
    header = loads_bounded(text, error=MalformedPayload, field="body", object_pairs_hook=_unique_keys)
    if not isinstance(header, dict):
        raise MalformedPayload("the header must be a JSON object", field="body")
    return header, 8 + length


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [key for key, _ in pairs]
    duplicates = sorted({key for key in keys if keys.count(key) > 1})
    if duplicates:
        raise MalformedPayload(f"the header names {duplicates[0]!r} twice", field=duplicates[0])
    return dict(pairs)


def _metadata(raw: Any) -> dict[str, str]:
    if not isinstance(raw, dict) or not all(isinstance(value, str) for value in raw.values()):
        raise MalformedPayload("__metadata__ must be an object of strings", field="__metadata__")
    return raw


def _entries(
    header: dict[str, Any], max_elements: int, allowed_dtypes: frozenset[str], data_length: int
) -> list[_Entry]:
    """Every tensor entry checked on its own, then together: element budget and tiling of the buffer."""
    entries, total = [], 0
    for name, raw in header.items():
        entry = _entry(name, raw, allowed_dtypes, data_length)
        total += math.prod(entry.shape)
        if total > max_elements:
            raise LimitExceeded(
                f"tensor elements: {total} (through {name!r}) exceed the limit of {max_elements}",
                field=name,
                limit=max_elements,
            )
        entries.append(entry)
    _check_tiling(entries, data_length)
    return entries


def _entry(name: str, raw: Any, allowed_dtypes: frozenset[str], data_length: int) -> _Entry:
    if not isinstance(raw, dict) or set(raw) != ENTRY_KEYS:
        raise MalformedPayload(f"tensor {name!r} must have exactly {sorted(ENTRY_KEYS)}", field=name)
    dtype_name, shape, offsets = raw["dtype"], raw["shape"], raw["data_offsets"]
    if dtype_name not in SAFETENSORS_DTYPES:
        raise MalformedPayload(f"tensor {name!r} has unknown dtype {dtype_name!r}", field=name)
    if dtype_name not in allowed_dtypes:
        raise InvalidInput(f"tensor {name!r}: dtype {dtype_name} is not one of {sorted(allowed_dtypes)}", field=name)
    if not isinstance(shape, list) or not all(_is_count(size) for size in shape):
        raise MalformedPayload(f"tensor {name!r}: shape must be a list of non-negative integers", field=name)
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(_is_count(offset) for offset in offsets):
        raise MalformedPayload(f"tensor {name!r}: data_offsets must be [begin, end]", field=name)
    begin, end = offsets
    if not begin <= end <= data_length:
        raise MalformedPayload(
            f"tensor {name!r}: data_offsets {offsets} fall outside the {data_length}-byte data", field=name
        )
    dtype = SAFETENSORS_DTYPES[dtype_name]
    expected = math.prod(shape) * dtype.itemsize
    if end - begin != expected:
        raise MalformedPayload(
            f"tensor {name!r}: shape {shape} of {dtype_name} needs {expected} bytes, data_offsets span {end - begin}",
            field=name,
        )
    return _Entry(name, dtype, tuple(shape), begin, end)


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _check_tiling(entries: list[_Entry], data_length: int) -> None:
    """The tensors must tile the data buffer in offset order: no gap, no overlap, no trailing bytes."""
    position, previous = 0, "the start of the data"
    for entry in sorted(entries, key=lambda e: (e.begin, e.end)):
        if entry.begin != position:
            problem = "overlaps" if entry.begin < position else "leaves a gap after"
            raise MalformedPayload(f"tensor {entry.name!r} {problem} {previous}", field=entry.name)
        position, previous = entry.end, repr(entry.name)
    if position != data_length:
        raise MalformedPayload(f"{data_length - position} bytes after the last tensor", field="body")


def _check_names(entries: list[_Entry], required: set[str], allowed: set[str] | None) -> None:
    names = {entry.name for entry in entries}
    missing = sorted(required - names)
    if missing:
        raise InvalidInput(f"the body has no tensor named {missing[0]!r}", field=missing[0])
    unexpected = sorted(names - allowed) if allowed is not None else []
    if unexpected:
        raise InvalidInput(
            f"unexpected tensor {unexpected[0]!r}; expected {sorted(allowed or ())}", field=unexpected[0]
        )


def _view(buffer: bytearray | memoryview, data_start: int, entry: _Entry) -> torch.Tensor:
    """The entry as a tensor on ``buffer`` (a copy only when empty or misaligned for its dtype)."""
    count = math.prod(entry.shape)
    if count == 0:
        return torch.empty(entry.shape, dtype=entry.dtype)
    offset = data_start + entry.begin
    if offset % entry.dtype.itemsize:
        raw = torch.frombuffer(buffer, dtype=torch.uint8, count=entry.end - entry.begin, offset=offset)
        return raw.clone().view(entry.dtype).view(entry.shape)
    return torch.frombuffer(buffer, dtype=entry.dtype, count=count, offset=offset).view(entry.shape)


@dataclass(frozen=True)
class EncodedSafetensors:
    """A safetensors file as chunks: header first, then each tensor's bytes (views, not copies)."""

    chunks: tuple[bytes | memoryview, ...]
    length: int

    def to_bytes(self) -> bytes:
        """The file as one bytes object (a copy: for tests and small bodies)."""
        return b"".join(self.chunks)


def encode_safetensors(
    tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str] | None = None
) -> EncodedSafetensors:
    """Encode ``tensors`` (any device; non-contiguous ones are made contiguous) without joining their bytes."""
    header: dict[str, Any] = {"__metadata__": dict(metadata)} if metadata else {}
    payloads: list[memoryview] = []
    offset = 0
    for name, tensor in tensors.items():
        data = _raw_bytes(tensor)
        header[name] = {
            "dtype": DTYPE_NAMES[tensor.dtype],
            "shape": list(tensor.shape),
            "data_offsets": [offset, offset + len(data)],
        }
        payloads.append(data)
        offset += len(data)
    header_bytes = json.dumps(header, separators=(",", ":")).encode("utf-8")
    header_bytes += b" " * (-(8 + len(header_bytes)) % HEADER_ALIGNMENT)
    prefix = struct.pack("<Q", len(header_bytes)) + header_bytes
    return EncodedSafetensors((prefix, *payloads), len(prefix) + offset)


def _raw_bytes(tensor: torch.Tensor) -> memoryview:
    """The row-major bytes of ``tensor`` as a view (copies only to make it contiguous or bring it to the CPU)."""
    flat = tensor.detach().cpu().contiguous().reshape(-1)
    if flat.numel() and flat.stride(0) != 1:  # size-1 dims keep any stride (even 0) and still count as contiguous
        flat = torch.empty(flat.shape, dtype=flat.dtype).copy_(flat)
    return flat.view(torch.uint8).numpy().data.cast("B")
