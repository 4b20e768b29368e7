"""``POST /v1/rope/apply`` and ``POST /v1/mrope/apply``: rotate q (and k) sent as one safetensors file.

Thin: the body is read with a byte cap, decoded and checked by ``ropeserve.serving.codec``, and rotated by the
app's ``RotationService`` (batching, kernel choice, timings). ``install(app)`` wires the service into an app from
``create_app``: routes, start/stop/warm-up hooks, the kernel name for ``/v1/info``, Prometheus batch metrics.
"""

from __future__ import annotations

import json
import time
from typing import Literal

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import Response
from pydantic import Field

from ropeserve.api.negotiation import SafetensorsResponse, media_type_of, read_safetensors_request
from ropeserve.api.problems import problem_responses
from ropeserve.api.runtime import Runtime, RuntimeDep
from ropeserve.api.schemas import DTYPES, DtypeName, Int64, PairingName, RopeSource
from ropeserve.api.tracing import PHASE_TIMINGS_STATE
from ropeserve.metrics import Metrics
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

    layout: Literal["bhtd", "bthd", "flat"] = Field(
        "bhtd", description="q/k layout: [B,H,T,D] (transformers), [B,T,H,D] (flash-attn) or [T, H·D] (vLLM)."
    )
    pairing: PairingName | None = Field(None, description="neox or gptj; default: the model family's (neox).")
    rotary_dim: Int64 | None = Field(None, ge=1, description="Override the rotated width (partial rotary).")
    dtype: DtypeName | None = Field(
        None, description="Cast q/k to this dtype before rotating; the answer is in it. Default: q's dtype."
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
        )


EXAMPLE_PARAMS = {"preset": "qwen2.5-7b-instruct", "layout": "bthd"}
POSITIONS_DOC = {
    False: "`positions` ([T] or [B, T], int32/int64)",
    True: "`positions` ([3, T] or [3, B, T]: T/H/W rows, int32/int64)",
}


def request_body(mrope: bool) -> dict[str, object]:
    return {
        "required": True,
        "description": f"A safetensors file with `q`, optional `k` (same layout and tokens, any head count) and "
        f"{POSITIONS_DOC[mrope]}; float32/bfloat16/float16 q and k. Parameters as a JSON string under "
        f"__metadata__['{METADATA_KEY}']: one of config/preset/rope, plus layout, pairing, rotary_dim, dtype, "
        f"layer_type, e.g. {json.dumps(EXAMPLE_PARAMS)}. A client on the server's host may instead send "
        "application/json naming its tensors in registered shared-memory regions (/v1/shm/regions; "
        "docs/operations.md, 'Shared-memory transport'): that form is not described by this schema.",
        "content": {"application/x-safetensors": {"schema": {"type": "string", "format": "binary"}}},
    }


ROTATION_RESPONSES: dict[int | str, dict[str, object]] = {
    200: {
        "description": f"A safetensors file with the rotated `q` (and `k`) in the same shape and dtype (or the "
        f"requested dtype), and metadata under '{METADATA_KEY}' (kernel, params, batch, timings). Headers "
        "x-queue-time, x-compute-time and x-total-time carry seconds.",
        "content": {"application/x-safetensors": {"schema": {"type": "string", "format": "binary"}}},
    },
    **problem_responses(400, 413, 415, 422, 429, 503),
}


def rotation_service(runtime: Runtime) -> RotationService:
    service = runtime.extensions["rotation"]
    assert isinstance(service, RotationService)
    return service


async def apply_rotation(request: Request, runtime: Runtime, *, mrope: bool) -> Response:
    """Read (into a pooled buffer when large), rotate, answer; the buffer goes back only after a full send.
    A JSON body names tensors in shared-memory regions instead (``routes_shm``)."""
    if media_type_of(request.headers.get("content-type")) == "application/json" and "shm" in runtime.extensions:
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
    options = payload.params(RotationParams).options(mrope)
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
    responses=ROTATION_RESPONSES,
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
    responses=ROTATION_RESPONSES,
    response_class=Response,
    operation_id="apply_mrope",
)
async def mrope_apply(request: Request, runtime: RuntimeDep) -> Response:
    return await apply_rotation(request, runtime, mrope=True)


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
