"""Shared-memory transport: ``/v1/shm/regions`` (register, list, unregister) and rotations that name tensors in
registered regions (a JSON body to ``/v1/rope/apply`` or ``/v1/mrope/apply``) instead of carrying their bytes.

The answer is written into the named output tensors, or in place over the inputs; the response is JSON with the
outputs and the rotation metadata. Regions belong to the credential (Bearer token) that registered them; with
auth off every client shares one namespace. See ``ropeserve.serving.shm`` for the safety checks.
"""

from __future__ import annotations

from typing import Annotated, Literal

import torch
from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from pydantic import Field, ValidationError

from ropeserve.api.docs import add_component_schemas
from ropeserve.api.fast_json import FastJSONResponse
from ropeserve.api.inline import run_sized
from ropeserve.api.problems import problem_responses
from ropeserve.api.routes_rotation import CLIENT_CLOSED_REQUEST, RotationParams, rotation_service
from ropeserve.api.runtime import Runtime, RuntimeDep
from ropeserve.api.schemas import DTYPES, StrictModel
from ropeserve.errors import InvalidInput, NotFound, check_limit
from ropeserve.serving import ClientDisconnected, SafetensorsPayload
from ropeserve.serving.shm import MAX_REGION_BYTES, RegionRegistry, TensorRef, check_disjoint

router = APIRouter(tags=["shared memory"])
ANONYMOUS = "anonymous"
"""The owner of every region when auth is off."""
ROTATED = ("q", "k")
ERRORS = problem_responses(404, 409, 422)


class RegionRequest(StrictModel):
    name: str = Field(..., description="The client's name for the region, used in requests: 1-64 of [A-Za-z0-9_.-].")
    key: str = Field(
        ..., description="The POSIX shared-memory name (shm_open), e.g. '/ropeserve_ab12'; starts with the prefix."
    )
    byte_size: int = Field(..., ge=1, le=MAX_REGION_BYTES, description="Bytes of the object the service maps.")
    read_only: bool = Field(False, description="Map read-only: inputs only; answers must go to another region.")


class TensorRefModel(StrictModel):
    region: str = Field(..., description="A region this client registered.")
    offset: int = Field(0, ge=0, le=MAX_REGION_BYTES, description="Byte offset in the region.")
    shape: list[Annotated[int, Field(ge=0, le=MAX_REGION_BYTES)]] = Field(..., max_length=8)
    dtype: Literal["float32", "bfloat16", "float16", "int32", "int64"] = Field(
        ..., description="q/k: float32, bfloat16 or float16; positions: int32 or int64."
    )

    def ref(self) -> TensorRef:
        return TensorRef(self.region, self.offset, tuple(self.shape), self.dtype)


class ShmOutputs(StrictModel):
    q: TensorRefModel | None = None
    k: TensorRefModel | None = None


class ShmRotationRequest(StrictModel):
    """A rotation whose tensors live in shared-memory regions."""

    params: RotationParams = Field(..., description="As __metadata__['ropeserve'] of a safetensors request.")
    q: TensorRefModel
    k: TensorRefModel | None = None
    positions: TensorRefModel
    outputs: ShmOutputs = Field(
        default_factory=ShmOutputs, description="Where the rotated q/k go; unnamed ones are rotated in place."
    )


def registry_of(runtime: Runtime) -> RegionRegistry:
    registry = runtime.extensions.get("shm")
    if not isinstance(registry, RegionRegistry):
        raise NotFound("the shared-memory transport is off on this server (ROPESERVE_SHM_ENABLED)")
    return registry


def owner_of(request: Request) -> str:
    return getattr(request.state, "credential", ANONYMOUS)


@router.post("/v1/shm/regions", summary="Register a shared-memory region", status_code=201, responses=ERRORS)
async def register_region(body: RegionRequest, request: Request, runtime: RuntimeDep) -> Response:
    region = registry_of(runtime).register(owner_of(request), body.name, body.key, body.byte_size, body.read_only)
    return FastJSONResponse(region.describe(), status_code=201)


@router.get("/v1/shm/regions", summary="This client's shared-memory regions")
async def list_regions(request: Request, runtime: RuntimeDep) -> Response:
    regions = registry_of(runtime).regions(owner_of(request))
    return FastJSONResponse({"regions": [region.describe() for region in regions]})


@router.delete("/v1/shm/regions/{name}", summary="Unregister a region", status_code=204, responses=ERRORS)
async def unregister_region(name: str, request: Request, runtime: RuntimeDep) -> Response:
    registry_of(runtime).unregister(owner_of(request), name)
    return Response(status_code=204)


def parse_request(raw: bytes) -> ShmRotationRequest:
    try:
        return ShmRotationRequest.model_validate_json(raw)
    except ValidationError as error:
        raise RequestValidationError(error.errors()) from None


