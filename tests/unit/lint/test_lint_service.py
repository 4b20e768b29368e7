"""The POST /v1/config/validate body handler."""

from __future__ import annotations

import json

import pytest
from lint_helpers import build_config, lint

from ropeserve.errors import InvalidInput
from ropeserve.lint import validate_config_request

QWEN = build_config({"config": "Qwen__Qwen2.5-7B-Instruct.json"})


def test_report_dict_is_json_and_counts_findings() -> None:
    body = validate_config_request({"config": QWEN, "intent": {"engines": ["vllm"], "max_model_len": 131072}})
    json.dumps(body)
    assert body["summary"]["error"] >= 1
    assert body["summary"]["by_rule"]["RS309"] == 1
    assert body["engines"][0]["engine"] == "vllm"


def test_finding_counts_label_rule_and_severity() -> None:
    report = lint(QWEN, {"engines": ["vllm", "sglang"], "max_model_len": 131072})
    counts = report.finding_counts()
    assert counts[("RS301", "error")] == 2 and counts[("RS309", "error")] == 1
    assert sum(counts.values()) == len(report.findings)


def test_optional_documents() -> None:
    body = validate_config_request(
        {"config": QWEN, "tokenizer_config": {"model_max_length": 4096}, "draft_config": QWEN, "intent": None}
    )
    assert any(f["rule"] == "RS305" and f["artifact"] == "tokenizer_config" for f in body["findings"])


@pytest.mark.parametrize(
    ("request_body", "field"),
    [
        ([], ""),
        ({}, "/config"),
        ({"config": []}, "/config"),
        ({"config": QWEN, "tokenizer_config": "x"}, "/tokenizer_config"),
        ({"config": QWEN, "intent": {"engines": ["nope"]}}, "/intent/engines/0"),
        ({"config": QWEN, "extra": 1}, "/extra"),
    ],
)
def test_malformed_requests(request_body, field: str) -> None:
    with pytest.raises(InvalidInput) as error:
        validate_config_request(request_body)
    assert error.value.field == field


def test_unreadable_config_is_a_finding_not_an_error() -> None:
    body = validate_config_request({"config": {"rope_theta": "high"}})
    assert [f["rule"] for f in body["findings"] if f["severity"] == "error"] == ["RS100"]
