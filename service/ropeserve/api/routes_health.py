"""Probes, metrics and service info."""

from __future__ import annotations

import platform
from typing import Any

import torch
from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from ropeserve import __version__
from ropeserve.api.docs import operation_id
from ropeserve.api.problems import problem_responses
from ropeserve.api.runtime import Runtime, RuntimeDep
from ropeserve.config import preset_catalog
from ropeserve.errors import NotReady
from ropeserve.rope import LAYOUTS, PAIRINGS, ROPE_TYPES

router = APIRouter(tags=["operations"], generate_unique_id_function=operation_id)


@router.get("/health/live", summary="Liveness: the process answers")
async def live() -> dict[str, str]:
    return {"status": "live"}


def _ready(runtime: Runtime) -> dict[str, str]:
    if runtime.draining:
        raise NotReady("draining: finishing in-flight requests", headers={"Retry-After": "1"})
    if not runtime.ready:
        raise NotReady("warming up", headers={"Retry-After": str(runtime.settings.retry_after_s)})
    return {"status": "ready"}


@router.get("/health/ready", summary="Readiness: warm and not draining", responses=problem_responses(503))
async def ready(runtime: RuntimeDep) -> dict[str, str]:
    return _ready(runtime)


@router.get("/health", summary="Alias of /health/ready", responses=problem_responses(503))
async def health(runtime: RuntimeDep) -> dict[str, str]:
    return _ready(runtime)


@router.get("/metrics", summary="Prometheus metrics (text format)", response_class=Response)
def metrics(runtime: RuntimeDep) -> Response:
    runtime.metrics.table_cache_entries.set(len(runtime.tables))
    runtime.metrics.table_cache_bytes.set(runtime.tables.nbytes)
    runtime.metrics.lint_answer_cache_bytes.set(runtime.lint_answers.nbytes)
    return Response(runtime.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)


@router.get("/version", summary="Versions of the service, Python and torch")
def version() -> dict[str, str]:
    return {
        "name": "ropeserve",
        "version": __version__,
        "python": platform.python_version(),
        "torch": torch.__version__,
    }


@router.get("/v1/info", summary="Version, device, kernels, rope types, presets and limits")
def info(runtime: RuntimeDep) -> JSONResponse:
    settings = runtime.settings
    body: dict[str, Any] = {
        "version": __version__,
        "device": str(runtime.device),
        "kernel": runtime.extensions.get("kernel", "native"),
        "kernels": runtime.extensions.get("kernels", {}),
        "rope_types": sorted(ROPE_TYPES),
        "pairings": list(PAIRINGS),
        "layouts": LAYOUTS,
        "presets": {name: entry["source"] for name, entry in preset_catalog().items()},
        "limits": {
            "max_body_bytes": settings.max_body_bytes,
            "max_json_body_bytes": settings.max_json_body_bytes,
            "max_positions": settings.max_positions,
            "max_table_elements": settings.max_table_elements,
            "max_tensor_elements": settings.max_tensor_elements,
            "json_response_max_elements": settings.json_response_max_elements,
        },
        "batching": {
            "enabled": settings.batching,
            "max_tokens": settings.batch_max_tokens,
            "max_wait_us": settings.batch_max_wait_us,
            "queue_size": settings.batch_queue_size,
        },
    }
    return JSONResponse(body)
