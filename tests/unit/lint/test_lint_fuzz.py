"""Property: whatever a config.json holds, linting it yields findings (and explaining it a report or InvalidInput),
never another exception or non-finite JSON."""

from __future__ import annotations

import contextlib
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from lint_helpers import CONFIGS, lint, patched, real_config

from ropeserve.errors import InvalidInput
from ropeserve.lint import DeploymentIntent, explain, validate_config_request
from ropeserve.lint.rules.common import fmt

NAMES = sorted(p.name for p in CONFIGS.glob("*.json") if "snippet" not in p.name)
KEYS = [
    "/rope_theta",
    "/max_position_embeddings",
    "/seq_length",
    "/model_max_length",
    "/head_dim",
    "/hidden_size",
    "/num_attention_heads",
    "/partial_rotary_factor",
    "/original_max_position_embeddings",
    "/model_type",
    "/layer_types",
    "/rope_scaling",
    "/rope_parameters",
    "/rope_scaling/type",
    "/rope_scaling/rope_type",
    "/rope_scaling/factor",
    "/rope_scaling/original_max_position_embeddings",
    "/rope_scaling/mrope_section",
    "/rope_scaling/mrope_interleaved",
    "/rope_scaling/short_factor",
    "/rope_scaling/low_freq_factor",
    "/rope_scaling/beta_fast",
    "/rope_parameters/full_attention",
    "/text_config/rope_scaling/mrope_section",
    "/text_config/rope_parameters/partial_rotary_factor",
    "/text_config/max_position_embeddings",
    "/vision_config",
]
VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-10, 10**9),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([float("inf"), float("-inf"), float("nan"), 1e308, -1e308, 5e-324, 0, -1, 0.5, 2**40, -(2**63)]),
    st.sampled_from(["yarn", "llama3", "longrope", "mrope", "su", "dynamic", "linear", "default", "ntk", "x"]),
    st.lists(st.integers(-2, 70), max_size=4),
    st.just({}),
    st.just({"rope_type": "yarn"}),
    st.just({"full_attention": None, "sliding_attention": {"rope_type": "default"}}),
    st.just([{"a": 1}]),
)
HOSTILE_OVERRIDES = [
    {"rope_type": "dynamic", "factor": 5e-324},
    {"rope_type": "yarn", "factor": 1e308, "original_max_position_embeddings": 1e308},
    {"rope_type": "longrope", "short_factor": [1e308], "long_factor": [-1.0], "original_max_position_embeddings": 4096},
]
"""Overrides with the extreme factors and lengths that once reached an unchecked division or int conversion."""
INTENTS = st.fixed_dictionaries(
    {},
    optional={
        "max_model_len": st.integers(1, 40_000_000) | st.sampled_from([10**18, 2**62]),
        "engines": st.lists(
            st.sampled_from(["vllm", "sglang", "tgi", "llama.cpp", "transformers"]), min_size=1, unique=True
        ),
        "phase_dtype": st.sampled_from(["bf16", "fp16", "fp32"]),
        "pairing": st.sampled_from(["neox", "gptj"]),
        "mrope_layout": st.sampled_from(["chunked", "interleaved"]),
        "max_video_seconds": st.floats(1, 10_000),
        "rope_override": st.sampled_from([{"type": "dynamic", "factor": 4.0}, *HOSTILE_OVERRIDES]),
    },
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    name=st.sampled_from(NAMES),
    patch=st.dictionaries(st.sampled_from(KEYS), VALUES, max_size=4),
    intent=INTENTS,
)
def test_lint_never_raises_and_stays_finite(name: str, patch: dict, intent: dict) -> None:
    config = patched(real_config(name), patch)
    report = lint(config, intent)
    json.dumps(report.as_dict(), allow_nan=False)
    assert_lengths_in_int64(report.as_dict())
    report.to_text()
    report.to_sarif()
    with contextlib.suppress(InvalidInput):
        json.dumps(explain(config, DeploymentIntent.from_mapping(intent)).as_dict(), allow_nan=False)


