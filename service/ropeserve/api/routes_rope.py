"""``POST /v1/rope/cos-sin``: cos/sin tables for 1-D positions, for every rope type of the registry."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch
from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import Field
from starlette.concurrency import run_in_threadpool

from ropeserve.api.docs import operation_id
from ropeserve.api.inline import INLINE_BUILD_ELEMENTS, INLINE_MAX_POSITIONS, run_inline
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
from ropeserve.config import RopeParams
from ropeserve.errors import InvalidInput, check_limit
from ropeserve.rope import rope_cos_sin, rotated_width
from ropeserve.rope.dynamic_ntk import resolve_dynamic_ntk
from ropeserve.rope.tables import Pairing, effective_length
from ropeserve.settings import Settings

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
    """Many positions: all in the threadpool. Few: checked on the event loop, and answered there too unless the
    cos/sin table to build for them (a cache miss, or a far position) is large."""
    count = body.positions.count() if isinstance(body.positions, PositionRange) else len(body.positions)
    if count > INLINE_MAX_POSITIONS:
        return await run_in_threadpool(lambda: _cos_sin(_inputs(body, runtime.settings), request, runtime))
    inputs = _inputs(body, runtime.settings)
    build = runtime.tables.build_elements(inputs.params, inputs.seq_len, torch.device("cpu"), inputs.max_position)
    if build > INLINE_BUILD_ELEMENTS:
        return await run_in_threadpool(_cos_sin, inputs, request, runtime)
    return run_inline(lambda: _cos_sin(inputs, request, runtime))


@dataclass(frozen=True)
class CosSinInputs:
    """A checked cos/sin request: positions [N] int64, the params (dynamic NTK resolved) and the table length."""

    body: CosSinRequest
    model_params: RopeParams
    params: RopeParams
    positions: torch.Tensor
    pairing: Pairing
    width: int
    max_position: int
    """The largest of ``positions`` (0 for none)."""

    @property
    def seq_len(self) -> int | None:
        """The length ``rope_cos_sin`` looks its table up with."""
        return effective_length(self.params, self.max_position, self.body.seq_len_cached)


def _inputs(body: CosSinRequest, settings: Settings) -> CosSinInputs:
    """Validate ``body`` and enforce the limits (before any table is computed)."""
    model_params, default_pairing = body.resolve()
    positions = positions_tensor(body.positions, settings.max_positions)
    max_position = int(positions.max()) if positions.numel() else 0
    params = resolve_dynamic_ntk(model_params, body.dynamic_ntk, max_position)
    width = rotated_width(params)
    check_limit(2 * positions.numel() * width, settings.max_table_elements, "table elements (cos+sin)", "positions")
    if params.rope_type == "dynamic" and body.seq_len_cached is None and positions.numel() == 0:
        raise InvalidInput("dynamic NTK needs at least one position", field="positions")
    return CosSinInputs(body, model_params, params, positions, body.pairing or default_pairing, width, max_position)


def _cos_sin(inputs: CosSinInputs, request: Request, runtime: Runtime) -> Response:
    body, params = inputs.body, inputs.params
    result = rope_cos_sin(
        params,
        inputs.positions,
        pairing=inputs.pairing,
        dtype=DTYPES[body.dtype],
        seq_len_cached=body.seq_len_cached,
        cache=runtime.tables,
    )
    meta: dict[str, Any] = {
        "rope_type": inputs.model_params.rope_type,
        "dynamic_ntk": body.dynamic_ntk,
        "head_dim": params.head_dim,
        "rotary_dim": params.rotary_dim,
        "width": inputs.width,
        "attention_factor": result.attention_factor,
        "pairing": inputs.pairing,
        "dtype": body.dtype,
        "count": int(inputs.positions.numel()),
        "max_abs_error": result.max_abs_error,
        "params": inputs.model_params.as_dict(),
    }
    tensors = {"cos": result.cos, "sin": result.sin, "inv_freq": result.inv_freq}
    return tensor_response(request, tensors, meta, runtime.settings.json_response_max_elements)
