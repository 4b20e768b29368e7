"""Sliding window against served length: RS208, RS313, RS314, RS315 and vLLM's window cap (RS301 at the window).

The configs are the real fixtures: Qwen2.5/Qwen3 (a window declared with ``use_sliding_window`` false, or none),
Mistral-7B-Instruct-v0.3 given Mistral-7B-v0.1's ``sliding_window`` 4096, Gemma-3 (a 1,024-token window on its
local layers), Phi-3-mini-128k (a window larger than the context); Gemma-2's vLLM cap is checked on the Mistral
config given Gemma-2-9B's ``model_type``, window (4096) and length (8192).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from lint_helpers import CONFIGS, lint, patched, real_config

from ropeserve.cli import build_parser
from ropeserve.cli_lint import intent_from_args
from ropeserve.config import normalize_config
from ropeserve.errors import InvalidInput
from ropeserve.lint import DeploymentIntent, Finding, LintReport

MISTRAL = "mistralai__Mistral-7B-Instruct-v0.3.json"
MISTRAL_V01_WINDOW = {"/sliding_window": 4096}
GEMMA2_LIKE = {"/model_type": "gemma2", "/sliding_window": 4096, "/max_position_embeddings": 8192}
GEMMA3 = "google__gemma-3-4b-it.json"
PHI3 = "microsoft__Phi-3-mini-128k-instruct.json"
QWEN = "Qwen__Qwen2.5-7B-Instruct.json"
QWEN_WINDOW_UNUSED = sorted(
    p.name
    for p in CONFIGS.glob("Qwen__*.json")
    if "snippet" not in p.name
    and (config := json.loads(p.read_text())).get("sliding_window")
    and config.get("use_sliding_window") is False
)
"""Every Qwen release config that declares a window it does not use (Qwen 1 and Qwen3 declare none)."""
QWEN3 = sorted(p.name for p in CONFIGS.glob("Qwen__Qwen3-*.json") if "VL" not in p.name and "snippet" not in p.name)
TARGETS = [None, ["transformers"], ["vllm"], ["sglang"], ["tgi"], ["llama.cpp"]]


def findings(report: LintReport, rule: str) -> list[Finding]:
    return [f for f in report.findings if f.rule.id == rule]


def run(config: dict[str, Any], engines: list[str] | None = None, **intent: Any) -> LintReport:
    return lint(config, {**({"engines": engines} if engines else {}), **intent})


@pytest.mark.parametrize("name", QWEN_WINDOW_UNUSED)
@pytest.mark.parametrize("engines", TARGETS)
def test_qwen25_window_with_use_sliding_window_false_is_one_info_at_every_target(
    name: str, engines: list[str] | None
) -> None:
    report = run(real_config(name), engines)
    [hit] = findings(report, "RS313")
    assert hit.severity.label == "info" and hit.hit.engine is None
    assert hit.hit.pointer.endswith("/sliding_window")
    assert hit.reference.startswith("https://github.com/vllm-project/vllm/blob/")
    assert not findings(report, "RS314") and not findings(report, "RS315")


@pytest.mark.parametrize("name", QWEN3)
def test_qwen3_null_window_is_silent(name: str) -> None:
    report = run(real_config(name), disable_sliding_window=True, engines=["vllm"], max_model_len=40960)
    assert not {"RS208", "RS301", "RS313", "RS314", "RS315"} & {f.rule.id for f in report.findings}


def test_unused_window_does_not_cap_vllm_even_with_disable_sliding_window() -> None:
    """vLLM's get_hf_config_sliding_window returns None for use_sliding_window false: nothing to cap."""
    config = patched(real_config(QWEN), {"/sliding_window": 4096})
    report = run(config, ["vllm"], max_model_len=32768, disable_sliding_window=True)
    assert not findings(report, "RS301") and not findings(report, "RS314")
    assert report.as_dict()["engines"][0]["derived_max_len"] == 32768


def test_window_every_layer_skips_in_transformers_and_that_old_vllm_refuses() -> None:
    config = patched(real_config(QWEN), {"/use_sliding_window": True})  # max_window_layers 28 == 28 layers
    info = findings(run(config, ["vllm"]), "RS313")
    assert [(f.severity.label, f.hit.engine, f.hit.pointer) for f in info] == [("info", None, "/max_window_layers")]
    old = findings(run(config, ["vllm==0.8.4"]), "RS313")
    assert sorted((f.severity.label, f.hit.engine or "") for f in old) == [("error", "vllm"), ("info", "")]
    [refusal] = [f for f in old if f.hit.engine == "vllm"]
    assert refusal.reference == "https://github.com/vllm-project/vllm/issues/17306"


def test_disable_sliding_window_caps_vllm_at_the_window_and_refuses_past_it() -> None:
    config = patched(real_config(MISTRAL), MISTRAL_V01_WINDOW)
    free = run(config, ["vllm"], max_model_len=8192)
    assert not findings(free, "RS301") and free.as_dict()["engines"][0]["derived_max_len"] == 32768
    capped = run(config, ["vllm"], max_model_len=8192, disable_sliding_window=True)
    [refusal] = findings(capped, "RS301")
    assert refusal.severity.label == "error" and refusal.hit.pointer == "/sliding_window"
    assert "4,096" in refusal.hit.message and "--disable-sliding-window" in refusal.hit.message
    assert "NotImplementedError" not in refusal.hit.message  # no rope_scaling: every version caps
    assert refusal.reference == "https://github.com/vllm-project/vllm/issues/6253"
    assert capped.as_dict()["engines"][0]["derived_max_len"] == 4096
    assert not findings(capped, "RS314")  # the refusal is RS301's


