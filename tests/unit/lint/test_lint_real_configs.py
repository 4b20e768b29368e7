"""Real public configs lint clean of errors at their documented context lengths; known engine gaps are named."""

from __future__ import annotations

import pytest
from lint_helpers import build_config, lint, rule_ids

from ropeserve.lint.intent import ENGINES

YARN_ENV = {"SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN": "1"}
NO_TGI = [engine for engine in ENGINES if engine != "tgi"]

# (fixture, documented context, extra intent)
DOCUMENTED = [
    ({"config": "meta-llama__Llama-3.1-8B-Instruct.json"}, 131072, {}),
    ({"config": "meta-llama__Llama-3.2-3B-Instruct.json"}, 131072, {}),
    ({"config": "Qwen__Qwen2.5-7B-Instruct.json"}, 32768, {}),
    (
        {
            "config": "Qwen__Qwen2.5-7B-Instruct.json",
            "rope_scaling_snippet": "Qwen__Qwen2.5-7B-Instruct.yarn-snippet.json",
        },
        131072,
        {"env": YARN_ENV},
    ),
    ({"config": "Qwen__Qwen2.5-7B.json"}, 131072, {}),
    ({"config": "Qwen__Qwen2.5-VL-7B-Instruct.json"}, 32768, {}),
    ({"config": "Qwen__Qwen2.5-VL-7B-Instruct.modelscope-copy.json"}, 32768, {}),
    ({"config": "apjanco__es_qwen2_vl_pangea.json"}, 32768, {}),
    ({"config": "Qwen__Qwen3-8B.json"}, 32768, {}),
    (
        {"config": "Qwen__Qwen3-8B.json", "rope_scaling_snippet": "Qwen__Qwen3-8B.yarn-snippet.json"},
        131072,
        {"env": YARN_ENV},
    ),
    ({"config": "Qwen__Qwen3-VL-8B-Instruct.json"}, 262144, {"engines": NO_TGI}),
    ({"config": "Qwen__Qwen3.5-0.8B.json"}, 262144, {"engines": NO_TGI}),
    ({"config": "microsoft__Phi-3-mini-128k-instruct.json"}, 131072, {}),
    ({"config": "microsoft__Phi-4-mini-instruct.json"}, 131072, {}),
    ({"config": "deepseek-ai__DeepSeek-V3.json"}, 131072, {}),
    ({"config": "google__gemma-3-4b-it.json"}, 131072, {}),
    ({"config": "mistralai__Mistral-7B-Instruct-v0.3.json"}, 32768, {}),
]


def _id(case: tuple) -> str:
    spec = case[0]
    return spec["config"].removesuffix(".json") + ("+yarn" if "rope_scaling_snippet" in spec else "")


@pytest.mark.parametrize(("spec", "length", "intent"), DOCUMENTED, ids=[_id(c) for c in DOCUMENTED])
def test_real_config_has_no_errors_at_documented_length(spec: dict, length: int, intent: dict) -> None:
    report = lint(build_config(spec), {"max_model_len": length, **intent})
    assert not rule_ids(report, "error"), report.to_text()


@pytest.mark.parametrize("name", ["Qwen__Qwen3-VL-8B-Instruct.json", "Qwen__Qwen3.5-0.8B.json"])
def test_interleaved_mrope_is_refused_for_tgi(name: str) -> None:
    report = lint(build_config({"config": name}), {"engines": ["tgi"]})
    assert rule_ids(report, "error") == {"RS105"}


def test_yarn_card_snippet_needs_the_sglang_override() -> None:
    spec = {
        "config": "Qwen__Qwen2.5-7B-Instruct.json",
        "rope_scaling_snippet": "Qwen__Qwen2.5-7B-Instruct.yarn-snippet.json",
    }
    report = lint(build_config(spec), {"max_model_len": 131072, "engines": list(ENGINES)})
    errors = [f for f in report.findings if f.severity.label == "error"]
    assert [(f.rule.id, f.hit.engine) for f in errors] == [("RS301", "sglang")]


def test_lenient_normalisation_equals_strict_on_real_configs() -> None:
    from ropeserve.config import normalize_config

    for spec, _, _ in DOCUMENTED:
        config = build_config(spec)
        assert normalize_config(config, validate=False) == normalize_config(config)
