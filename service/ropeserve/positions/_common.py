"""Input coercion and validation shared by the position modules (torch and numpy, no web imports)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from ropeserve.config.jsonsafe import FLOAT_MAX, INT64_MAX
from ropeserve.errors import InvalidInput, check_limit

PAD_POSITION = 0
"""Default value written into padded slots, for 1-D and M-RoPE positions alike.

transformers 5 uses 0 for both (``generate()``'s ``cumsum(mask) - 1`` with pads set to 0, and ``get_rope_index``'s
zero-initialised tensor). 0 is always a valid row of a cos/sin table, so a gather never goes out of bounds; the
padded slot is masked out of attention anyway. Every function that pads takes a ``fill_value`` to override it."""

IntsLike = torch.Tensor | np.ndarray | Sequence[int] | Sequence[Sequence[int]]


def as_long_tensor(
    value: IntsLike | int,
    field: str,
    *,
    ndim: int | None = None,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Convert ``value`` (tensor, array, nested int sequence or a bare int) to an int64 tensor, checking its rank."""
    if not isinstance(value, torch.Tensor):  # lists, arrays and ints are read (and refused) by as_long_array
        tensor = tensor_on(as_long_array(value, field), device)
    elif value.numel() > 0 and (value.is_floating_point() or value.is_complex()):
        raise InvalidInput(f"{field} must hold integers, got dtype {value.dtype}", field=field)
    else:
        tensor = value.to(dtype=torch.long, device=device if device is not None else value.device)
    if ndim is not None and tensor.dim() != ndim:
        raise InvalidInput(f"{field} must have {ndim} dimension(s), got shape {tuple(tensor.shape)}", field=field)
    return tensor


def as_long_array(value: IntsLike | int, field: str, *, ndim: int | None = None) -> np.ndarray:
    """:func:`as_long_tensor` on the CPU as a numpy array (a view, not a copy, of a CPU int64 tensor). Lists
    are read by numpy directly (0.2 us for a few numbers, against 15 us through a tensor), with the same refusals:
    floats, ragged nesting and integers past int64."""
    if isinstance(value, torch.Tensor):
        if value.dtype == torch.long and value.device.type == "cpu" and (ndim is None or value.dim() == ndim):
            return value.numpy()  # nothing to convert or check
        return as_long_tensor(value, field, ndim=ndim, device="cpu").numpy()
    try:
        raw = np.asarray(value)
    except (TypeError, ValueError, OverflowError) as exc:
        raise InvalidInput(f"{field} must be a (nested) list of integers: {exc}", field=field) from exc
    if raw.size > 0 and raw.dtype.kind not in "biu":
        raise InvalidInput(f"{field} must hold integers within int64, got {_kind_name(raw)}", field=field)
    if raw.dtype.kind == "u" and raw.size > 0 and int(raw.max()) > INT64_MAX:
        raise InvalidInput(f"{field} must hold integers within int64, got {int(raw.max())}", field=field)
    array = raw.astype(np.int64, copy=False)
    if ndim is not None and array.ndim != ndim:
        raise InvalidInput(f"{field} must have {ndim} dimension(s), got shape {array.shape}", field=field)
    return array


def _kind_name(array: np.ndarray) -> str:
    """What a non-integer array holds, in words."""
    return {"f": "floats", "c": "complex numbers", "O": "values outside int64 or mixed types"}.get(
        array.dtype.kind, f"dtype {array.dtype}"
    )


def require_padding_side(padding_side: object) -> None:
    """InvalidInput naming ``padding_side`` unless it is ``"left"`` or ``"right"``."""
    if padding_side not in ("left", "right"):
        raise InvalidInput(f"padding_side must be 'left' or 'right', got {padding_side!r}", field="padding_side")


def segment_rows(rows: object) -> Sequence[Any]:
    """``rows`` when it is a list (any non-text sequence) of rows, else InvalidInput naming ``rows``."""
    if type(rows) is list:
        return rows
    if isinstance(rows, str | bytes) or not isinstance(rows, Sequence):
        raise InvalidInput("rows must be a list of segment lists", field="rows")
    return rows


def segment_row(segments: object, row: int) -> Sequence[Any]:
    """``segments`` when it is a list (any non-text, non-mapping sequence) of segments, else InvalidInput naming
    ``rows[row]``."""
    if type(segments) is list:
        return segments
    if isinstance(segments, str | bytes | Mapping) or not isinstance(segments, Sequence):
        raise InvalidInput(f"rows[{row}] must be a list of segments", field=f"rows[{row}]")
    return segments


