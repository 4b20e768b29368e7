"""The OpenAPI UI served from the package (works air-gapped) and stable ``operationId``s.

FastAPI's default ``/docs`` loads Swagger UI from a CDN and ``/redoc`` ReDoc likewise: both are blank without
internet access. Here ``/docs`` is Swagger UI from the ``swagger-ui-bundle-v2`` package, its assets under
``/docs/assets``; ReDoc is not served. Operation ids are the route function names (``cos_sin``, not
FastAPI's ``cos_sin_v1_rope_cos_sin_post``), the same names as the Python client's methods. Models that a
route's ``openapi_extra`` references (a body it reads itself, not a FastAPI parameter) are added to the document's
components by ``add_component_schemas``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.routing import APIRoute
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema
from starlette.staticfiles import StaticFiles
from swagger_ui_bundle import swagger_ui_path  # type: ignore[import-untyped]

DOCS_PATH = "/docs"
ASSETS_PATH = "/docs/assets"
COMPONENT_REF = "#/components/schemas/{model}"


def operation_id(route: APIRoute) -> str:
    """The ``operationId`` of a route: its name (the function name unless the route sets ``operation_id``)."""
    return route.name


def install_docs(app: FastAPI) -> None:
    """Serve Swagger UI at ``/docs`` from the installed package (no CDN); the app must have ``docs_url=None``."""
    app.mount(ASSETS_PATH, StaticFiles(directory=str(swagger_ui_path)), name="swagger-ui-assets")

    @app.get(DOCS_PATH, include_in_schema=False)
    def swagger_ui() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=app.openapi_url or "/openapi.json",
            title=f"{app.title} - API",
            swagger_js_url=f"{ASSETS_PATH}/swagger-ui-bundle.js",
            swagger_css_url=f"{ASSETS_PATH}/swagger-ui.css",
            swagger_favicon_url=f"{ASSETS_PATH}/favicon-32x32.png",
        )


def add_component_schemas(app: FastAPI, *models: type[BaseModel]) -> None:
    """Put the JSON schemas of ``models`` (and of the models they use) under ``components/schemas`` of the app's
    OpenAPI document, named by class, for request bodies an ``openapi_extra`` references as
    ``COMPONENT_REF.format(model=name)``. A component FastAPI already generated under the same name is kept."""
    build_schema: Callable[[], dict[str, Any]] = app.openapi

    def openapi_with_components() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        schema = build_schema()
        _, definitions = models_json_schema([(model, "validation") for model in models], ref_template=COMPONENT_REF)
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        for name, definition in definitions.get("$defs", {}).items():
            components.setdefault(name, definition)
        app.openapi_schema = schema
        return schema

    app.openapi = openapi_with_components  # type: ignore[method-assign]
