"""``POST /v1/config/validate``: the linter's findings over HTTP, counted in metrics."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from ropeserve.api import create_app
from ropeserve.lint import DeploymentIntent, lint_config
from ropeserve.settings import Settings

CONFIGS = Path(__file__).parents[1] / "fixtures" / "configs"
LLAMA = json.loads((CONFIGS / "meta-llama__Llama-3.1-8B-Instruct.json").read_text())


@pytest.fixture()
def client() -> TestClient:
    with TestClient(create_app(Settings(access_log=False))) as test_client:
        yield test_client


def test_findings_equal_the_library_report_and_are_counted(client: TestClient) -> None:
    intent = {"engines": ["vllm"], "max_model_len": 200_000}
    response = client.post("/v1/config/validate", json={"config": LLAMA, "intent": intent})
    assert response.status_code == 200
    expected = lint_config(LLAMA, DeploymentIntent.from_mapping(intent)).as_dict()
    assert [f["rule"] for f in response.json()["findings"]] == [f["rule"] for f in expected["findings"]]
    assert any(f["severity"] == "error" for f in response.json()["findings"])
    metrics = client.get("/metrics").text
    for finding in expected["findings"]:
        assert f'ropeserve_lint_findings_total{{rule="{finding["rule"]}",severity="{finding["severity"]}"}}' in metrics


def test_findings_counter_adds_every_request(client: TestClient) -> None:
    body = {"config": LLAMA, "intent": {"engines": ["vllm"], "max_model_len": 200_000}}
    findings = [client.post("/v1/config/validate", json=body).json()["findings"] for _ in range(2)]
    assert findings[0] == findings[1]
    metrics = client.get("/metrics").text
    for rule, severity in {(f["rule"], f["severity"]) for f in findings[0]}:
        count = 2 * sum(1 for f in findings[0] if (f["rule"], f["severity"]) == (rule, severity))
        assert f'ropeserve_lint_findings_total{{rule="{rule}",severity="{severity}"}} {float(count)}' in metrics


def test_null_optional_fields_are_absent_ones(client: TestClient) -> None:
    nulls = {"intent": None, "tokenizer_config": None, "draft_config": None}
    given = client.post("/v1/config/validate", json={"config": LLAMA, **nulls})
    assert given.status_code == 200
    assert given.content == client.post("/v1/config/validate", json={"config": LLAMA}).content


def test_clean_config_has_no_errors(client: TestClient) -> None:
    response = client.post("/v1/config/validate", json={"config": LLAMA, "intent": {"max_model_len": 131072}})
    assert response.status_code == 200
    assert response.json()["summary"]["error"] == 0


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"intent": {}}, "config"),
        ({"config": LLAMA, "intent": {"engines": ["nosuchengine"]}}, "intent.engines[0]"),
        ({"config": LLAMA, "intent": {"max_model_len": -5}}, "intent.max_model_len"),
        ({"config": LLAMA, "extra": 1}, "extra"),
    ],
)
def test_malformed_requests_are_422_naming_the_field(client: TestClient, body: dict, field: str) -> None:
    response = client.post("/v1/config/validate", json=body)
    assert response.status_code == 422, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    assert response.json()["field"] == field


def test_invalid_sliding_window_is_the_same_422_detail_as_the_lint_finding(client: TestClient) -> None:
    """One validator (config/validate.py window_problems): the table route refuses what RS208 reports."""
    config = {**json.loads((CONFIGS / "mistralai__Mistral-7B-Instruct-v0.3.json").read_text()), "sliding_window": 0}
    refused = client.post("/v1/rope/cos-sin", json={"config": config, "positions": [0, 1]})
    assert refused.status_code == 422, refused.text
    assert refused.headers["content-type"].startswith("application/problem+json")
    linted = client.post("/v1/config/validate", json={"config": config}).json()
    [finding] = [f for f in linted["findings"] if f["rule"] == "RS208"]
    assert refused.json()["detail"] == finding["message"]
    assert refused.json()["field"] == "config.sliding_window"


def lint_bodies() -> list[bytes]:
    """Bodies that differ only where JSON parsing tells them apart: NaN and null, 1 and 1.0, key order, spacing."""
    config = json.dumps(LLAMA)
    return [
        config.replace('"rope_theta": 500000.0', '"rope_theta": NaN').encode(),
        config.replace('"rope_theta": 500000.0', '"rope_theta": null').encode(),
        config.replace('"factor": 8.0', '"factor": 8').encode(),
        json.dumps(dict(reversed(LLAMA.items()))).encode(),
        json.dumps(LLAMA, separators=(",", ":")).encode(),
    ]


def test_a_repeated_body_gets_the_report_the_linter_computes_for_it(client: TestClient) -> None:
    headers = {"content-type": "application/json"}
    reports = []
    with TestClient(create_app(Settings(access_log=False, lint_answer_cache_bytes=0))) as uncached:
        for config in lint_bodies():
            body = b'{"config": ' + config + b', "intent": {"max_model_len": 200000}}'
            fresh = uncached.post("/v1/config/validate", content=body, headers=headers)
            answers = [client.post("/v1/config/validate", content=body, headers=headers) for _ in range(2)]
            assert fresh.status_code == 200
            reports.append(fresh.content)
            assert [a.content for a in answers] == [fresh.content] * 2
            assert [a.headers["content-type"] for a in answers] == [fresh.headers["content-type"]] * 2
        assert len(uncached.app.state.runtime.lint_answers) == 0
    assert reports[0] != reports[1]  # NaN and null theta: two reports
    assert len(client.app.state.runtime.lint_answers) == len(set(lint_bodies())) == len(lint_bodies())
    metrics = client.get("/metrics").text
    assert f'ropeserve_lint_answer_cache_lookups_total{{result="hit"}} {float(len(lint_bodies()))}' in metrics
    assert f'ropeserve_lint_answer_cache_lookups_total{{result="miss"}} {float(len(lint_bodies()))}' in metrics


def test_refused_requests_are_not_stored(client: TestClient) -> None:
    for _ in range(2):
        response = client.post("/v1/config/validate", json={"config": LLAMA, "intent": {"dtype": "fp7"}})
        assert response.status_code == 422
        assert response.headers["content-type"] == "application/problem+json"
    assert len(client.app.state.runtime.lint_answers) == 0
