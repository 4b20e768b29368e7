"""cos/sin tables equal the model's rotary module forward bit for bit (spec §4.1, §4.3, §2.9).

``rope_cos_sin`` is compared with ``XRotaryEmbedding(config)(x, position_ids)`` for every real fixture config,
at positions inside and beyond the original context (edges and hypothesis-drawn), in float32, bfloat16 and
float16, with both pairings (GPT-J layout against Cohere's and GLM's), partial rotary, and the stateful
dynamic-NTK / longrope switching over a sequence of lengths.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rope_oracle import both, gptj_from_neox, hf_cos_sin, hf_rotary, load_fixture, with_rope_scaling

from ropeserve.config import RopeParams, from_explicit
from ropeserve.rope import TableCache, effective_length, rope_cos_sin
from ropeserve.rope.tables import TABLE_ROW_CAP

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
FIXTURE_CONFIGS: dict[str, dict[str, Any]] = {
    name: load_fixture(name)
    for name in (
        "meta-llama__Llama-3.1-8B-Instruct.json",
        "meta-llama__Llama-3.2-3B-Instruct.json",
        "mistralai__Mistral-7B-Instruct-v0.3.json",
        "Qwen__Qwen2.5-7B-Instruct.json",
        "Qwen__Qwen3-8B.json",
        "microsoft__Phi-3-mini-128k-instruct.json",
        "microsoft__Phi-4-mini-instruct.json",
        "deepseek-ai__DeepSeek-V3.json",
        "google__gemma-3-4b-it.json",
        "apjanco__es_qwen2_vl_pangea.json",
        "Qwen__Qwen2.5-VL-7B-Instruct.json",
        "Qwen__Qwen3-VL-8B-Instruct.json",
        "Qwen__Qwen3.5-0.8B.json",
    )
}
FIXTURE_CONFIGS["Qwen3-8B+yarn"] = with_rope_scaling("Qwen__Qwen3-8B.json", "Qwen__Qwen3-8B.yarn-snippet.json")
FIXTURE_CONFIGS["Qwen2.5-VL+yarn"] = with_rope_scaling(
    "Qwen__Qwen2.5-VL-7B-Instruct.json", "Qwen__Qwen2.5-VL-7B-Instruct.yarn-snippet.json"
)
SMALL = {"model_type": "llama", "hidden_size": 512, "num_attention_heads": 4, "max_position_embeddings": 4096}
SYNTHETIC_CONFIGS: dict[str, dict[str, Any]] = {
    "dynamic": {**SMALL, "rope_parameters": {"rope_type": "dynamic", "factor": 2.5, "rope_theta": 5e5}},
    "linear": {**SMALL, "rope_parameters": {"rope_type": "linear", "factor": 4.0}},
    "proportional": {
        **SMALL,
        "rope_parameters": {"rope_type": "proportional", "rope_theta": 1e6, "partial_rotary_factor": 0.25},
    },
    "gpt_neox partial 0.25": {"model_type": "gpt_neox", **{k: v for k, v in SMALL.items() if k != "model_type"}},
    "glm partial 0.5": {"model_type": "glm", "hidden_size": 512, "num_attention_heads": 4},
}
ALL_CONFIGS = {**FIXTURE_CONFIGS, **SYNTHETIC_CONFIGS}


def rope_layers(config: dict[str, Any]) -> list[str | None]:
    """Layer types to test: ``None`` for single-type configs (plain module call), else each layer type."""
    normalized, _ = both(config)
    layers = [name for name, params in normalized.layers.items() if params is not None]
    return layers if len(layers) > 1 else [None]


def edge_positions(params: RopeParams) -> torch.Tensor:
    """0, 1, the ends of the original and extended windows, and positions far beyond (past the table cap)."""
    original = params.original_max_position_embeddings or params.max_position_embeddings or 4096
    limit = params.max_position_embeddings or original
    edges = {0, 1, original - 1, original, original + 1, limit - 1, limit, limit + 1, 2 * limit + 3}
    edges |= {TABLE_ROW_CAP - 1, TABLE_ROW_CAP, 3_000_017}
    return torch.tensor(sorted(edges))


SHARED_TABLES = TableCache(max_entries=4)
"""One cache across the tests, as in the service: tables grown by one test serve the next (kept small: a table
grown to 2^18 rows holds up to 256 MiB)."""
CACHED_PATH_LIMIT = 1 << 16
"""The cached-row path is compared below this position (the direct path covers every position)."""


def assert_matches_module(
    config: dict[str, Any], layer_type: str | None, positions: torch.Tensor, dtype: torch.dtype
) -> None:
    """Both paths: rows computed directly for every position, and rows gathered from the cached table."""
    normalized, text = both(config)
    params = normalized.params(layer_type)
    cos, sin = hf_cos_sin(hf_rotary(text), positions[None], dtype, layer_type)
    direct = rope_cos_sin(params, positions, pairing="neox", dtype=dtype, cache=None)
    assert direct.cos.dtype == dtype
    assert torch.equal(direct.cos, cos[0])
    assert torch.equal(direct.sin, sin[0])
    in_table = positions < CACHED_PATH_LIMIT
    if params.rope_type in ("dynamic", "longrope") and not bool(in_table.all()):
        return  # fewer positions would select other frequencies; the direct path above covers them
    cached = rope_cos_sin(params, positions[in_table], pairing="neox", dtype=dtype, cache=SHARED_TABLES)
    assert torch.equal(cached.cos, cos[0][in_table])
    assert torch.equal(cached.sin, sin[0][in_table])


CASES = [(name, layer) for name, config in ALL_CONFIGS.items() for layer in rope_layers(config)]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(("name", "layer_type"), CASES)
def test_cos_sin_at_edge_positions_equal_the_rotary_module(
    name: str, layer_type: str | None, dtype: torch.dtype
) -> None:
    config = ALL_CONFIGS[name]
    params = both(config)[0].params(layer_type)
    assert_matches_module(config, layer_type, edge_positions(params), dtype)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    case=st.sampled_from(CASES),
    dtype=st.sampled_from(DTYPES),
    positions=st.lists(st.integers(0, 600_000), min_size=1, max_size=48),
)
def test_cos_sin_at_random_positions_equal_the_rotary_module(
    case: tuple[str, str | None], dtype: torch.dtype, positions: list[int]
) -> None:
    name, layer_type = case
    assert_matches_module(ALL_CONFIGS[name], layer_type, torch.tensor(positions), dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_max_abs_error_is_the_cast_error(dtype: torch.dtype) -> None:
    params = both(FIXTURE_CONFIGS["meta-llama__Llama-3.1-8B-Instruct.json"])[0].params()
    positions = torch.arange(0, 200_000, 997)
    exact = rope_cos_sin(params, positions, cache=None)
    cast = rope_cos_sin(params, positions, dtype=dtype, cache=None)
    expected = max(
        float((exact.cos.to(dtype).float() - exact.cos).abs().max()),
        float((exact.sin.to(dtype).float() - exact.sin).abs().max()),
    )
    assert exact.max_abs_error is None
    assert cast.max_abs_error == expected
    assert 0 < expected <= 2.0**-8


def test_gptj_layout_equals_cohere_module() -> None:
    """Cohere builds ``repeat_interleave(freqs, 2)`` in its forward: exactly our GPT-J expansion."""
    for rope in ({"rope_type": "default", "rope_theta": 8e6}, {"rope_type": "linear", "factor": 2.0}):
        config = {"model_type": "cohere", "hidden_size": 512, "num_attention_heads": 4, "rope_parameters": rope}
        normalized, text = both(config)
        assert normalized.pairing == "gptj"
        positions = torch.tensor([0, 1, 7, 8191, 8192, 123_457])
        for dtype in DTYPES:
            cos, sin = hf_cos_sin(hf_rotary(text), positions[None], dtype)
            ours = rope_cos_sin(normalized.params(), positions, pairing="gptj", dtype=dtype, cache=None)
            assert torch.equal(ours.cos, cos[0])
            assert torch.equal(ours.sin, sin[0])


def test_gptj_layout_equals_glm_conversion_with_partial_rotary() -> None:
    """GLM keeps the first half of its NeoX cos and repeats each entry (spec §4.3); prf 0.5 -> width 64."""
    normalized, text = both(SYNTHETIC_CONFIGS["glm partial 0.5"])
    assert normalized.pairing == "gptj"
    positions = torch.tensor([0, 3, 4095, 70_001])
    for dtype in DTYPES:
        cos, sin = hf_cos_sin(hf_rotary(text), positions[None], dtype)
        ours = rope_cos_sin(normalized.params(), positions, pairing="gptj", dtype=dtype, cache=None)
        assert ours.cos.shape == (4, 64)
        assert torch.equal(ours.cos, gptj_from_neox(cos[0]))
        assert torch.equal(ours.sin, gptj_from_neox(sin[0]))


def test_spec_s2_values_as_sanity_anchors() -> None:
    params = from_explicit({"rope_type": "default", "rope_theta": 10000.0, "head_dim": 8})
    at_one = rope_cos_sin(params, torch.tensor([1]), cache=None)
    assert at_one.cos[0].tolist() == pytest.approx([0.5403023, 0.9950042, 0.99995, 0.9999995] * 2, abs=1e-7)
    assert at_one.sin[0].tolist() == pytest.approx([0.841471, 0.0998334, 0.0099998, 0.001] * 2, abs=1e-6)
    bf16 = rope_cos_sin(params, torch.tensor([1, 100_000]), dtype=torch.bfloat16, cache=None)
    assert bf16.cos[0].tolist() == [0.5390625, 0.99609375, 1.0, 1.0] * 2
    assert bf16.cos[1].tolist() == [-1.0, -0.953125, 0.5625, 0.86328125] * 2
    far = rope_cos_sin(params, torch.tensor([100_000]), cache=None)
    assert far.cos[0, :4].tolist() == pytest.approx([-0.999361, -0.952155, 0.562379, 0.862323], abs=1e-6)


# --------------------------------------------------------------------------------------- run-time switching (S7)
DYNAMIC_S7 = {
    "model_type": "llama",
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "max_position_embeddings": 4096,
    "rope_parameters": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4},
}
LENGTHS = [100, 4096, 4097, 8192, 6000, 4095, 100, 12_288, 9000, 20_000, 4096, 10, 7777]


@pytest.mark.parametrize(
    "config",
    [
        DYNAMIC_S7,
        {**DYNAMIC_S7, "max_position_embeddings": 1000, "rope_parameters": {"rope_type": "dynamic", "factor": 1.7}},
        {**DYNAMIC_S7, "rope_parameters": {"rope_type": "dynamic", "factor": 3.0, "partial_rotary_factor": 0.5}},
    ],
    ids=["S7", "odd factor", "partial"],
)
def test_dynamic_ntk_hysteresis_follows_the_stateful_module(config: dict[str, Any]) -> None:
    """Driving one module through a sequence of lengths; ``seq_len_cached`` carries its ``max_seq_len_cached``."""
    normalized, text = both(config)
    params = normalized.params()
    module = hf_rotary(text)
    cache = TableCache()
    for length in LENGTHS:
        seen = int(module.max_seq_len_cached)
        positions = torch.arange(max(0, length - 64), length)
        cos, sin = hf_cos_sin(module, positions[None])
        ours = rope_cos_sin(params, positions, seq_len_cached=seen, cache=cache)
        assert torch.equal(ours.inv_freq, module.inv_freq), length
        assert torch.equal(ours.cos, cos[0]), length
        assert torch.equal(ours.sin, sin[0]), length


def test_spec_s7_dynamic_values() -> None:
    params = both(DYNAMIC_S7)[0].params()
    steps = [
        (100, None, 1.154782e-04),
        (8192, 4096, 3.849273e-05),
        (6000, 8192, 3.849273e-05),
        (100, 8192, 1.154782e-04),
    ]
    for length, seen, inv_63 in steps:
        ours = rope_cos_sin(params, torch.arange(length), seq_len_cached=seen, cache=None)
        assert float(ours.inv_freq[63]) == pytest.approx(inv_63, rel=1e-6)


LONGROPE_S7 = {
    "model_type": "phi3",
    "hidden_size": 3072,
    "num_attention_heads": 32,
    "max_position_embeddings": 131072,
    "rope_scaling": {"rope_type": "longrope", "short_factor": [1.0] * 48, "long_factor": [4.0] * 48},
}


def test_longrope_switching_follows_the_stateful_module() -> None:
    normalized, text = both(LONGROPE_S7)
    params = normalized.params()
    module = hf_rotary(text)
    anchors = {4096: 8.254042e-01, 4097: 2.063510e-01, 10: 8.254042e-01}
    for length in [4096, 4097, 10, 5000, 4095, 131_072, 200_000, 1]:
        positions = torch.arange(max(0, length - 32), length)
        cos, sin = hf_cos_sin(module, positions[None])
        ours = rope_cos_sin(params, positions, cache=None)
        assert torch.equal(ours.inv_freq, module.inv_freq), length
        assert torch.equal(ours.cos, cos[0]) and torch.equal(ours.sin, sin[0]), length
        assert ours.attention_factor == module.attention_scaling == pytest.approx(1.190238, rel=1e-6)
        if length in anchors:
            assert float(ours.inv_freq[1]) == pytest.approx(anchors[length], rel=1e-6)
    at_zero = rope_cos_sin(params, torch.tensor([0]), cache=None)
    assert float(at_zero.cos[0, 0]) == pytest.approx(1.190238, rel=1e-6)


# ------------------------------------------------------------------------------------------ lengths and the cache
def dynamic_params(max_positions: int = 4096) -> RopeParams:
    return from_explicit(
        {"rope_type": "dynamic", "factor": 2.0, "head_dim": 64, "max_position_embeddings": max_positions}
    )


@pytest.mark.parametrize(
    ("max_position", "seen", "expected"),
    [
        (99, None, 4096),  # below M: the init frequencies
        (4095, None, 4096),
        (4096, None, 4097),  # L = M + 1 grows
        (8191, None, 8192),
        (5999, 8192, 8192),  # M <= L <= cached: kept (hysteresis)
        (4095, 8192, 8192),  # L == M: still kept
        (4094, 8192, 4096),  # L < M: reset
        (9000, 8192, 9001),  # beyond the cache: grows again
        (99, 100, 4096),  # a cached length below M counts as M
    ],
)
def test_dynamic_effective_length(max_position: int, seen: int | None, expected: int) -> None:
    assert effective_length(dynamic_params(), max_position, seen) == expected


def test_effective_length_of_other_types() -> None:
    longrope = from_explicit(
        {
            "rope_type": "longrope",
            "head_dim": 8,
            "short_factor": [1.0] * 4,
            "long_factor": [2.0] * 4,
            "original_max_position_embeddings": 16,
            "max_position_embeddings": 64,
        }
    )
    assert effective_length(longrope, 15) == 16
    assert effective_length(longrope, 16) == 17
    assert effective_length(from_explicit({"head_dim": 8}), 10**6) is None


def test_table_cache_hits_shares_lengths_and_evicts_least_recent() -> None:
    cache = TableCache(max_entries=2)
    params = dynamic_params()
    rope_cos_sin(params, torch.arange(10), cache=cache)
    rope_cos_sin(params, torch.arange(4000), cache=cache)  # L <= M: the same init table
    assert (cache.misses, cache.hits, len(cache)) == (1, 1, 1)
    rope_cos_sin(params, torch.arange(5000), cache=cache)  # grown frequencies: a second table
    other = from_explicit({"head_dim": 64, "rope_theta": 5e5})
    rope_cos_sin(other, torch.arange(10), cache=cache)
    assert len(cache) == 2
    rope_cos_sin(params, torch.arange(10), cache=cache)  # the init table was evicted
    assert cache.misses == 4


def test_cached_rows_equal_direct_computation_and_growth_keeps_them() -> None:
    params = from_explicit(
        {
            "head_dim": 128,
            "rope_theta": 1e6,
            "rope_type": "yarn",
            "factor": 4.0,
            "original_max_position_embeddings": 1024,
            "max_position_embeddings": 4096,
        }
    )
    cache = TableCache()
    small = rope_cos_sin(params, torch.tensor([3, 0, 7]), cache=cache)
    grown = rope_cos_sin(params, torch.tensor([3, 0, 7, 100_000]), cache=cache)
    direct = rope_cos_sin(params, torch.tensor([3, 0, 7, 100_000]), cache=None)
    assert torch.equal(small.cos, grown.cos[:3])
    assert torch.equal(grown.cos, direct.cos) and torch.equal(grown.sin, direct.sin)


def test_shapes_empty_and_multidimensional_positions() -> None:
    params = from_explicit({"head_dim": 16, "rotary_dim": 8})
    empty = rope_cos_sin(params, torch.tensor([], dtype=torch.int64), cache=None)
    assert empty.cos.shape == (0, 8)
    grid = rope_cos_sin(params, torch.arange(6).view(2, 3), pairing="gptj", cache=None)
    flat = rope_cos_sin(params, torch.arange(6), pairing="gptj", cache=None)
    assert grid.cos.shape == (2, 3, 8)
    assert torch.equal(grid.cos.view(6, 8), flat.cos)
