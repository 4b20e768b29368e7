"""Probes, info, metrics and the problem+json contract of the app skeleton."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from ropeserve.api import create_app
from ropeserve.config import preset_catalog
from ropeserve.rope import ROPE_TYPES
from ropeserve.settings import Settings

PROBLEM_KEYS = {"type", "title", "status", "detail"}


@pytest.fixture()
def client() -> TestClient:
    settings = Settings(access_log=False, max_body_bytes=4096, max_json_body_bytes=4096)
    with TestClient(create_app(settings)) as test_client:
        yield test_client


def assert_problem(response, status: int, slug: str) -> dict:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    body = response.json()
    assert body.keys() >= PROBLEM_KEYS
    assert body["status"] == status
    assert body["type"].endswith("/" + slug)
    return body


def test_probes_answer_when_warm(client: TestClient) -> None:
    assert client.get("/health/live").json() == {"status": "live"}
    assert client.get("/health/ready").json() == {"status": "ready"}
    assert client.get("/health").json() == {"status": "ready"}


def test_ready_is_503_before_warm_up() -> None:
    app = create_app(Settings(access_log=False))
    client = TestClient(app)  # no context manager: the lifespan (warm-up) has not run
    body = assert_problem(client.get("/health/ready"), 503, "not-ready")
    assert "warming" in body["detail"]
    assert client.get("/health/live").status_code == 200


def test_info_lists_registry_presets_and_limits(client: TestClient) -> None:
    info = client.get("/v1/info").json()
    assert info["rope_types"] == sorted(ROPE_TYPES)
    assert set(info["presets"]) == set(preset_catalog())
    assert info["device"] == "cpu"
    assert info["limits"]["max_body_bytes"] == 4096


def test_metrics_count_requests_by_route_and_status(client: TestClient) -> None:
    client.get("/health/live")
    client.get("/no/such/route")
    text = client.get("/metrics").text
    assert 'ropeserve_http_requests_total{method="GET",route="/health/live",status="200"} 1.0' in text
    assert 'ropeserve_http_errors_total{error_type="not-found",status="404"} 1.0' in text
    assert "ropeserve_http_request_duration_seconds_bucket" in text
    assert "ropeserve_http_requests_in_flight" in text


def test_unknown_route_and_method_are_problems(client: TestClient) -> None:
    assert_problem(client.get("/nope"), 404, "not-found")
    assert_problem(client.get("/v1/rope/cos-sin"), 405, "method-not-allowed")


def test_declared_oversized_body_is_refused_before_reading(client: TestClient) -> None:
    body = assert_problem(
        client.post("/v1/rope/cos-sin", content=b"x" * 5000, headers={"content-type": "application/json"}),
        413,
        "payload-too-large",
    )
    assert body["limit"] == 4096


def test_streamed_body_is_capped_while_it_arrives(client: TestClient) -> None:
    def chunks():
        for _ in range(20):
            yield b"x" * 1000

    response = client.post("/v1/rope/cos-sin", content=chunks(), headers={"content-type": "application/json"})
    assert_problem(response, 413, "payload-too-large")


def test_invalid_json_is_400_and_wrong_shape_is_422(client: TestClient) -> None:
    headers = {"content-type": "application/json"}
    assert_problem(client.post("/v1/rope/cos-sin", content=b"{oops", headers=headers), 400, "malformed-payload")
    body = assert_problem(client.post("/v1/rope/cos-sin", json={"preset": "llama-3.1-8b"}), 422, "invalid-input")
    assert body["field"] == "positions"


def test_request_id_is_echoed_or_generated(client: TestClient) -> None:
    assert client.get("/health/live", headers={"x-request-id": "abc-123"}).headers["x-request-id"] == "abc-123"
    generated = client.get("/health/live").headers["x-request-id"]
    assert len(generated) == 32


def test_app_dependency_overrides_reach_every_route() -> None:
    """``app.dependency_overrides`` (FastAPI's way to swap a dependency in tests) reaches the routes on FastAPI's
    handler too: the routes added flat to the app took no overrides provider (the probes, the vision rotation)."""
    from ropeserve.api.runtime import get_runtime
    from ropeserve.errors import InvalidInput

    def refuse(request: object = None) -> None:
        raise InvalidInput("the override answered", field="override")

    app = create_app(Settings(access_log=False))
    app.dependency_overrides[get_runtime] = refuse
    client = TestClient(app)
    safetensors = {"content-type": "application/x-safetensors"}
    answers = [
        client.get("/health/ready"),
        client.post("/v1/vision/apply", content=b"\x00" * 8, headers=safetensors),
        client.post("/v1/positions", json={"cache_lengths": [1]}),
    ]
    assert [(answer.status_code, answer.json()["field"]) for answer in answers] == [(422, "override")] * 3
    other = TestClient(create_app(Settings(access_log=False)))  # apps share no routes: no override here
    assert other.post("/v1/positions", json={"cache_lengths": [1]}).status_code == 200
