"""``/v1/pe/*``: the classic (non-rotary) position encodings of ``ropeserve.encodings``.

JSON requests (``extra`` keys refused), problem+json errors naming ``field``, limits checked before any table is
allocated, and results as JSON or safetensors (``Accept: application/x-safetensors``). ``/v1/pe/resample`` takes
a safetensors body and answers safetensors unless JSON is asked for.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import torch
from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import Field, model_validator
from starlette.concurrency import run_in_threadpool

from ropeserve.api.docs import operation_id
from ropeserve.api.json_route import JSONRoute
from ropeserve.api.negotiation import TENSOR_RESPONSES, read_safetensors_request, tensor_response
from ropeserve.api.problems import problem_responses
from ropeserve.api.runtime import Runtime, RuntimeDep
from ropeserve.api.schemas import DTYPES, DtypeName, Int64, PositionRange, StrictModel, positions_tensor
from ropeserve.encodings import (
    AlibiMode,
    GridAxis,
    SinusoidalLayout,
    SinusoidalSchedule,
    alibi_bias,
    alibi_slopes,
    closest_power_of_two,
    resample_table,
    shaw_relative_indices,
    shaw_table_rows,
    sincos_2d_table,
    sinusoidal_table,
    t5_relative_buckets,
)
from ropeserve.errors import InvalidInput, check_limit
from ropeserve.serving.codec import METADATA_KEY

router = APIRouter(tags=["position encodings"], route_class=JSONRoute, generate_unique_id_function=operation_id)
MAX_POSITION = 2**40
"""Largest position or offset: angles stay exact in float64 and position + offset far from int64 overflow."""
Position = Annotated[int, Field(ge=0, le=MAX_POSITION)]


class BoundedRange(PositionRange):
    start: Int64 = Field(0, ge=0, le=MAX_POSITION)
    stop: Int64 = Field(..., le=MAX_POSITION)


JSON_ROUTE_RESPONSES = {**TENSOR_RESPONSES, **problem_responses(406, 413, 422)}


def respond(request: Request, runtime: Runtime, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> Response:
    return tensor_response(request, tensors, meta, runtime.settings.json_response_max_elements)


def position_count(positions: list[int] | PositionRange) -> int:
    return positions.count() if isinstance(positions, PositionRange) else len(positions)


# --- /v1/pe/sinusoidal ---------------------------------------------------------------------------------------------


class SinusoidalRequest(StrictModel):
    positions: list[Position] | BoundedRange = Field(
        ..., description="Positions as a list, or a range {start, stop, step}.", examples=[{"stop": 4}]
    )
    offset: Int64 = Field(
        0, ge=0, le=MAX_POSITION, description="Added to every position: continue a table after `offset` tokens."
    )
    dim: Int64 = Field(..., ge=1, description="Table width d; odd d allowed (see `schedule`).", examples=[8])
    base: float = Field(10000.0, gt=0, allow_inf_nan=False, description="Wavelength base (10000 in the paper).")
    layout: SinusoidalLayout = Field(
        "interleaved", description="interleaved: sin/cos in even/odd columns; concat: [sin | cos] (Marian, fairseq)."
    )
    schedule: SinusoidalSchedule = Field(
        "vaswani",
        description="vaswani: 1/base^(2i/d), float64 (XLM, DistilBERT, Marian; odd d ends with a sin column); "
        "tensor2tensor: exp(-i·ln(base)/(d/2-1)), float32 (fairseq, FSMT, Speech2Text, Whisper; odd d ends "
        "with a zero column; d >= 4).",
    )
    dtype: DtypeName = Field("float32", description="Output dtype (cast after computing).")


@router.post(
    "/v1/pe/sinusoidal",
    summary="Sinusoidal absolute position table",
    description="PE[p, 2i] = sin(p·ω_i), PE[p, 2i+1] = cos(p·ω_i) for p = position + offset. Result `table` [N, dim].",
    responses=JSON_ROUTE_RESPONSES,
    response_class=Response,
)
def sinusoidal(body: SinusoidalRequest, request: Request, runtime: RuntimeDep) -> Response:
    settings = runtime.settings
    count = position_count(body.positions)
    check_limit(max(count, 1) * body.dim, settings.max_table_elements, "table elements", "positions")
    positions = positions_tensor(body.positions, settings.max_positions) + body.offset
    table = sinusoidal_table(
        positions, body.dim, base=body.base, layout=body.layout, schedule=body.schedule, dtype=DTYPES[body.dtype]
    )
    meta = body.model_dump(exclude={"positions"}) | {"count": count}
    return respond(request, runtime, {"table": table}, meta)


# --- /v1/pe/alibi --------------------------------------------------------------------------------------------------


class AlibiRequest(StrictModel):
    num_heads: Int64 = Field(..., ge=1, description="Attention heads; any count (not only powers of two).")
    max_bias: float = Field(
        8.0, gt=0, allow_inf_nan=False, description="B in the slopes 2^(-B·k/n) (8 in the paper, BLOOM, MPT)."
    )
    query_len: Int64 | None = Field(None, ge=1, description="With key_len: also return the bias [H, Tq, Tk].")
    key_len: Int64 | None = Field(None, ge=1, description="With query_len: also return the bias [H, Tq, Tk].")
    mode: AlibiMode = Field("causal", description="causal: slope·(j - i); symmetric: -slope·|i - j|.")
    offset: Int64 = Field(0, ge=0, le=MAX_POSITION, description="Position of the first query (cached tokens).")
    dtype: DtypeName = Field("float32", description="dtype of `bias` (slopes stay float32).")

    @model_validator(mode="after")
    def _lengths_together(self) -> AlibiRequest:
        if (self.query_len is None) != (self.key_len is None):
            raise ValueError("give both query_len and key_len for a bias, or neither for slopes only")
        return self


@router.post(
    "/v1/pe/alibi",
    summary="ALiBi slopes and bias matrices",
    description="`slopes` float32 [H] as BLOOM computes them (non-powers of two interleave the 2n sequence); "
    "with query_len and key_len also `bias` [H, Tq, Tk] for queries at offset + q and keys j.",
    responses=JSON_ROUTE_RESPONSES,
    response_class=Response,
)
def alibi(body: AlibiRequest, request: Request, runtime: RuntimeDep) -> Response:
    limit = runtime.settings.max_table_elements
    check_limit(body.num_heads, limit, "heads", "num_heads")
    slopes = alibi_slopes(body.num_heads, max_bias=body.max_bias)
    tensors = {"slopes": slopes}
    if body.query_len is not None and body.key_len is not None:
        check_limit(body.num_heads * body.query_len * body.key_len, limit, "bias elements (H·Tq·Tk)", "query_len")
        tensors["bias"] = alibi_bias(
            slopes, body.query_len, body.key_len, mode=body.mode, offset=body.offset, dtype=DTYPES[body.dtype]
        )
    meta = body.model_dump() | {"closest_power_of_two": closest_power_of_two(body.num_heads)}
    return respond(request, runtime, tensors, meta)


# --- /v1/pe/relative -----------------------------------------------------------------------------------------------


class RelativeRequest(StrictModel):
    query_len: Int64 = Field(..., ge=1, description="Tq.")
    key_len: Int64 = Field(..., ge=1, description="Tk.")
    mode: Literal["t5", "shaw"] = Field("t5", description="t5: log-spaced buckets; shaw: clipped distances.")
    bidirectional: bool = Field(True, description="False for decoders (t5 causal buckets; shaw clips to [-k, 0]).")
    offset: Int64 = Field(0, ge=0, le=MAX_POSITION, description="Position of the first query (cached tokens).")
    num_buckets: Int64 = Field(32, ge=2, description="t5 only: relative_attention_num_buckets.")
    max_distance: Int64 = Field(128, ge=1, description="t5 only: relative_attention_max_distance.")
    clip: Int64 | None = Field(None, ge=0, description="shaw only (required): k in clip(j - i, -k, k) + k.")


@dataclass(frozen=True)
class RelativeMode:
    params: tuple[str, ...]
    """The request fields only this mode reads."""
    indices: Callable[[RelativeRequest], torch.Tensor]
    table_rows: Callable[[RelativeRequest], int]


def _shaw_clip(body: RelativeRequest) -> int:
    if body.clip is None:
        raise InvalidInput("mode shaw needs clip", field="clip")
    return body.clip


RELATIVE_MODES: dict[str, RelativeMode] = {
    "t5": RelativeMode(
        params=("num_buckets", "max_distance"),
        indices=lambda body: t5_relative_buckets(
            body.query_len,
            body.key_len,
            bidirectional=body.bidirectional,
            num_buckets=body.num_buckets,
            max_distance=body.max_distance,
            offset=body.offset,
        ),
        table_rows=lambda body: body.num_buckets,
    ),
    "shaw": RelativeMode(
        params=("clip",),
        indices=lambda body: shaw_relative_indices(
            body.query_len, body.key_len, clip=_shaw_clip(body), bidirectional=body.bidirectional, offset=body.offset
        ),
        table_rows=lambda body: shaw_table_rows(_shaw_clip(body), body.bidirectional),
    ),
}


def _refuse_other_modes_params(body: RelativeRequest) -> None:
    for mode, spec in RELATIVE_MODES.items():
        given = [name for name in spec.params if name in body.model_fields_set]
        if mode != body.mode and given:
            raise InvalidInput(f"{given[0]} applies to mode {mode}, not {body.mode}", field=given[0])


@router.post(
    "/v1/pe/relative",
    summary="T5 relative-position buckets or Shaw clipped relative indices",
    description="`relative_index` int64 [Tq, Tk]: the row of the learned relative embedding (or bias) table each "
    "(query offset + q, key j) pair reads; `table_rows` is that table's size.",
    responses=JSON_ROUTE_RESPONSES,
    response_class=Response,
)
def relative(body: RelativeRequest, request: Request, runtime: RuntimeDep) -> Response:
    _refuse_other_modes_params(body)
    elements = body.query_len * body.key_len
    check_limit(elements, runtime.settings.max_table_elements, "index elements (Tq·Tk)", "query_len")
    spec = RELATIVE_MODES[body.mode]
    index = spec.indices(body)
    meta = body.model_dump(include={"query_len", "key_len", "mode", "bidirectional", "offset", *spec.params})
    return respond(request, runtime, {"relative_index": index}, meta | {"table_rows": spec.table_rows(body)})


# --- /v1/pe/sincos-2d ----------------------------------------------------------------------------------------------


class SinCos2dRequest(StrictModel):
    grid_h: Int64 = Field(..., ge=1, description="Patch rows H.")
    grid_w: Int64 = Field(..., ge=1, description="Patch columns W.")
    dim: Int64 = Field(..., ge=4, multiple_of=4, description="Table width: a multiple of 4.", examples=[768])
    base: float = Field(10000.0, gt=0, allow_inf_nan=False, description="Frequency base (temperature).")
    cls_token: bool = Field(False, description="Prepend one row of zeros for the class token.")
    first_axis: GridAxis = Field(
        "h",
        description="Which coordinate fills the first half: h = transformers 5.24 ViTMAE; w = the original MAE "
        "numpy code and its checkpoints.",
    )
    dtype: DtypeName = Field("float32", description="Output dtype (computed in float64).")


@router.post(
    "/v1/pe/sincos-2d",
    summary="Fixed 2-D sin-cos table for a ViT/MAE patch grid",
    description="`table` [(1 if cls_token) + H·W, dim], rows in row-major (h, w) order, each "
    "[sin(a·ω) | cos(a·ω) | sin(b·ω) | cos(b·ω)] with ω_i = base^(-i/(dim/4)).",
    responses=JSON_ROUTE_RESPONSES,
    response_class=Response,
)
def sincos_2d(body: SinCos2dRequest, request: Request, runtime: RuntimeDep) -> Response:
    settings = runtime.settings
    cells = body.grid_h * body.grid_w
    check_limit(cells, settings.max_positions, "grid positions (H·W)", "grid_h")
    check_limit((cells + body.cls_token) * body.dim, settings.max_table_elements, "table elements", "dim")
    table = sincos_2d_table(
        body.grid_h,
        body.grid_w,
        body.dim,
        base=body.base,
        cls_token=body.cls_token,
        first_axis=body.first_axis,
        dtype=DTYPES[body.dtype],
    )
    return respond(request, runtime, {"table": table}, body.model_dump())


# --- /v1/pe/resample -----------------------------------------------------------------------------------------------


class ResampleParams(StrictModel):
    """The JSON object under ``__metadata__["ropeserve"]`` of a resample request."""

    source_grid: list[Int64] = Field(..., min_length=1, max_length=2, description="[H, W] of the table, or [N] (1-D).")
    target_grid: list[Int64] = Field(..., min_length=1, max_length=2, description="[H', W'] or [N'].")
    prefix_rows: Int64 = Field(0, ge=0, description="Rows before the grid (class/register tokens), kept unchanged.")
    mode: str | None = Field(
        None, description="bicubic (2-D default), bilinear, linear (1-D default), nearest or nearest-exact."
    )
    antialias: bool = Field(False, description="Low-pass filter when downsampling (bilinear/bicubic).")
    align_corners: bool | None = Field(None, description="bilinear/bicubic/linear only; default false (ViT, timm).")


RESAMPLE_EXAMPLE = {"source_grid": [14, 14], "target_grid": [24, 16], "prefix_rows": 1, "mode": "bicubic"}
RESAMPLE_REQUEST_BODY: dict[str, Any] = {
    "required": True,
    "description": "A safetensors file holding `table` ([P + H·W, D] or [1, P + H·W, D], float16/bfloat16/float32/"
    f"float64), with its parameters as a JSON string under __metadata__['{METADATA_KEY}'], e.g. "
    f"{json.dumps(RESAMPLE_EXAMPLE)}.",
    "content": {"application/x-safetensors": {"schema": {"type": "string", "format": "binary"}}},
}


TABLE_DTYPES = frozenset({"F16", "BF16", "F32", "F64"})


@router.post(
    "/v1/pe/resample",
    summary="Resample a learned absolute position table to a new grid",
    description="ViT tables (prefix rows, then an H×W grid) are interpolated over the grid with "
    "torch.nn.functional.interpolate (bicubic by default, align_corners false); 1-D tables (BERT/GPT-2) "
    "linearly. Prefix rows are copied; the result keeps the input dtype and layout. Tables with NaN or "
    "infinite values are refused (422, field `table`). Answers safetensors (`table` and metadata under "
    f"'{METADATA_KEY}'), or JSON when Accept asks for application/json only and the result is small.",
    openapi_extra={"requestBody": RESAMPLE_REQUEST_BODY},
    responses={**TENSOR_RESPONSES, **problem_responses(400, 406, 413, 415, 422)},
    response_class=Response,
)
async def resample(request: Request, runtime: RuntimeDep) -> Response:
    settings = runtime.settings
    payload = await read_safetensors_request(request, settings, required=("table",), allowed_dtypes=TABLE_DTYPES)
    params = payload.params(ResampleParams)
    table = payload.tensors["table"]
    result_elements = (params.prefix_rows + math.prod(params.target_grid)) * (table.shape[-1] if table.dim() else 1)
    check_limit(result_elements, settings.max_table_elements, "result elements", "target_grid")
    return await run_in_threadpool(_resample, request, table, params, settings.json_response_max_elements)


def _resample(request: Request, table: torch.Tensor, params: ResampleParams, json_max_elements: int) -> Response:
    """Resample and encode the answer (both sized by the result: in the threadpool, off the event loop)."""
    result = resample_table(
        table,
        params.source_grid,
        params.target_grid,
        prefix_rows=params.prefix_rows,
        mode=params.mode,
        antialias=params.antialias,
        align_corners=params.align_corners,
    )
    meta = params.model_dump() | {"dtype": str(table.dtype).removeprefix("torch."), "shape": list(result.shape)}
    return tensor_response(request, {"table": result}, meta, json_max_elements, binary_default=True)
