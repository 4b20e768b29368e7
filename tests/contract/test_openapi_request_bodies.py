"""The OpenAPI document describes both request forms of the rotation routes: the safetensors file and the
shared-memory JSON request, whose schema (the pydantic model's) sits in components and validates what the Python
client sends."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient
from jsonschema import Draft202012Validator

from ropeserve.api import create_app
from ropeserve.settings import Settings

ROTATION_PATHS = ("/v1/rope/apply", "/v1/mrope/apply")
SHM_REF = "#/components/schemas/ShmRotationRequest"
TENSOR = {"region": "r", "offset": 0, "shape": [4, 32], "dtype": "float32"}
SHM_REQUEST = {
    "params": {"rope": {"rope_theta": 10000.0, "head_dim": 16}, "layout": "batched_flat", "atol": 0.0},
    "q": TENSOR,
    "k": TENSOR | {"offset": 512},
    "positions": TENSOR | {"offset": 1024, "shape": [4], "dtype": "int64"},
    "outputs": {"q": TENSOR | {"offset": 2048}},
}
"""A shared-memory rotation request as ``ropeserve_client._shm.stage`` builds it (plus an output region)."""


def openapi_document(shm_enabled: bool) -> dict[str, Any]:
    with TestClient(create_app(Settings(access_log=False, shm_enabled=shm_enabled))) as client:
        document: dict[str, Any] = client.get("/openapi.json").json()
    return document


@pytest.fixture(scope="module")
def document() -> dict[str, Any]:
    return openapi_document(shm_enabled=True)


def validator_for(document: dict[str, Any], ref: str) -> Draft202012Validator:
    """A JSON Schema 2020-12 validator (OpenAPI 3.1's dialect) of ``ref``, resolved inside ``document``."""
    return Draft202012Validator({**document, "$ref": ref})


@pytest.mark.parametrize("path", ROTATION_PATHS)
def test_rotation_routes_list_both_media_types(document: dict[str, Any], path: str) -> None:
    content = document["paths"][path]["post"]["requestBody"]["content"]
    assert content["application/x-safetensors"]["schema"] == {"type": "string", "format": "binary"}
    assert content["application/json"]["schema"] == {"$ref": SHM_REF}
    answers = document["paths"][path]["post"]["responses"]["200"]["content"]
    assert {"application/x-safetensors", "application/json"} <= set(answers)


def test_apply_table_takes_only_the_safetensors_form(document: dict[str, Any]) -> None:
    """It needs the caller's table, which the shared-memory form does not carry."""
    content = document["paths"]["/v1/rope/apply-table"]["post"]["requestBody"]["content"]
    assert set(content) == {"application/x-safetensors"}


@pytest.mark.parametrize("shm_enabled", [True, False])
def test_the_shm_request_schema_is_a_component_every_reference_of_which_resolves(shm_enabled: bool) -> None:
    document = openapi_document(shm_enabled)
    schema = document["components"]["schemas"]["ShmRotationRequest"]
    assert {"params", "q", "positions"} <= set(schema["required"])
    validator = validator_for(document, SHM_REF)
    validator.validate(SHM_REQUEST)  # resolves every $ref on the way: params, tensor refs, outputs


@pytest.mark.parametrize(
    "change",
    [
        {"q": None},
        {"q": TENSOR | {"dtype": "float64"}},
        {"q": TENSOR | {"offset": -1}},
        {"params": SHM_REQUEST["params"] | {"layout": "thbd"}},
        {"extra": 1},
    ],
)
def test_the_schema_refuses_what_the_server_refuses(document: dict[str, Any], change: dict[str, Any]) -> None:
    request = {name: value for name, value in (SHM_REQUEST | change).items() if value is not None}
    assert not validator_for(document, SHM_REF).is_valid(request)


def test_the_document_is_valid_openapi(document: dict[str, Any]) -> None:
    validator = pytest.importorskip("openapi_spec_validator", reason="openapi-spec-validator is not installed")
    validator.validate(document)
