"""Request bodies the client builds are accepted by the server's own request handling (no HTTP needed)."""

from __future__ import annotations

import pytest

from ropeserve_client import LintReport
from ropeserve_client import _endpoints as api

LLAMA = {
    "model_type": "llama",
    "max_position_embeddings": 131072,
    "rope_theta": 500000.0,
    "head_dim": 128,
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192},
}  # fmt: skip


def test_lint_request_and_report_round_trip() -> None:
    service = pytest.importorskip("ropeserve.lint.service")
    operation = api.validate_config(
        LLAMA, engines=["vllm==0.9.1", "sglang"], max_model_len=262144, dtype="bf16", env={"X": "1"}
    )
    report = LintReport.from_json(service.validate_config_request(operation.json))
    assert report.raw["intent"]["max_model_len"] == 262144
    assert {engine["engine"] for engine in report.engines} == {"vllm", "sglang"}
    assert report.findings and all(f.rule.startswith("RS") and f.severity in ("error", "warning", "info")
                                   for f in report.findings)  # fmt: skip
    assert report.fails("info") and report.count("error") == report.raw["summary"]["error"]
    assert not report.findings[0].extra or set(report.findings[0].extra) <= {"family"}
