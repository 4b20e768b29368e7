"""``POST /v1/rope/cos-sin``: cos/sin tables for 1-D positions, for every rope type of the registry."""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import Field

from ropeserve.api.docs import operation_id
from ropeserve.api.inline import run_sized
from ropeserve.api.json_route import JSONRoute
from ropeserve.api.negotiation import TENSOR_RESPONSES, tensor_response
from ropeserve.api.problems import problem_responses
from ropeserve.api.runtime import Runtime, RuntimeDep
from ropeserve.api.schemas import (
    DTYPES,
    DtypeName,
    Int64,
    PairingName,
    Position,
    PositionRange,
    RopeSource,
    positions_tensor,
)
from ropeserve.errors import InvalidInput, check_limit
from ropeserve.rope import rope_cos_sin, rotated_width
from ropeserve.rope.dynamic_ntk import resolve_dynamic_ntk

router = APIRouter(tags=["rope"], route_class=JSONRoute, generate_unique_id_function=operation_id)


class CosSinRequest(RopeSource):
    positions: list[Position] | PositionRange = Field(
        ..., description="Positions as a list, or a range {start, stop, step}.", examples=[[0, 1, 2]]
    )
    dtype: DtypeName = Field("float32", description="Output dtype; computation is always float32.")
    pairing: PairingName | None = Field(
        None, description="neox (rotate-half, halves duplicated) or gptj (adjacent pairs); default: the model's."
    )
    seq_len_cached: Int64 | None = Field(
        None,
        ge=1,
        description="dynamic NTK only: the longest length the model has already seen (transformers' "
        "max_seq_len_cached; default max_position_embeddings). Reproduces its hysteresis.",
    )
    dynamic_ntk: Literal["transformers", "vllm"] = Field(
        "transformers",
        description="dynamic NTK only: transformers (rescaled per length, max(position)+1 > "
        "max_position_embeddings) or vllm (scaled once to max_position_embeddings × factor, every position; "
        "positions past that table are a 422).",
    )


@router.post(
    "/v1/rope/cos-sin",
    summary="cos/sin for 1-D positions",
    description="Computes cos/sin exactly as transformers 5.24 does (float32 angles, attention factor applied, "
    "then cast). Results: [N, width] with width = rotary_dim (head_dim for proportional). For bfloat16/float16 "
    "the max abs error against float32 is reported.",
    responses={**TENSOR_RESPONSES, **problem_responses(406, 413, 422)},
    response_class=Response,
)
async def cos_sin(body: CosSinRequest, request: Request, runtime: RuntimeDep) -> Response:
    count = body.positions.count() if isinstance(body.positions, PositionRange) else len(body.positions)
    return await run_sized(count, lambda: _cos_sin(body, request, runtime))


def _cos_sin(body: CosSinRequest, request: Request, runtime: Runtime) -> Response:
    settings = runtime.settings
    model_params, default_pairing = body.resolve()
    positions = positions_tensor(body.positions, settings.max_positions)
    max_position = int(positions.max()) if positions.numel() else 0
    params = resolve_dynamic_ntk(model_params, body.dynamic_ntk, max_position)
    width = rotated_width(params)
    check_limit(2 * positions.numel() * width, settings.max_table_elements, "table elements (cos+sin)", "positions")
    if params.rope_type == "dynamic" and body.seq_len_cached is None and positions.numel() == 0:
        raise InvalidInput("dynamic NTK needs at least one position", field="positions")
    pairing = body.pairing or default_pairing
    result = rope_cos_sin(
        params,
        positions,
        pairing=pairing,
        dtype=DTYPES[body.dtype],
        seq_len_cached=body.seq_len_cached,
        cache=runtime.tables,
    )
    meta: dict[str, Any] = {
        "rope_type": model_params.rope_type,
        "dynamic_ntk": body.dynamic_ntk,
        "head_dim": params.head_dim,
        "rotary_dim": params.rotary_dim,
        "width": width,
        "attention_factor": result.attention_factor,
        "pairing": pairing,
        "dtype": body.dtype,
        "count": int(positions.numel()),
        "max_abs_error": result.max_abs_error,
        "params": model_params.as_dict(),
    }
    tensors = {"cos": result.cos, "sin": result.sin, "inv_freq": result.inv_freq}
    return tensor_response(request, tensors, meta, settings.json_response_max_elements)
