"""``POST /v1/rope/apply``, ``POST /v1/mrope/apply`` and ``POST /v1/rope/apply-table``: rotate q (and k) sent as
one safetensors file, with ropeserve's cos/sin table or the caller's own (``cos_sin_cache``, or ``cos`` + ``sin``).

Thin: the body is read with a byte cap, decoded and checked by ``ropeserve.serving.codec``, and rotated by the
app's ``RotationService`` (batching, kernel choice, timings). ``install(app)`` wires the service into an app from
``create_app``: routes, start/stop/warm-up hooks, the kernel name for ``/v1/info``, Prometheus batch metrics.
"""

from __future__ import annotations

import json
import time

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import Response
from pydantic import Field

from ropeserve.api.docs import COMPONENT_REF
from ropeserve.api.negotiation import SafetensorsResponse, media_type_of, read_safetensors_request
from ropeserve.api.problems import problem_responses
from ropeserve.api.runtime import Runtime, RuntimeDep
from ropeserve.api.schemas import DTYPES, DtypeName, Int64, PairingName, RopeSource
from ropeserve.api.tracing import PHASE_TIMINGS_STATE
from ropeserve.errors import InvalidInput
from ropeserve.metrics import Metrics
from ropeserve.rope.apply import Layout
from ropeserve.rope.caller_tables import has_caller_table
from ropeserve.serving import (
    METADATA_KEY,
    OPTIONAL_TENSORS,
    REQUIRED_TENSORS,
    BufferLease,
    ClientDisconnected,
    RotationOptions,
    RotationService,
)

router = APIRouter(tags=["rotation"])
CLIENT_CLOSED_REQUEST = 499


class RotationParams(RopeSource):
    """The JSON object under ``__metadata__["ropeserve"]`` of a rotation request."""

    layout: Layout = Field(
        "bhtd",
        description="q/k layout: [B,H,T,D] (transformers), [B,T,H,D] (flash-attn), [T, H·D] (vLLM, 'flat') or "
        "[B, T, H·D] (vLLM batched, 'batched_flat').",
    )
    pairing: PairingName | None = Field(None, description="neox or gptj; default: the model family's (neox).")
    rotary_dim: Int64 | None = Field(None, ge=1, description="Override the rotated width (partial rotary).")
    dtype: DtypeName | None = Field(
        None, description="Cast q/k to this dtype before rotating; the answer is in it. Default: q's dtype."
    )
    atol: float = Field(
        0.0,
        ge=0.0,
        allow_inf_nan=False,
        description="With the caller's own table: rows differing from ropeserve's by more count as differing.",
    )

    def options(self, mrope: bool) -> RotationOptions:
        params, default_pairing = self.resolve()
        return RotationOptions(
            params,
            pairing=self.pairing or default_pairing,
            layout=self.layout,
            mrope=mrope,
            dtype=None if self.dtype is None else DTYPES[self.dtype],
            rotary_dim=self.rotary_dim,
            atol=self.atol,
        )


class TableRotationParams(RotationParams):
    """``/v1/rope/apply-table``'s parameters: as ``RotationParams``, with vLLM's flat layout by default."""

    layout: Layout = Field("flat", description=RotationParams.model_fields["layout"].description)


EXAMPLE_PARAMS = {"preset": "qwen2.5-7b-instruct", "layout": "bthd"}
POSITIONS_DOC = {
    False: "`positions` ([T] or [B, T], int32/int64)",
    True: "`positions` ([3, T] or [3, B, T]: T/H/W rows, int32/int64)",
}


SHM_REQUEST_SCHEMA = "ShmRotationRequest"
"""The component (``routes_shm.ShmRotationRequest``, added by ``routes_shm.install``) of the JSON request form."""
TABLE_FORMS = (
    "`cos_sin_cache` [N, rotary_dim] (cos half, then sin half, as vLLM/SGLang keep it) or `cos` and `sin` "
    "([N, rotary_dim/2], or [N, rotary_dim] in the pairing's layout), float32/bfloat16/float16, `positions` "
    "indexing its rows"
)
"""The forms of a caller's own table in a rotation body (``TABLE_DOC``)."""
TABLE_DOC = {
    False: f" The body may add the caller's own table to rotate with instead of ropeserve's: {TABLE_FORMS}; the "
    "answer's metadata `table` then compares it with ropeserve's (see /v1/rope/apply-table).",
    True: f" The body must carry the caller's own table to rotate with: {TABLE_FORMS}.",
}
SAFETENSORS_BODY = {"application/x-safetensors": {"schema": {"type": "string", "format": "binary"}}}
SHM_ANSWER_SCHEMA = {
    "type": "object",
    "required": ["outputs", "metadata"],
    "properties": {
        "outputs": {"type": "object", "description": "Where each rotated tensor was written (region, offset, ...)."},
        "metadata": {"type": "object", "description": "As the safetensors answer's metadata."},
    },
}