def padded_mask(lengths: np.ndarray, width: int, padding_side: str) -> np.ndarray:
    """``[B, width]`` bool mask of rows holding ``lengths`` ``[B]`` real tokens each, padded on ``padding_side``
    (``"left"``: real tokens on the right; else on the left)."""
    columns = np.arange(width)
    return columns >= width - lengths[:, None] if padding_side == "left" else columns < lengths[:, None]


def device_of(*inputs: object) -> torch.device | None:
    """The device of the first tensor among ``inputs`` when it is not the CPU (results go back there); None for CPU
    tensors, lists and arrays (:func:`tensor_on` then shares the array's memory)."""
    for value in inputs:
        if isinstance(value, torch.Tensor):
            return None if value.device.type == "cpu" else value.device
    return None


def tensor_on(array: np.ndarray, device: torch.device | str | None) -> torch.Tensor:
    """``array`` as a tensor on ``device``; None: the CPU tensor sharing the array's memory. A read-only array (a
    cached pattern, a broadcast view) is copied first: an answer never shares memory a caller may not write."""
    tensor = torch.from_numpy(array if array.flags.writeable else array.copy())
    return tensor if device is None else tensor.to(device)


def as_mask_tensor(value: IntsLike, field: str, *, device: torch.device | str | None = None) -> torch.Tensor:
    """Convert a 0/1 (or bool) attention mask to a bool tensor of shape ``[B, T]``."""
    return as_mask_and_lengths(value, field, device=device)[0]


