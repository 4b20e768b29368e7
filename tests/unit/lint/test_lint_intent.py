"""Parsing the deployment intent (HTTP body / --intent file) with field-precise errors."""

from __future__ import annotations

import pytest

from ropeserve.errors import InvalidInput
from ropeserve.lint.intent import DEFAULT_INTENT, ENGINES, DeploymentIntent, EngineTarget


def test_defaults_target_every_engine() -> None:
    intent = DeploymentIntent.from_mapping(None)
    assert [t.name for t in intent.engines] == list(ENGINES)
    assert intent.max_model_len is None and intent.phase_dtype == "float32"


def test_no_intent_is_the_shared_default() -> None:
    """A request without an intent gets the one prebuilt default, equal to a fresh ``DeploymentIntent()``."""
    assert DeploymentIntent.from_mapping(None) is DEFAULT_INTENT
    assert DeploymentIntent() == DEFAULT_INTENT and DeploymentIntent.from_mapping({}) == DEFAULT_INTENT


def test_full_intent() -> None:
    intent = DeploymentIntent.from_mapping(
        {
            "engines": ["vllm==0.9.1", {"name": "sglang", "version": ">=0.4"}, "hf", "llama.cpp@b4500"],
            "n_ctx": 8192,
            "dtype": "bf16",
            "env": {"VLLM_ALLOW_LONG_MAX_MODEL_LEN": "true"},
            "pairing": "gptj",
            "positions": {"padding_side": "left"},
        }
    )
    assert [str(t) for t in intent.engines] == ["vllm==0.9.1", "sglang>=0.4", "transformers", "llama.cpp==b4500"]
    assert intent.max_model_len == 8192 and intent.dtype == "bfloat16"
    assert intent.env_flag("VLLM_ALLOW_LONG_MAX_MODEL_LEN")
    assert intent.positions.padding_side == "left"
    assert DeploymentIntent.from_mapping(intent.as_dict()) == intent


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"engines": ["vllm", "foo"]}, "/intent/engines/1"),
        ({"engines": ["vllm==x"]}, "/intent/engines/0"),
        ({"engines": ["vllm", "vllm==0.9"]}, "/intent/engines"),
        ({"engines": "vllm"}, "/intent/engines"),
        ({"max_model_len": -1}, "/intent/max_model_len"),
        ({"max_model_len": 10, "n_ctx": 20}, "/intent/n_ctx"),
        ({"max_model_len": 2**63}, "/intent/max_model_len"),  # reached the numerics as position 2**64 - 1
        ({"max_model_len": [], "context_length": 5}, "/intent/max_model_len"),  # unhashable: was a TypeError
        ({"max_model_len": 5, "n_ctx": {}}, "/intent/n_ctx"),
        ({"dtype": "int8"}, "/intent/dtype"),
        ({"pairing": "rotate"}, "/intent/pairing"),
        ({"positions": {"padding_side": "middle"}}, "/intent/positions/padding_side"),
        ({"positions": {"foo": "bar"}}, "/intent/positions/foo"),
        ({"video_fps": 0}, "/intent/video_fps"),
        ({"surprise": 1}, "/intent/surprise"),
    ],
)
def test_errors_name_the_field(data: dict, field: str) -> None:
    with pytest.raises(InvalidInput) as error:
        DeploymentIntent.from_mapping(data)
    assert error.value.field == field


def test_engine_target_parse() -> None:
    assert EngineTarget.parse("TGI") == EngineTarget("tgi")
    assert str(EngineTarget.parse("vllm >=0.10, <0.12")) == "vllm>=0.10,<0.12"
