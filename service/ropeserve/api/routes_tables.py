"""``POST /v1/vision/apply``: the vision tower's rotation of q/k. It takes one safetensors file, like
``/v1/rope/apply``; the body is read on the event loop, the rotation runs in the threadpool (no batching), so a
large request never stalls probes. (Rotation with the caller's own cos/sin table is ``/v1/rope/apply`` and
``/v1/rope/apply-table``, in ``routes_rotation``.)"""

from __future__ import annotations

import json
from collections.abc import Mapping

import torch
from fastapi import APIRouter, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from ropeserve.api.docs import operation_id
from ropeserve.api.negotiation import SafetensorsResponse, read_safetensors_request
from ropeserve.api.problems import problem_responses
from ropeserve.api.routes_positions import VisionRopeRequest
from ropeserve.api.runtime import Runtime, RuntimeDep
from ropeserve.errors import check_limit
from ropeserve.positions import vision_position_ids
from ropeserve.rope import vision_cos_sin
from ropeserve.rope.apply import check_float
from ropeserve.rope.caller_tables import vision_rotate
from ropeserve.serving import METADATA_KEY
from ropeserve.serving.codec import SafetensorsPayload, encode_safetensors

router = APIRouter(tags=["rotation"], generate_unique_id_function=operation_id)
RESPONSES: dict[int | str, dict[str, object]] = {
    200: {
        "description": f"A safetensors file with the rotated `q` (and `k`) and metadata under '{METADATA_KEY}'.",
        "content": {"application/x-safetensors": {"schema": {"type": "string", "format": "binary"}}},
    },
    **problem_responses(400, 413, 415, 422),
}


def _float_tensors(tensors: dict[str, torch.Tensor], names: tuple[str, ...]) -> None:
    for name in names:
        if name in tensors:
            check_float(tensors[name], name)


@router.post(
    "/v1/vision/apply",
    summary="Rotate vision-tower q/k by the 2-D rotary of /v1/vision/rope",
    description="The body holds `q` and optional `k` as [patches, heads, head_dim] (the Qwen-VL vision attention "
    "layout, patches in /v1/vision/rope's order); the parameters (grid_thw, spatial_merge_size, head_dim, theta or a "
    "config/preset) go under __metadata__['ropeserve']. transformers' apply_rotary_pos_emb_vision: float32 "
    "rotate-half, cast back.",
    responses=RESPONSES,
    response_class=Response,
    operation_id="apply_vision_rope",
)
async def vision_apply(request: Request, runtime: RuntimeDep) -> Response:
    payload = await read_safetensors_request(request, runtime.settings, required=("q",), optional=("k",))
    return await run_in_threadpool(_vision_apply, payload, runtime)


def _vision_apply(payload: SafetensorsPayload, runtime: Runtime) -> Response:
    options = payload.params(VisionRopeRequest)
    merge, head_dim = options.resolve()
    _float_tensors(payload.tensors, ("q", "k"))
    hw_ids = vision_position_ids(options.grid_thw, merge, max_tokens=runtime.settings.max_positions)
    check_limit(2 * hw_ids.shape[0] * head_dim, runtime.settings.max_table_elements, "table elements", "grid_thw")
    cos, sin = vision_cos_sin(hw_ids, head_dim, options.theta)
    q, k = vision_rotate(payload.tensors["q"], payload.tensors.get("k"), cos, sin)
    meta = {"spatial_merge_size": merge, "head_dim": head_dim, "theta": options.theta, "patches": hw_ids.shape[0]}
    return _answer(q, k, meta)


def _answer(q: torch.Tensor, k: torch.Tensor | None, meta: Mapping[str, object]) -> Response:
    """The rotated ``q`` (and ``k``) as safetensors, ``meta`` as JSON under ``__metadata__["ropeserve"]``."""
    out = {"q": q} if k is None else {"q": q, "k": k}
    return SafetensorsResponse(encode_safetensors(out, {METADATA_KEY: json.dumps(meta)}))
