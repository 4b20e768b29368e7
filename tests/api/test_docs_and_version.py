"""``/docs`` needs no internet (Swagger UI from the package), ``/version``, and ``--version`` on the CLI."""

from __future__ import annotations

import re

import pytest
from fastapi.testclient import TestClient

from ropeserve import __version__
from ropeserve.api import create_app
from ropeserve.cli import main
from ropeserve.settings import Settings

ASSET_URL = re.compile(r"""(?:src|href)\s*[=:]\s*['"]([^'"]+)['"]|url:\s*['"]([^'"]+)['"]""")


@pytest.fixture(scope="module")
def client() -> TestClient:
    with TestClient(create_app(Settings(access_log=False))) as test_client:
        yield test_client


def test_docs_page_loads_every_asset_from_the_service_itself(client: TestClient) -> None:
    page = client.get("/docs")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    urls = [a or b for a, b in ASSET_URL.findall(page.text)]
    assert any(url.endswith(".js") for url in urls) and any(url.endswith(".css") for url in urls), urls
    for url in urls:
        assert url.startswith("/"), f"/docs fetches {url} from outside the service (blank when air-gapped)"
        asset = client.get(url)
        assert asset.status_code == 200 and asset.content, url
    assert client.get("/redoc").status_code == 404, "ReDoc loads from a CDN: not served"


def test_operation_ids_are_short_stable_names(client: TestClient) -> None:
    schema = client.get("/openapi.json").json()
    ids = [op["operationId"] for ops in schema["paths"].values() for op in ops.values()]
    assert len(ids) == len(set(ids))
    for operation_id in ids:
        assert re.fullmatch(r"[a-z][a-z0-9_]*", operation_id), operation_id
        assert not re.search(r"_(get|post|v1)(_|$)", operation_id), f"{operation_id}: path or method in the id"
    assert schema["paths"]["/v1/rope/cos-sin"]["post"]["operationId"] == "cos_sin"


def test_version_route_reports_the_package_version(client: TestClient) -> None:
    body = client.get("/version").json()
    assert body["name"] == "ropeserve" and body["version"] == __version__
    assert {"python", "torch"} <= body.keys()
    assert "/version" in client.get("/openapi.json").json()["paths"]


def test_cli_version_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f"ropeserve {__version__}"
