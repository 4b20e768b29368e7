"""``dynamic_ntk="vllm"``: bit-exact with a port of vLLM's DynamicNTKScalingRotaryEmbedding cache (tests/support/
engine_oracles.py names the commit), and different from transformers' per-length rule where they disagree."""

from __future__ import annotations

import math

import pytest
import torch
from engine_oracles import vllm_dynamic_ntk_cos_sin_cache
from hypothesis import given, settings
from hypothesis import strategies as st

from ropeserve.config import RopeParams
from ropeserve.errors import InvalidInput
from ropeserve.rope import rope_cos_sin
from ropeserve.rope.dynamic_ntk import resolve_dynamic_ntk


def _params(theta: float, dim: int, max_pos: int, factor: float) -> RopeParams:
    return RopeParams(
        rope_type="dynamic", rope_theta=theta, head_dim=dim, max_position_embeddings=max_pos, factor=factor
    )


@settings(max_examples=40, deadline=None)
@given(
    theta=st.sampled_from([10000.0, 500000.0, 1e6, 1234.5]),
    dim=st.sampled_from([16, 64, 96, 128]),
    max_pos=st.integers(4, 300),
    factor=st.sampled_from([1.0, 1.5, 2.0, 2.3, 4.0, 8.0, 3.7]),
)
def test_vllm_rule_matches_vllm_cos_sin_cache(theta: float, dim: int, max_pos: int, factor: float) -> None:
    params = _params(theta, dim, max_pos, factor)
    cache = vllm_dynamic_ntk_cos_sin_cache(dim, max_pos, theta, factor)
    positions = torch.arange(cache.shape[0])
    resolved = resolve_dynamic_ntk(params, "vllm", int(positions.max()))
    ours = rope_cos_sin(resolved, positions, cache=None)
    half = dim // 2
    assert torch.equal(ours.cos[:, :half], cache[:, :half])
    assert torch.equal(ours.sin[:, :half], cache[:, half:])
    assert cache.shape[0] == math.ceil(max_pos * factor)


def test_vllm_scales_short_prompts_that_transformers_leaves_alone() -> None:
    params = _params(10000.0, 128, 4096, 2.0)
    positions = torch.arange(16)
    transformers = rope_cos_sin(params, positions, cache=None)
    vllm = rope_cos_sin(resolve_dynamic_ntk(params, "vllm", 15), positions, cache=None)
    plain = rope_cos_sin(RopeParams(rope_type="default", rope_theta=10000.0, head_dim=128), positions, cache=None)
    assert torch.equal(transformers.cos, plain.cos)  # below max_position_embeddings transformers keeps θ
    assert not torch.equal(vllm.cos, plain.cos)  # vLLM uses θ·(f² − f + 1)^(d/(d−2)) = θ·3^(128/126) everywhere
    assert float(vllm.inv_freq[1]) == pytest.approx(1 / (10000.0 * 3 ** (128 / 126)) ** (2 / 128), rel=1e-6)


def test_vllm_rule_refuses_positions_past_its_table_and_passes_other_types_through() -> None:
    params = _params(10000.0, 64, 100, 1.5)
    assert resolve_dynamic_ntk(params, "vllm", 149).rope_type == "default"
    with pytest.raises(InvalidInput) as raised:
        resolve_dynamic_ntk(params, "vllm", 150)
    assert raised.value.field == "positions"
    plain = RopeParams(rope_type="linear", rope_theta=10000.0, head_dim=64, factor=2.0)
    assert resolve_dynamic_ntk(plain, "vllm", 10**6) is plain
    assert resolve_dynamic_ntk(params, "transformers", 10**6) is params


@pytest.mark.parametrize("factor", [1e308, 1e200])
def test_vllm_rule_with_an_overflowing_factor_is_invalid_input(factor: float) -> None:
    with pytest.raises(InvalidInput):
        resolve_dynamic_ntk(_params(10000.0, 64, 4096, factor), "vllm", 10)