def test_service_accepts_any_json_object() -> None:
    body = validate_config_request({"config": {"rope_scaling": "yes", "max_position_embeddings": "many"}})
    assert body["summary"]["error"] >= 1


def assert_lengths_in_int64(report: dict) -> None:
    """Every length, row count and error of the engines' and numerics' sections is None or in [0, 2**63 - 1]:
    nothing a consumer reading int64 would see wrapped."""
    sections = [*report["engines"], *report["numerics"]["engines"]]
    for section in sections:
        for key, value in section.items():
            assert not (isinstance(value, int | float) and not 0 <= value <= 2**63 - 1), (section["engine"], key, value)


HOSTILE_CASES = {
    "a 5e-324 dynamic factor scales the capacity to 0 (RS309 divided by it)": (
        "Aratako__c4ai-command-r-v01-japanese-instruct.json",
        {},
        {"rope_override": HOSTILE_OVERRIDES[0], "max_model_len": 10**18},
    ),
    "a -1e308 max_position_embeddings (negative cache rows, an int past the float range in a message)": (
        "Qwen__Qwen2.5-VL-7B-Instruct.json",
        {"/max_position_embeddings": -1e308},
        {"rope_override": HOSTILE_OVERRIDES[2]},
    ),
    "a -1e308 yarn original length (int() of -inf in RS303)": (
        "mistralai__Ministral-3-8B-Instruct-2512.json",
        {"/text_config/rope_parameters/original_max_position_embeddings": -1e308},
        {"max_model_len": 2**62, "disable_sliding_window": True},
    ),
    "a max_position_embeddings past int64 (TGI derived 2**64)": (
        "Downtown-Case__internlm2_5-7b-chat-1m-llamafied.json",
        {"/max_position_embeddings": 2**64},
        {"rope_override": HOSTILE_OVERRIDES[1]},
    ),
    "a negative top-level max_position_embeddings (TGI's derived length was negative)": (
        "Downtown-Case__internlm2_5-7b-chat-1m-llamafied.json",
        {"/max_position_embeddings": -(2**63)},
        {"rope_override": HOSTILE_OVERRIDES[2]},
    ),
}


@pytest.mark.parametrize(("name", "patch", "intent"), HOSTILE_CASES.values(), ids=list(HOSTILE_CASES))
def test_hostile_lengths_are_findings_with_lengths_in_int64(name: str, patch: dict, intent: dict) -> None:
    report = validate_config_request({"config": patched(real_config(name), patch), "intent": intent})
    json.dumps(report, allow_nan=False)
    assert_lengths_in_int64(report)
    assert report["summary"]["error"] >= 1  # the hostile value is reported, not absorbed


def test_capacity_scaled_to_zero_suggests_no_factor() -> None:
    name, patch, intent = HOSTILE_CASES["a 5e-324 dynamic factor scales the capacity to 0 (RS309 divided by it)"]
    report = validate_config_request({"config": patched(real_config(name), patch), "intent": intent})
    (finding,) = [f for f in report["findings"] if f["rule"] == "RS309"]
    assert "covers 0" in finding["message"] and "factor" not in finding["fix"].split("scaling")[-1]


def test_lengths_past_the_float_range_are_printed_exactly() -> None:
    assert fmt(4 * int(1e308)) == f"{4 * int(1e308):,}"
    assert (fmt(2**63), fmt(1.5), fmt(8192.0), fmt(None)) == ("9,223,372,036,854,775,808", "1.5", "8,192", "unknown")


def test_the_largest_int64_length_is_derived_exactly() -> None:
    """float(2**63 - 1) is 2**63: the length is kept as the int it is, and factors saturate at 2**63 - 1."""
    config = patched(real_config("Qwen__Qwen2.5-7B-Instruct.json"), {"/max_position_embeddings": 2**63 - 1})
    report = validate_config_request({"config": config})
    assert {engine["derived_max_len"] for engine in report["engines"]} == {2**63 - 1}
