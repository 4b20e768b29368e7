"""Array backends and the safetensors wire format.

Results are torch tensors when torch is importable (the ``torch`` extra), numpy arrays otherwise; a client can
force either with ``array_backend``. numpy has no bfloat16, so the numpy backend widens BF16 tensors to float32
(exactly: every bfloat16 value is a float32 value).

Request tensors may be torch tensors, numpy arrays or nested lists; a safetensors request body carries the JSON
parameters as a string under ``__metadata__["ropeserve"]``, and so does every safetensors answer.
"""

from __future__ import annotations

import importlib.util
import json
import struct
from collections.abc import Mapping
from typing import Any, Literal

import numpy as np

from ropeserve_client._exceptions import DecodeError

__all__ = [
    "METADATA_KEY",
    "SAFETENSORS_MEDIA_TYPE",
    "ArrayBackend",
    "decode_safetensors",
    "encode_safetensors",
    "json_ready",
    "resolve_backend",
    "to_array",
]

ArrayBackend = Literal["auto", "torch", "numpy"]
SAFETENSORS_MEDIA_TYPE = "application/x-safetensors"
METADATA_KEY = "ropeserve"

_NUMPY_DTYPES: dict[str, Any] = {
    "F64": np.float64,
    "F32": np.float32,
    "F16": np.float16,
    "I64": np.int64,
    "I32": np.int32,
    "I16": np.int16,
    "I8": np.int8,
    "U8": np.uint8,
    "BOOL": np.bool_,
}
_HEADER_LENGTH_BYTES = 8


def torch_available() -> bool:
    return importlib.util.find_spec("torch") is not None


def resolve_backend(choice: ArrayBackend) -> Literal["torch", "numpy"]:
    """``auto`` → torch when importable, else numpy; ``torch`` fails early when torch is missing."""
    if choice == "numpy":
        return "numpy"
    if torch_available():
        return "torch"
    if choice == "torch":
        raise ImportError("array_backend='torch' needs torch: pip install 'ropeserve-client[torch]'")
    return "numpy"


def _is_torch_tensor(value: object) -> bool:
    return type(value).__module__.startswith("torch") and hasattr(value, "detach")


def to_array(value: object, backend: Literal["torch", "numpy"]) -> Any:
    """``value`` (tensor, array or nested list) as the backend's array type."""
    if backend == "torch":
        import torch

        if _is_torch_tensor(value):
            return value
        return torch.from_numpy(np.ascontiguousarray(np.asarray(value)))
    if _is_torch_tensor(value):
        return _torch_to_numpy(value)
    return np.asarray(value)


def _torch_to_numpy(tensor: Any) -> np.ndarray:
    import torch

    tensor = tensor.detach().cpu()
    if tensor.dtype == torch.bfloat16:
        tensor = tensor.float()
    array: np.ndarray = tensor.numpy()
    return array


def json_ready(value: Any) -> Any:
    """``value`` with tensors, arrays, numpy scalars, tuples and ranges turned into plain JSON values."""
    if _is_torch_tensor(value):
        return value.detach().cpu().tolist()
    if isinstance(value, np.ndarray | np.generic):
        return value.tolist()
    if isinstance(value, Mapping):
        return {str(key): json_ready(item) for key, item in value.items()}
    if isinstance(value, list | tuple | range):
        return [json_ready(item) for item in value]
    return value


def encode_safetensors(tensors: Mapping[str, Any], metadata: Mapping[str, Any]) -> bytes:
    """A safetensors file holding ``tensors`` and ``metadata`` JSON-encoded under ``METADATA_KEY``."""
    header = {METADATA_KEY: json.dumps(json_ready(dict(metadata)))}
    if any(_is_torch_tensor(value) for value in tensors.values()) and torch_available():
        from safetensors.torch import save

        return save({name: to_array(value, "torch").contiguous() for name, value in tensors.items()}, header)
    from safetensors.numpy import save as save_numpy

    return save_numpy({name: np.ascontiguousarray(to_array(value, "numpy")) for name, value in tensors.items()}, header)


def _read_header(data: bytes) -> tuple[dict[str, Any], int]:
    """The safetensors JSON header and the offset where tensor data begins."""
    if len(data) < _HEADER_LENGTH_BYTES:
        raise DecodeError(f"safetensors body of {len(data)} bytes is too short")
    (length,) = struct.unpack("<Q", data[:_HEADER_LENGTH_BYTES])
    start = _HEADER_LENGTH_BYTES + length
    if start > len(data):
        raise DecodeError(f"safetensors header claims {length} bytes; the body has {len(data)}")
    try:
        header = json.loads(data[_HEADER_LENGTH_BYTES:start])
    except ValueError as exc:
        raise DecodeError(f"safetensors header is not JSON: {exc}") from exc
    if not isinstance(header, dict):
        raise DecodeError("safetensors header is not a JSON object")
    return header, start


def _metadata(header: Mapping[str, Any]) -> dict[str, Any]:
    raw = (header.get("__metadata__") or {}).get(METADATA_KEY)
    if raw is None:
        return {}
    try:
        meta = json.loads(raw)
    except ValueError as exc:
        raise DecodeError(f"safetensors metadata '{METADATA_KEY}' is not JSON: {exc}") from exc
    return meta if isinstance(meta, dict) else {"value": meta}


def _numpy_tensor(info: Mapping[str, Any], buffer: bytes, name: str) -> np.ndarray:
    begin, end = info["data_offsets"]
    raw, shape, dtype = buffer[begin:end], tuple(info["shape"]), info["dtype"]
    if dtype == "BF16":
        widened = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
        return widened.view(np.float32).reshape(shape)
    if dtype not in _NUMPY_DTYPES:
        raise DecodeError(f"tensor {name!r} has dtype {dtype}, which numpy cannot hold")
    return np.frombuffer(raw, dtype=np.dtype(_NUMPY_DTYPES[dtype]).newbyteorder("<")).reshape(shape).copy()


def decode_safetensors(data: bytes, backend: Literal["torch", "numpy"]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(tensors, metadata)`` from a safetensors body; tensors as the backend's arrays."""
    header, start = _read_header(data)
    meta = _metadata(header)
    if backend == "torch":
        from safetensors.torch import load

        try:
            return dict(load(data)), meta
        except Exception as exc:  # safetensors raises its own SafetensorError
            raise DecodeError(f"invalid safetensors body: {exc}") from exc
    buffer = data[start:]
    try:
        tensors = {name: _numpy_tensor(info, buffer, name) for name, info in header.items() if name != "__metadata__"}
    except (KeyError, TypeError, ValueError) as exc:
        raise DecodeError(f"invalid safetensors body: {exc}") from exc
    return tensors, meta