def request_body(mrope: bool, table: bool = False) -> dict[str, object]:
    """The OpenAPI request body of a rotation route: the safetensors file, and (not for ``table``: it needs the
    caller's table, which the shared-memory form does not carry) the shared-memory JSON request."""
    content: dict[str, object] = dict(SAFETENSORS_BODY)
    shm = ""
    if not table:
        content["application/json"] = {"schema": {"$ref": COMPONENT_REF.format(model=SHM_REQUEST_SCHEMA)}}
        shm = (
            " A client on the server's host may instead send application/json naming its tensors in registered "
            "shared-memory regions (/v1/shm/regions; docs/operations.md, 'Shared-memory transport'; 415 when "
            "the transport is off); the answer is then JSON naming where the rotated tensors were written."
        )
    return {
        "required": True,
        "description": f"A safetensors file with `q`, optional `k` (same layout and tokens, any head count) and "
        f"{POSITIONS_DOC[mrope]}; float32/bfloat16/float16 q and k. Parameters as a JSON string under "
        f"__metadata__['{METADATA_KEY}']: one of config/preset/rope, plus layout, pairing, rotary_dim, dtype, "
        f"atol, layer_type, e.g. {json.dumps(EXAMPLE_PARAMS)}.{TABLE_DOC[table]}{shm}",
        "content": content,
    }


def rotation_responses(shm: bool) -> dict[int | str, dict[str, object]]:
    """The OpenAPI responses of a rotation route; ``shm``: it also takes the shared-memory JSON form."""
    answer = {**SAFETENSORS_BODY, "application/json": {"schema": SHM_ANSWER_SCHEMA}} if shm else SAFETENSORS_BODY
    return {
        200: {
            "description": f"A safetensors file with the rotated `q` (and `k`) in the same shape and dtype (or the "
            f"requested dtype), and metadata under '{METADATA_KEY}' (kernel, params, table, batch, timings)"
            f"{'; JSON for a shared-memory request' if shm else ''}. Headers x-queue-time, x-compute-time and "
            "x-total-time carry seconds.",
            "content": answer,
        },
        **problem_responses(400, *((404,) if shm else ()), 413, 415, 422, 429, 503),
    }


def rotation_service(runtime: Runtime) -> RotationService:
    service = runtime.extensions["rotation"]
    assert isinstance(service, RotationService)
    return service


async def apply_rotation(
    request: Request,
    runtime: Runtime,
    *,
    mrope: bool,
    model: type[RotationParams] = RotationParams,
    table_required: bool = False,
) -> Response:
    """Read (into a pooled buffer when large), rotate, answer; the buffer goes back only after a full send.
    A JSON body names tensors in shared-memory regions instead (``routes_shm``). ``model``: the parameters'
    model; ``table_required``: refuse a body without the caller's own table (``/v1/rope/apply-table``)."""
    json_body = media_type_of(request.headers.get("content-type")) == "application/json"
    if json_body and not table_required and "shm" in runtime.extensions:
        from ropeserve.api.routes_shm import rotate_shm  # it imports this module

        return await rotate_shm(request, runtime, mrope=mrope)
    started = time.perf_counter()
    timings: dict[str, float] = {}
    service = rotation_service(runtime)
    lease = BufferLease(service.body_buffers, getattr(request.state, "body_claim", None))
    payload = await read_safetensors_request(
        request,
        runtime.settings,
        required=REQUIRED_TENSORS,
        optional=OPTIONAL_TENSORS,
        timings=timings,
        take=lease.take,
        keep=lease.keep,
    )
    if table_required and not has_caller_table(payload.tensors):
        raise InvalidInput("send the table to rotate with: cos_sin_cache, or cos and sin", field="cos_sin_cache")
    options = payload.params(model).options(mrope)
    try:
        result = await service.rotate(
            payload,
            options,
            is_disconnected=request.is_disconnected,
            started=started,
            timings=timings,
        )
    except ClientDisconnected:
        return Response(status_code=CLIENT_CLOSED_REQUEST)
    setattr(request.state, PHASE_TIMINGS_STATE, result.metadata["timings"])
    return SafetensorsResponse(result.body, result.headers, on_sent=lease.give_back)