Copies = list[tuple[torch.Tensor, torch.Tensor]]
"""``(target, source)`` pairs: ``target.copy_(source)`` (host work sized by the tensors: see ``copy_all``)."""


def resolve(
    registry: RegionRegistry, owner: str, body: ShmRotationRequest, limit: int, answer_dtype: str | None
) -> tuple[dict[str, torch.Tensor], Copies]:
    """Input and output tensors as views on their regions, every bound, overlap, dtype and mode checked before
    anything is written; nothing is copied here. The rotation's ``q``/``k`` are the output views, which the
    returned copies fill with the inputs (cast to the answer's dtype) unless in place; ``positions`` is filled as a
    private tensor, as its values are validated before the kernel indexes with them."""
    inputs = {name: model.ref() for name in ("q", "k", "positions") if (model := getattr(body, name)) is not None}
    outputs = {name: getattr(body.outputs, name) for name in ROTATED if name in inputs}
    outputs = {name: (model.ref() if model is not None else inputs[name]) for name, model in outputs.items()}
    check_limit(sum(ref.numel for ref in inputs.values()), limit, "tensor elements", "q")
    for name, ref in outputs.items():
        _check_output(name, inputs[name], ref, answer_dtype or inputs["q"].dtype)
    named = {**inputs, **{f"outputs.{name}": ref for name, ref in outputs.items()}}
    check_disjoint(named, {frozenset((name, f"outputs.{name}")) for name in outputs})
    regions = {ref.region: registry.get(owner, ref.region) for ref in named.values()}
    positions = regions[inputs["positions"].region].view(inputs["positions"], "positions", False)
    tensors = {"positions": torch.empty_like(positions)}
    copies = [(tensors["positions"], positions)]
    for name, out_ref in outputs.items():
        source = regions[inputs[name].region].view(inputs[name], name, False)
        target = regions[out_ref.region].view(out_ref, f"outputs.{name}", True)
        if out_ref != inputs[name]:
            copies.append((target, source))
        tensors[name] = target
    return tensors, copies


def copy_all(copies: Copies) -> None:
    """Run the copies (in the threadpool when large: ``rotate_shm``)."""
    for target, source in copies:
        target.copy_(source)


def _elements(copies: Copies) -> int:
    return sum(source.numel() for _, source in copies)


def _check_output(name: str, given: TensorRef, output: TensorRef, answer_dtype: str) -> None:
    if given.dtype not in DTYPES:
        raise InvalidInput(f"{name} must be one of {', '.join(DTYPES)} (got {given.dtype})", field=name)
    if output.shape != given.shape:
        raise InvalidInput(f"outputs.{name} must have the shape of {name} {list(given.shape)}", field=name)
    if output.dtype != answer_dtype:
        where = f"outputs.{name}" if output != given else f"outputs.{name} (in place it is {name})"
        raise InvalidInput(f"the answer is {answer_dtype}: {where} must be {answer_dtype}", field=name)


async def rotate_shm(request: Request, runtime: Runtime, *, mrope: bool) -> Response:
    """The JSON form of a rotation: tensors named in regions, answer written there."""
    body = parse_request(await request.body())
    options = body.params.options(mrope)
    registry, owner = registry_of(runtime), owner_of(request)
    tensors, copies = resolve(registry, owner, body, runtime.settings.max_tensor_elements, body.params.dtype)
    await run_sized(_elements(copies), lambda: copy_all(copies))
    try:
        result = await rotation_service(runtime).rotate(
            SafetensorsPayload(tensors, {}), options, is_disconnected=request.is_disconnected
        )
    except ClientDisconnected:
        return Response(status_code=CLIENT_CLOSED_REQUEST)
    answers = [(tensors[name], value) for name, value in result.tensors.items()]
    answers = [(target, value) for target, value in answers if not _same_memory(target, value)]
    await run_sized(_elements(answers), lambda: copy_all(answers))
    outputs = {name: (getattr(body.outputs, name) or getattr(body, name)).ref().describe() for name in result.tensors}
    return FastJSONResponse({"outputs": outputs, "metadata": result.metadata}, headers=result.headers)


def _same_memory(target: torch.Tensor, value: torch.Tensor) -> bool:
    return (value.data_ptr(), value.stride()) == (target.data_ptr(), target.stride())


def install(app: FastAPI) -> None:
    """Add the region routes and the registry (closed at shutdown) when the transport is on."""
    runtime: Runtime = app.state.runtime
    settings = runtime.settings
    add_component_schemas(app, ShmRotationRequest)  # the rotation routes' JSON body (documented either way)
    if not settings.shm_enabled:
        return
    registry = RegionRegistry(settings.shm_max_regions_per_client, settings.shm_key_prefix)
    runtime.extensions["shm"] = registry

    async def close_regions(_: Runtime) -> None:
        registry.close_all()

    runtime.shutdowns.append(close_regions)
    app.include_router(router)
