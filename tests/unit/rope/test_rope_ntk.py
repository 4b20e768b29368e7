"""The ``ntk`` rope type (vLLM's fixed and mixed NTK scaling) reproduces vLLM bit for bit: ``inv_freq``
(float32, ``torch.equal``) and the cos/sin rows equal the port of ``NTKScalingRotaryEmbedding`` in
tests/support/vllm_oracle.py; its keys and checks are the service's and the linter's."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from vllm_oracle import VllmNtkRope

from ropeserve.config import from_explicit, normalize_config
from ropeserve.errors import InvalidInput
from ropeserve.lint import lint_config
from ropeserve.rope import compute_inv_freq, rope_cos_sin

CASES = [
    # (head_dim, rotary_dim, theta, factor, mixed_b)
    (128, 128, 10000.0, 4.0, None),
    (128, 128, 500000.0, 8.0, 0.625),
    (128, 64, 10000.0, 2.0, 1.0),
    (96, 96, 1e6, 16.0, 0.5),
    (64, 32, 10000.0, 3.0, None),
    (256, 256, 1e7, 1.5, 2.0),
]


def explicit(head_dim: int, rotary_dim: int, theta: float, factor: float, mixed_b: float | None) -> dict[str, Any]:
    rope = {"rope_type": "ntk", "rope_theta": theta, "head_dim": head_dim, "rotary_dim": rotary_dim, "factor": factor}
    return rope if mixed_b is None else {**rope, "mixed_b": mixed_b}


@pytest.mark.parametrize(("head_dim", "rotary_dim", "theta", "factor", "mixed_b"), CASES)
def test_inv_freq_and_rows_equal_vllm(
    head_dim: int, rotary_dim: int, theta: float, factor: float, mixed_b: float | None
) -> None:
    params = from_explicit({**explicit(head_dim, rotary_dim, theta, factor, mixed_b), "max_position_embeddings": 64})
    reference = VllmNtkRope(rotary_dim, 64, theta, factor, mixed_b)
    inv_freq, attention_factor = compute_inv_freq(params)
    assert inv_freq.dtype == torch.float32
    assert torch.equal(inv_freq, reference.compute_inv_freq())
    assert attention_factor == 1.0
    cos, sin = reference.cos_sin_cache()
    result = rope_cos_sin(params, torch.arange(64), cache=None)
    assert torch.equal(result.cos[:, : rotary_dim // 2], cos)
    assert torch.equal(result.sin[:, : rotary_dim // 2], sin)


@settings(max_examples=60, deadline=None)
@given(
    half=st.integers(2, 256),
    theta=st.floats(2.0, 1e8),
    factor=st.floats(1.0, 64.0),
    mixed_b=st.one_of(st.none(), st.floats(0.05, 8.0)),
)
def test_inv_freq_equals_vllm_for_any_parameters(half: int, theta: float, factor: float, mixed_b: float | None) -> None:
    params = from_explicit(explicit(2 * half, 2 * half, theta, factor, mixed_b))
    inv_freq, _ = compute_inv_freq(params)
    assert torch.equal(inv_freq, VllmNtkRope(2 * half, 1, theta, factor, mixed_b).compute_inv_freq())


def test_mixed_b_reaches_the_parameters_from_a_config() -> None:
    config = {
        "model_type": "llama",
        "hidden_size": 4096,
        "num_attention_heads": 32,
        "rope_scaling": {"rope_type": "ntk", "factor": 4, "mixed_b": 0.625},
    }
    params = normalize_config(config).params()
    assert params.value("mixed_b") == 0.625
    assert params.as_dict()["mixed_b"] == 0.625
    assert normalize_config(config).sources["full_attention"]["mixed_b"] == "/rope_scaling/mixed_b"


@pytest.mark.parametrize(
    ("rope", "field"),
    [
        ({"rope_type": "ntk", "mixed_b": 0.5}, "rope.factor"),  # factor is required
        ({"rope_type": "ntk", "factor": 4.0, "mixed_b": 0.0}, "rope.mixed_b"),
        ({"rope_type": "ntk", "factor": 4.0, "mixed_b": 9.0}, "rope.mixed_b"),
        ({"rope_type": "ntk", "factor": 4.0, "mixed_b": "0.5"}, "rope.mixed_b"),
        ({"rope_type": "ntk", "factor": 4.0, "beta_fast": 32}, "rope.beta_fast"),  # a yarn key
        ({"rope_type": "yarn", "factor": 4.0, "mixed_b": 0.5}, "rope.mixed_b"),  # an ntk key
        ({"rope_type": "ntk", "factor": 1e308}, "rope.factor"),  # theta x factor overflows to inf
    ],
)
def test_bad_ntk_parameters_are_refused_at_their_key(rope: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidInput) as error:
        from_explicit({**rope, "rope_theta": 1e4, "head_dim": 64, "original_max_position_embeddings": 4096})
    assert error.value.field == field


def test_the_linter_knows_mixed_b_as_an_ntk_key() -> None:
    config = {
        "model_type": "llama",
        "hidden_size": 4096,
        "num_attention_heads": 32,
        "max_position_embeddings": 4096,
        "rope_scaling": {"rope_type": "ntk", "factor": 4.0, "mixed_b": 0.625},
    }
    assert "RS107" not in {finding.rule.id for finding in lint_config(config).findings}
    config["rope_scaling"]["mixed_b"] = 100.0
    messages = [finding.hit.message for finding in lint_config(config).findings if finding.rule.id == "RS207"]
    assert messages == ["mixed_b = 100.0 must be finite and in (0, 8.0]"]