@router.post(
    "/v1/rope/apply",
    summary="Rotate q/k by RoPE at 1-D positions",
    description="transformers' apply_rotary_pos_emb for any rope type of the registry: cos/sin in float32 with the "
    "attention factor, cast to the tensor dtype, products in that dtype; NeoX or GPT-J pairing, partial rotary. "
    "Compatible concurrent requests are batched into one kernel call.",
    openapi_extra={"requestBody": request_body(mrope=False)},
    responses=rotation_responses(shm=True),
    response_class=Response,
    operation_id="apply_rope",
)
async def rope_apply(request: Request, runtime: RuntimeDep) -> Response:
    return await apply_rotation(request, runtime, mrope=False)


@router.post(
    "/v1/mrope/apply",
    summary="Rotate q/k by M-RoPE at T/H/W positions",
    description="Multimodal RoPE (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, GLM-4V): each frequency slot takes the T, H or W "
    "position per the model's mrope_section (chunked or interleaved layout); otherwise as /v1/rope/apply.",
    openapi_extra={"requestBody": request_body(mrope=True)},
    responses=rotation_responses(shm=True),
    response_class=Response,
    operation_id="apply_mrope",
)
async def mrope_apply(request: Request, runtime: RuntimeDep) -> Response:
    return await apply_rotation(request, runtime, mrope=True)


@router.post(
    "/v1/rope/apply-table",
    summary="Rotate q/k with the caller's cos/sin table; compare that table with ropeserve's",
    description="/v1/rope/apply with the caller's own table required (`cos_sin_cache` [N, rotary_dim]: cos half, "
    "then sin half, as vLLM/SGLang keep it; or `cos` and `sin`, [N, rotary_dim/2] or [N, rotary_dim] in the "
    "pairing's layout), `positions` indexing its rows, and layout 'flat' by default. The answer's metadata "
    "`table` compares the caller's table with ropeserve's own for the same parameters: max_abs_error, "
    "first_differing_position (row index = position, beyond `atol`), non_finite.",
    openapi_extra={"requestBody": request_body(mrope=False, table=True)},
    responses=rotation_responses(shm=False),
    response_class=Response,
    operation_id="apply_rope_table",
)
async def rope_apply_table(request: Request, runtime: RuntimeDep) -> Response:
    return await apply_rotation(request, runtime, mrope=False, model=TableRotationParams, table_required=True)


class MetricsObserver:
    """Feeds the batcher's figures into the app's Prometheus metrics."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def queue_seconds(self, seconds: float) -> None:
        self.metrics.batch_queue_seconds.observe(seconds)

    def kernel_seconds(self, seconds: float) -> None:
        self.metrics.batch_compute_seconds.observe(seconds)

    def batch(self, size: int, tokens: int) -> None:
        self.metrics.batch_size.observe(size)
        self.metrics.batch_tokens.observe(tokens)

    def dropped(self, count: int) -> None:
        self.metrics.dropped.inc(count)

    def queue_depth(self, depth: int) -> None:
        self.metrics.queue_depth.set(depth)


def install(app: FastAPI, kernel: str | None = None) -> RotationService:
    """Add the rotation routes and service to an app from ``create_app`` (before its lifespan starts); a second
    call returns the installed service. ``kernel`` forces a registered kernel; default ``select_kernel(device)``.
    """
    runtime: Runtime = app.state.runtime
    if isinstance(runtime.extensions.get("rotation"), RotationService):
        return rotation_service(runtime)
    service = RotationService(
        runtime.settings, runtime.device, runtime.tables, kernel=kernel, observer=MetricsObserver(runtime.metrics)
    )
    runtime.extensions["rotation"] = service
    runtime.extensions["kernel"] = service.kernel_name
    runtime.extensions["kernels"] = service.kernel_report()
    runtime.startups.append(lambda _: service.start())
    runtime.warmups.append(lambda _: service.warm_up())
    runtime.shutdowns.append(lambda _: service.stop())
    app.include_router(router)
    return service
