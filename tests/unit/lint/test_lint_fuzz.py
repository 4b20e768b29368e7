"""Property: whatever a config.json holds, linting it yields findings (and explaining it a report or InvalidInput),
never another exception or non-finite JSON."""

from __future__ import annotations

import contextlib
import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from lint_helpers import CONFIGS, lint, patched, real_config

from ropeserve.errors import InvalidInput
from ropeserve.lint import DeploymentIntent, explain, validate_config_request

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
    st.sampled_from([float("inf"), float("-inf"), float("nan"), 1e308, 0, -1, 0.5, 2**40]),
    st.sampled_from(["yarn", "llama3", "longrope", "mrope", "su", "dynamic", "linear", "default", "ntk", "x"]),
    st.lists(st.integers(-2, 70), max_size=4),
    st.just({}),
    st.just({"rope_type": "yarn"}),
    st.just({"full_attention": None, "sliding_attention": {"rope_type": "default"}}),
    st.just([{"a": 1}]),
)
INTENTS = st.fixed_dictionaries(
    {},
    optional={
        "max_model_len": st.integers(1, 40_000_000),
        "engines": st.lists(
            st.sampled_from(["vllm", "sglang", "tgi", "llama.cpp", "transformers"]), min_size=1, unique=True
        ),
        "phase_dtype": st.sampled_from(["bf16", "fp16", "fp32"]),
        "pairing": st.sampled_from(["neox", "gptj"]),
        "mrope_layout": st.sampled_from(["chunked", "interleaved"]),
        "max_video_seconds": st.floats(1, 10_000),
        "rope_override": st.just({"type": "dynamic", "factor": 4.0}),
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
    report.to_text()
    report.to_sarif()
    with contextlib.suppress(InvalidInput):
        json.dumps(explain(config, DeploymentIntent.from_mapping(intent)).as_dict(), allow_nan=False)


def test_service_accepts_any_json_object() -> None:
    body = validate_config_request({"config": {"rope_scaling": "yes", "max_position_embeddings": "many"}})
    assert body["summary"]["error"] >= 1
