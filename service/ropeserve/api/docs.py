"""The OpenAPI UI served from the package (works air-gapped) and stable ``operationId``s.

FastAPI's default ``/docs`` loads Swagger UI from a CDN and ``/redoc`` ReDoc likewise: both are blank without
internet access. Here ``/docs`` is Swagger UI from the ``swagger-ui-bundle-v2`` package, its assets under
``/docs/assets``; ReDoc is not served. Operation ids are the route function names (``cos_sin``, not
FastAPI's ``cos_sin_v1_rope_cos_sin_post``), the same names as the Python client's methods.
"""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.routing import APIRoute
from starlette.staticfiles import StaticFiles
from swagger_ui_bundle import swagger_ui_path  # type: ignore[import-untyped]

DOCS_PATH = "/docs"
ASSETS_PATH = "/docs/assets"


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
