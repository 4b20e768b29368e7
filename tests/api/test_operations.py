"""Operator settings: optional bearer-token auth (probes configurable), CORS off by default, request ids,
and the drain hook behind SIGTERM."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from fastapi.testclient import TestClient

from ropeserve.api import create_app
from ropeserve.api.app import begin_drain
from ropeserve.settings import Settings

TOKEN = "s3cret-token"
API_ROUTE = "/v1/info"
PROBES = ("/health/live", "/health/ready", "/health", "/metrics")
ORIGIN = "https://ui.example"
WRONG_CREDENTIALS = [
    {},
    {"Authorization": "Bearer wrong"},
    {"Authorization": TOKEN},
    {"Authorization": f"Basic {TOKEN}"},
]
PREFLIGHT = {"Origin": ORIGIN, "Access-Control-Request-Method": "POST"}


@contextmanager
def client_for(**settings: object) -> Iterator[TestClient]:
    with TestClient(create_app(Settings(access_log=False, **settings))) as client:
        yield client


@pytest.fixture()
def client() -> Iterator[TestClient]:
    with client_for() as test_client:
        yield test_client


@pytest.fixture()
def authed() -> Iterator[TestClient]:
    with client_for(auth_token=TOKEN) as test_client:
        yield test_client


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_without_a_token_setting_the_api_is_open(client: TestClient) -> None:
    assert client.get(API_ROUTE).status_code == 200


@pytest.mark.parametrize("headers", WRONG_CREDENTIALS)
def test_api_routes_need_the_bearer_token(authed: TestClient, headers: dict[str, str]) -> None:
    response = authed.get(API_ROUTE, headers={**headers, "X-Request-ID": "auth-1"})
    assert response.status_code == 401
    assert response.headers["www-authenticate"] == "Bearer"
    assert response.headers["content-type"].startswith("application/problem+json")
    assert response.json()["type"].endswith("/unauthorized")
    assert response.headers["x-request-id"] == "auth-1"
    assert TOKEN not in response.text


def test_the_right_token_is_accepted(authed: TestClient) -> None:
    assert authed.get(API_ROUTE, headers=bearer(TOKEN)).status_code == 200


def test_probes_and_metrics_stay_open_by_default(authed: TestClient) -> None:
    for path in PROBES:
        assert authed.get(path).status_code == 200, path
    assert 'ropeserve_http_errors_total{error_type="unauthorized",status="401"}' not in authed.get("/metrics").text
    authed.get(API_ROUTE)
    assert 'ropeserve_http_errors_total{error_type="unauthorized",status="401"} 1.0' in authed.get("/metrics").text


def test_probes_can_be_protected_too() -> None:
    with client_for(auth_token=TOKEN, auth_protect_probes=True) as client:
        for path in PROBES:
            assert client.get(path).status_code == 401, path
            assert client.get(path, headers=bearer(TOKEN)).status_code == 200, path


def test_cors_is_off_by_default(client: TestClient) -> None:
    preflight = client.options("/v1/rope/cos-sin", headers=PREFLIGHT)
    assert "access-control-allow-origin" not in preflight.headers
    simple = client.get(API_ROUTE, headers={"Origin": ORIGIN})
    assert simple.status_code == 200 and "access-control-allow-origin" not in simple.headers


def test_cors_allows_only_configured_origins() -> None:
    with client_for(cors_origins=[ORIGIN], auth_token=TOKEN) as client:
        preflight = client.options("/v1/rope/cos-sin", headers=PREFLIGHT)  # preflights carry no token
        assert preflight.status_code == 200 and preflight.headers["access-control-allow-origin"] == ORIGIN
        other = client.options("/v1/rope/cos-sin", headers={**PREFLIGHT, "Origin": "https://evil.example"})
        assert other.headers.get("access-control-allow-origin") != "https://evil.example"
        simple = client.get(API_ROUTE, headers={"Origin": ORIGIN, **bearer(TOKEN)})
        assert simple.headers["access-control-allow-origin"] == ORIGIN


def test_request_id_is_kept_on_errors_and_refusals(client: TestClient) -> None:
    for response in (
        client.get("/no/such/route", headers={"X-Request-ID": "rid-404"}),
        client.post("/v1/rope/cos-sin", content=b"{", headers={"X-Request-ID": "rid-400"}),
    ):
        assert response.headers["x-request-id"] == response.request.headers["x-request-id"]


def test_draining_turns_readiness_off_but_keeps_serving(client: TestClient) -> None:
    begin_drain(client.app.state.runtime)
    ready = client.get("/health/ready")
    assert ready.status_code == 503 and "draining" in ready.json()["detail"]
    assert ready.headers["retry-after"]
    assert client.get("/health/live").status_code == 200
    assert client.get(API_ROUTE).status_code == 200
    assert "ropeserve_ready 0.0" in client.get("/metrics").text