def test_disable_sliding_window_with_no_length_warns_that_vllm_serves_only_the_window() -> None:
    report = run(real_config(GEMMA3), ["vllm"], disable_sliding_window=True)
    [cap] = findings(report, "RS314")
    assert cap.severity.label == "warning" and cap.hit.pointer == "/text_config/sliding_window"
    assert "1,024" in cap.hit.message and "131,072" in cap.hit.message
    assert "NotImplementedError" in cap.hit.message  # Gemma-3's linear rope_scaling (vllm#7593)
    assert report.as_dict()["engines"][0]["default_max_len"] == 1024


def test_override_past_the_cap_warns_that_windowed_layers_attend_past_the_window() -> None:
    config = patched(real_config(MISTRAL), MISTRAL_V01_WINDOW)
    intent = {"max_model_len": 8192, "disable_sliding_window": True, "env": {"VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"}}
    report = run(config, ["vllm"], **intent)
    assert not findings(report, "RS301")
    [cap] = findings(report, "RS314")
    assert cap.severity.label == "warning" and "attend past" in cap.hit.message


def test_window_cap_is_info_for_an_engine_nobody_asked_for() -> None:
    report = run(real_config(GEMMA3), disable_sliding_window=True)
    [cap] = findings(report, "RS314")
    assert cap.hit.engine == "vllm" and cap.severity.label == "info"


@pytest.mark.parametrize(
    ("engines", "capped"),
    [
        (["vllm==0.5.1"], True),
        (["vllm==0.6.4"], True),
        (["vllm>=0.6,<0.7"], True),
        (["vllm==0.6.5"], False),
        (["vllm>=0.6.5"], False),
        (["vllm"], False),
    ],
)
def test_gemma2_is_capped_at_its_window_on_vllm_before_0_6_5(engines: list[str], capped: bool) -> None:
    config = patched(real_config(MISTRAL), GEMMA2_LIKE)
    report = run(config, engines)
    assert bool(findings(report, "RS314")) is capped
    assert report.as_dict()["engines"][0]["default_max_len"] == (4096 if capped else 8192)
    refused = findings(run(config, engines, max_model_len=8192), "RS301")
    assert bool(refused) is capped


def test_window_beyond_the_context_is_info_only() -> None:
    for engines in TARGETS:
        report = run(real_config(PHI3), engines)
        [hit] = findings(report, "RS315")
        assert hit.severity.label == "info" and hit.hit.pointer == "/sliding_window" and hit.hit.engine is None
    assert not findings(run(patched(real_config(MISTRAL), MISTRAL_V01_WINDOW)), "RS315")


@pytest.mark.parametrize(
    ("config", "pointer"),
    [
        (patched(real_config(MISTRAL), {"/sliding_window": 0}), "/sliding_window"),
        (patched(real_config(MISTRAL), {"/sliding_window": -1}), "/sliding_window"),
        (patched(real_config(MISTRAL), {"/sliding_window": 4096.5}), "/sliding_window"),
        (patched(real_config(MISTRAL), {"/sliding_window": "4096"}), "/sliding_window"),
        (patched(real_config(MISTRAL), {"/sliding_window": True}), "/sliding_window"),
        (patched(real_config(MISTRAL), {"/sliding_window": [4096, 0]}), "/sliding_window"),
        (patched(real_config(GEMMA3), {"/text_config/sliding_window": -1}), "/text_config/sliding_window"),
    ],
)
def test_invalid_window_is_rs208_with_the_servers_422_message(config: dict[str, Any], pointer: str) -> None:
    with pytest.raises(InvalidInput) as refused:
        normalize_config(config)
    assert refused.value.field == pointer
    [finding] = findings(run(config), "RS208")
    assert finding.severity.label == "error" and finding.hit.pointer == pointer
    assert finding.hit.message == refused.value.detail


@pytest.mark.parametrize("window", [4096, 4096.0, None, [4096, None]])
def test_valid_windows_pass_the_validator(window: Any) -> None:
    config = patched(real_config(MISTRAL), {"/sliding_window": window})
    normalize_config(config)
    assert not findings(run(config), "RS208")


def test_cli_flag_and_intent_key() -> None:
    args = build_parser().parse_args(["lint", "config.json", "--disable-sliding-window"])
    assert intent_from_args(args).disable_sliding_window is True
    assert intent_from_args(build_parser().parse_args(["lint", "config.json"])).disable_sliding_window is False
    with pytest.raises(InvalidInput) as refused:
        DeploymentIntent.from_mapping({"disable_sliding_window": "yes"})
    assert refused.value.field == "/intent/disable_sliding_window"


def test_rs312_vllm_finding_cites_vllm_source_and_sglang_keeps_the_rule_reference() -> None:
    """Issue 14 §3: a vLLM finding cites a vLLM source (RS312 cited only docs/lint.md#rs312 before)."""
    config = patched(real_config(MISTRAL), {"/rope_scaling": {"rope_type": "linear", "factor": 2.0}})
    report = run(config, ["vllm", "sglang"])
    by_engine = {f.hit.engine: f.reference for f in findings(report, "RS312")}
    assert (
        by_engine["vllm"].startswith("https://github.com/vllm-project/vllm/blob/")
        and "config/model.py" in by_engine["vllm"]
    )
    assert by_engine["sglang"] == "docs/lint.md#rs312"