def as_mask_and_lengths(
    value: IntsLike, field: str, *, device: torch.device | str | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """A 0/1 (or bool) attention mask as a ``[B, T]`` bool tensor, and ``[B]`` int64 ones per row."""
    if isinstance(value, torch.Tensor) and value.dtype == torch.bool:
        mask = value.to(device=device if device is not None else value.device)
        if mask.dim() != 2:
            raise InvalidInput(f"{field} must have 2 dimensions, got {tuple(mask.shape)}", field=field)
        return mask, mask.sum(dim=1)
    ints = as_long_tensor(value, field, ndim=2, device=device)
    low, high = torch.aminmax(ints) if ints.numel() else (0, 0)
    if int(low) < 0 or int(high) > 1:
        row, col = (int(i) for i in ((ints != 0) & (ints != 1)).nonzero()[0])
        raise _not_zero_or_one(field, row, col, int(ints[row, col]))
    # `!= 0` and an int64 sum are several times faster on CPU than `.bool()` and a bool sum.
    return ints != 0, ints.sum(dim=1)


def as_mask_array(value: IntsLike, field: str) -> tuple[np.ndarray, np.ndarray]:
    """A 0/1 (or bool) attention mask as a new ``[B, T]`` bool numpy array, and ``[B]`` int64 ones per row."""
    mask, ints = _read_mask(value, field)
    return mask, (mask.sum(axis=1) if ints is None else ints.sum(axis=1))  # the int64 sum is the faster one


def as_mask_only(value: IntsLike, field: str) -> np.ndarray:
    """:func:`as_mask_array` without the row lengths (one pass over the mask fewer)."""
    return _read_mask(value, field)[0]


def _read_mask(value: IntsLike, field: str) -> tuple[np.ndarray, np.ndarray | None]:
    """The ``[B, T]`` bool mask, and the int64 array it was read from (None when given as bools)."""
    if isinstance(value, torch.Tensor) and value.dtype == torch.bool:
        if value.dim() != 2:
            raise InvalidInput(f"{field} must have 2 dimensions, got {tuple(value.shape)}", field=field)
        return value.cpu().numpy().copy(), None
    ints = as_long_array(value, field, ndim=2)
    if ints.size and int(ints.view(np.uint64).max()) > 1:  # negative values wrap around to huge ones
        row, col = (int(i) for i in np.argwhere(ints.view(np.uint64) > 1)[0])
        raise _not_zero_or_one(field, row, col, int(ints[row, col]))
    return ints != 0, ints


def _not_zero_or_one(field: str, row: int, col: int, value: int) -> InvalidInput:
    return InvalidInput(
        f"{field} may only hold 0 or 1; row {row}, column {col} holds {value}", field=f"{field}[{row}][{col}]"
    )


def per_row_values(
    value: IntsLike | int | None,
    num_rows: int,
    field: str,
    *,
    device: torch.device | str | None = None,
    minimum: int | None = 0,
) -> torch.Tensor:
    """A ``[num_rows]`` int64 tensor from ``None`` (zeros), a scalar (broadcast) or one value per row."""
    return tensor_on(per_row_array(value, num_rows, field, minimum=minimum), device)


def per_row_array(value: IntsLike | int | None, num_rows: int, field: str, *, minimum: int | None = 0) -> np.ndarray:
    """:func:`per_row_values` as a numpy array (small inputs: numpy's ops cost a fraction of torch's)."""
    if value is None:
        return np.zeros(num_rows, dtype=np.int64)
    if isinstance(value, int):
        array = np.full(num_rows, value, dtype=np.int64)
    else:
        array = as_long_array(value, field).reshape(-1)
        if array.size != num_rows:
            raise InvalidInput(f"{field} needs one value per row ({num_rows}), got {array.size}", field=field)
    if minimum is not None:
        require_at_least(array, minimum, field)
    return array


Ints = torch.Tensor | np.ndarray
"""An int64 tensor or numpy array: the checks below take either."""


def first_true(mask: Ints) -> int | None:
    """Flat index of the first true element of a bool tensor or array, None when there is none."""
    if isinstance(mask, np.ndarray):  # argmax is the first true one, if any (0.2 us; ``any()`` costs 1 us)
        index = int(mask.argmax(axis=None)) if mask.size else 0
        return index if mask.size and mask.flat[index] else None
    if not bool(mask.any()):
        return None
    return int(mask.reshape(-1).nonzero()[0, 0])


def require_at_least(values: Ints, minimum: int, field: str) -> None:
    """Raise naming the first element of a 1-D ``values`` below ``minimum``."""
    index = first_true(values < minimum)
    if index is not None:
        raise InvalidInput(
            f"{field}[{index}] is {int(values[index])}; it must be >= {minimum}", field=f"{field}[{index}]"
        )


def require_sum_fits(base: Ints, offset: Ints | int, field: str, extra: int = 0) -> None:
    """Raise naming ``field[i]`` when ``base[i] + offset[i] + extra`` would pass ``INT64_MAX``.

    Exact and overflow-free without computing the sum: ``base >= 0`` (checked by the callers) and
    ``0 <= extra < 2**62`` keep ``INT64_MAX - base - extra`` inside int64. [N] tensors or arrays (or broadcastable).
    """
    index = first_true(offset > (INT64_MAX - base) - extra)
    if index is not None:
        raise InvalidInput(
            f"{field}[{index}] is {int(base.reshape(-1)[index])}: the positions built on it would pass the int64 "
            f"maximum {INT64_MAX}",
            field=f"{field}[{index}]",
        )


def require_int(value: object, field: str, *, minimum: int | None = None) -> int:
    """A Python int (bools refused), optionally bounded below."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInput(f"{field} must be an integer, got {value!r}", field=field)
    if minimum is not None and value < minimum:
        raise InvalidInput(f"{field} is {value}; it must be >= {minimum}", field=field)
    return value


def require_finite_float(
    value: object, field: str, *, minimum: float | None = None, maximum: float | None = None
) -> float:
    """A finite Python float (ints accepted, bools refused), optionally bounded."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidInput(f"{field} must be a number, got {value!r}", field=field)
    number = float(value) if isinstance(value, float) or abs(value) <= FLOAT_MAX else math.inf
    if not math.isfinite(number):
        raise InvalidInput(f"{field} must be finite, got {number}", field=field)
    if minimum is not None and number < minimum:
        raise InvalidInput(f"{field} is {number}; it must be >= {minimum}", field=field)
    if maximum is not None and number > maximum:
        raise InvalidInput(f"{field} is {number}; it must be <= {maximum:g}", field=field)
    return number


MAX_ELEMENTS = 2**27
"""Hard ceiling (about 134 million) on the tokens or positions one call builds, applied even without a configured
limit so that absurd sizes fail as ``LimitExceeded`` (422) rather than as an allocation error. A service should pass
its own, tighter ``max_tokens``."""


def check_element_limit(count: int, limit: int | None, what: str, field: str | None = None) -> None:
    """``errors.check_limit`` against the configured ``limit`` (if any) and :data:`MAX_ELEMENTS`."""
    check_limit(count, MAX_ELEMENTS if limit is None else min(limit, MAX_ELEMENTS), what, field=field)
