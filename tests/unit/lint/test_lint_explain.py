"""``explain``: per-band wavelengths and ramp positions, checked against the spec's reference values."""

from __future__ import annotations

import json

import pytest
from lint_helpers import build_config

from ropeserve.errors import InvalidInput
from ropeserve.lint import DeploymentIntent, explain

LLAMA = {"config": "meta-llama__Llama-3.1-8B-Instruct.json"}
QWEN_YARN = {
    "config": "Qwen__Qwen2.5-7B-Instruct.json",
    "rope_scaling_snippet": "Qwen__Qwen2.5-7B-Instruct.yarn-snippet.json",
}


def test_llama3_ramp_matches_spec() -> None:
    report = explain(build_config(LLAMA))
    assert (report.ramp.low, report.ramp.high) == (29, 34)  # spec §2.6: 29-34 smoothed
    scales = [band.scale for band in report.bands]
    assert all(s == pytest.approx(1.0) for s in scales[:29]) and all(s == pytest.approx(8.0) for s in scales[35:])
    assert report.original_context == 8192 and report.requested_context == 131072


def test_yarn_ramp_and_attention_factor_match_spec() -> None:
    report = explain(build_config(QWEN_YARN), DeploymentIntent(max_model_len=131072))
    assert (report.ramp.low, report.ramp.high) == (23, 40)  # spec §8 S1
    assert report.attention_factor == pytest.approx(1.138629436111989)


def test_checkpoint_trained_with_its_scaling_sees_no_new_angles_at_its_length() -> None:
    at_trained = explain(build_config(LLAMA), DeploymentIntent(max_model_len=131072))
    assert at_trained.trained_context == 131072
    assert not [band.index for band in at_trained.bands if band.regime == "unseen angles"]
    beyond = explain(build_config(LLAMA), DeploymentIntent(max_model_len=262144))
    assert [band.index for band in beyond.bands if band.regime == "unseen angles"][0] > 34


def test_inference_time_yarn_keeps_angles_in_the_original_range() -> None:
    report = explain(build_config(QWEN_YARN), DeploymentIntent(max_model_len=131072))
    assert all(band.regime != "unseen angles" for band in report.bands)


def test_unscaled_model_beyond_training_shows_unseen_angles() -> None:
    report = explain(build_config({"config": "Qwen__Qwen2.5-7B-Instruct.json"}), DeploymentIntent(max_model_len=131072))
    assert any(band.regime == "unseen angles" for band in report.bands)
    assert report.bands[0].regime == "periodic"


def test_mrope_axes_follow_layout() -> None:
    interleaved = explain(build_config({"config": "Qwen__Qwen3-VL-8B-Instruct.json"}))
    assert "".join(b.axis for b in interleaved.bands[:6]) == "THWTHW"
    assert [b.axis for b in interleaved.bands].count("T") == 24
    chunked = explain(build_config({"config": "Qwen__Qwen2.5-VL-7B-Instruct.json"}))
    assert [b.axis for b in chunked.bands] == ["T"] * 16 + ["H"] * 24 + ["W"] * 24


def test_gptj_pairs_are_neighbours() -> None:
    report = explain(build_config({"config": "deepseek-ai__DeepSeek-V3.json"}))
    assert report.pairing == "gptj" and report.bands[1].channels == (2, 3)


def test_text_and_json() -> None:
    report = explain(build_config(LLAMA))
    text = report.to_text()
    assert "llama3 ramp" in text and "turns@req" in text and len(text.splitlines()) == 3 + 1 + 64
    assert len(json.loads(report.to_json())["bands"]) == 64


def test_sliding_layer_and_errors() -> None:
    gemma = build_config({"config": "google__gemma-3-4b-it.json"})
    assert explain(gemma, layer_type="sliding_attention").rope_theta == 10000.0
    with pytest.raises(InvalidInput):
        explain(gemma, layer_type="linear_attention")
    with pytest.raises(InvalidInput):
        explain(build_config({"config": "mistralai__Mistral-7B-Instruct-v0.3.json", "patch": {"/rope_theta": -1}}))


@pytest.mark.parametrize("rope_type", ["linear", "yarn"])
def test_factor_that_overflows_the_frequencies_is_refused(rope_type: str) -> None:
    """A subnormal factor divides the frequencies into infinity: a clear InvalidInput, not ZeroDivisionError."""
    patch = {"/rope_scaling": {"rope_type": rope_type, "factor": 5e-324}}
    config = build_config({"config": "meta-llama__Llama-2-7b-chat-hf.json", "patch": patch})
    with pytest.raises(InvalidInput, match="overflow") as raised:
        explain(config)
    assert raised.value.field == "rope_scaling"
