"""Each operationId of the OpenAPI document is the name of the Python client's method for it."""

from __future__ import annotations

from ropeserve.api import create_app
from ropeserve.settings import Settings
from ropeserve_client._endpoints import Endpoint, Endpoints

GENERIC = {"request"}  # Endpoints.request sends any method to any path


def test_operation_ids_name_the_client_methods() -> None:
    schema = create_app(Settings(access_log=False)).openapi()
    ids = {op["operationId"] for ops in schema["paths"].values() for op in ops.values()}
    methods = {name for name, value in vars(Endpoints).items() if isinstance(value, Endpoint)} - GENERIC
    assert ids == methods
