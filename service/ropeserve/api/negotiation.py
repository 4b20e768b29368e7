"""Content negotiation for tensor results: JSON (small) or safetensors (``Accept: application/x-safetensors``)."""

from __future__ import annotations

import json
from typing import Any

import torch
from fastapi import Request
from fastapi.responses import JSONResponse, Response
from safetensors.torch import save

from ropeserve.errors import InvalidInput, NotAcceptable

SAFETENSORS_MEDIA_TYPES = ("application/x-safetensors", "application/octet-stream")
METADATA_KEY = "ropeserve"

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


def wants_safetensors(request: Request) -> bool:
    accept = request.headers.get("accept", "")
    return any(media in accept for media in SAFETENSORS_MEDIA_TYPES)


def tensor_response(
    request: Request, tensors: dict[str, torch.Tensor], meta: dict[str, Any], json_max_elements: int
) -> Response:
    """``meta`` plus ``tensors``: safetensors if asked for, else JSON (406 above ``json_max_elements``)."""
    if wants_safetensors(request):
        contiguous = {name: t.detach().contiguous().cpu() for name, t in tensors.items()}
        body = save(contiguous, metadata={METADATA_KEY: json.dumps(meta)})
        return Response(body, media_type="application/x-safetensors")
    elements = sum(t.numel() for t in tensors.values())
    if elements > json_max_elements:
        raise NotAcceptable(
            f"the result has {elements} elements; JSON responses carry at most {json_max_elements}: "
            "send 'Accept: application/x-safetensors'",
            field="accept",
            limit=json_max_elements,
        )
    payload = dict(meta)
    for name, tensor in tensors.items():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise InvalidInput(
                f"'{name}' has non-finite values for these parameters (JSON cannot carry them); "
                "check the inputs, or ask for application/x-safetensors",
                field=name,
            )
        payload[name] = tensor.detach().cpu().to(torch.float64 if tensor.is_floating_point() else torch.int64).tolist()
    return JSONResponse(payload)
