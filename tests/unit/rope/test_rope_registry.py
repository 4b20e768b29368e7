"""The rope-type registry reproduces transformers 5.24 bit for bit (spec §2): for every type, ``inv_freq``
(float32, ``torch.equal``) and the attention factor (Python float, ``==``) equal
``ROPE_INIT_FUNCTIONS[type](config, seq_len=...)``, or the model's own ``compute_default_rope_parameters``
for ``default``, built from the same config dict through transformers' config classes.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rope_oracle import ROTARY_BY_TEXT_MODEL_TYPE, both, load_fixture
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from ropeserve.config import ROPE_TYPE_KEYS, RopeParams, from_explicit
from ropeserve.errors import InvalidInput
from ropeserve.rope import ROPE_TYPES, compute_inv_freq, rotated_width

S1 = {"model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32, "max_position_embeddings": 131072}
"""Spec §8 S1: head_dim 128, M = 131072."""
PHI3_S1 = {"model_type": "phi3", "hidden_size": 3072, "num_attention_heads": 32, "max_position_embeddings": 131072}
"""Spec §8 S1 longrope: head_dim 96 -> 48 frequencies, original 4096 (the Phi3Config default)."""
SHORT_FACTOR = [1 + 0.01 * i for i in range(48)]
LONG_FACTOR = [1 + 0.5 * i for i in range(48)]


def yarn(**keys: Any) -> dict[str, Any]:
    return {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e6, "original_max_position_embeddings": 32768, **keys}


def longrope(**keys: Any) -> dict[str, Any]:
    return {"rope_type": "longrope", "short_factor": SHORT_FACTOR, "long_factor": LONG_FACTOR, **keys}


DEEPSEEK_YARN = {
    "rope_type": "yarn",
    "factor": 40.0,
    "rope_theta": 1e4,
    "original_max_position_embeddings": 4096,
    "mscale": 1.0,
    "mscale_all_dim": 1.0,
}

CASES: dict[str, tuple[dict[str, Any], Any]] = {
    "default llama": ({**S1, "rope_parameters": {"rope_type": "default", "rope_theta": 5e5}}, None),
    "default phi3 partial 0.75": ({**PHI3_S1, "partial_rotary_factor": 0.75}, None),
    "default glm partial 0.5": ({"model_type": "glm", "hidden_size": 512, "num_attention_heads": 4}, None),
    "default gpt_neox rotary_pct": (
        {"model_type": "gpt_neox", "hidden_size": 512, "num_attention_heads": 4, "rotary_pct": 0.25},
        None,
    ),
    "default qwen3.5 partial 0.25": (load_fixture("Qwen__Qwen3.5-0.8B.json"), None),
    "linear": ({**S1, "rope_parameters": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1e4}}, None),
    "linear partial 0.5": (
        {**S1, "rope_parameters": {"rope_type": "linear", "factor": 4.0, "partial_rotary_factor": 0.5}},
        None,
    ),
    "dynamic at init": ({**S1, "rope_parameters": {"rope_type": "dynamic", "factor": 2.0}}, None),
    "dynamic below M": ({**S1, "rope_parameters": {"rope_type": "dynamic", "factor": 2.0}}, 100),
    "dynamic at M": ({**S1, "rope_parameters": {"rope_type": "dynamic", "factor": 2.0}}, 131072),
    "dynamic beyond M": ({**S1, "rope_parameters": {"rope_type": "dynamic", "factor": 2.0}}, 262144),
    "dynamic beyond M, odd": (
        {**S1, "max_position_embeddings": 1000, "rope_parameters": {"rope_type": "dynamic", "factor": 1.7}},
        5007,
    ),
    "dynamic partial": (
        {**S1, "rope_parameters": {"rope_type": "dynamic", "factor": 3.0, "partial_rotary_factor": 0.5}},
        300000,
    ),
    "yarn": ({**S1, "rope_parameters": yarn()}, None),
    "yarn truncate false": ({**S1, "rope_parameters": yarn(truncate=False)}, None),
    "yarn mscale + mscale_all_dim (DeepSeek)": (
        {**S1, "max_position_embeddings": 163840, "rope_parameters": DEEPSEEK_YARN},
        None,
    ),
    "yarn mscale_all_dim 0.707": (
        {**S1, "max_position_embeddings": 163840, "rope_parameters": {**DEEPSEEK_YARN, "mscale_all_dim": 0.707}},
        None,
    ),
    "yarn mscale alone is ignored": ({**S1, "rope_parameters": yarn(mscale=0.5)}, None),
    "yarn explicit attention_factor": ({**S1, "rope_parameters": yarn(attention_factor=0.75)}, None),
    "yarn factor null": ({**S1, "rope_parameters": yarn(factor=None)}, None),
    "yarn beta_fast 0 means 32": ({**S1, "rope_parameters": yarn(beta_fast=0, beta_slow=None)}, None),
    "yarn low == high": ({**S1, "rope_parameters": yarn(beta_fast=4, beta_slow=4, truncate=False)}, None),
    "yarn custom betas": ({**S1, "rope_parameters": yarn(beta_fast=64, beta_slow=2)}, None),
    "yarn factor <= 1": ({**S1, "rope_parameters": yarn(factor=1.0)}, None),
    "yarn partial 0.5": ({**S1, "rope_parameters": yarn(partial_rotary_factor=0.5)}, None),
    "longrope short (init)": ({**PHI3_S1, "rope_scaling": longrope()}, None),
    "longrope short at original": ({**PHI3_S1, "rope_scaling": longrope()}, 4096),
    "longrope long": ({**PHI3_S1, "rope_scaling": longrope()}, 4097),
    "longrope explicit factor": ({**PHI3_S1, "rope_scaling": longrope(factor=8.0)}, 4097),
    "longrope explicit attention_factor": ({**PHI3_S1, "rope_scaling": longrope(attention_factor=1.5)}, None),
    "longrope factor <= 1": ({**PHI3_S1, "max_position_embeddings": 4096, "rope_scaling": longrope()}, None),
    "longrope Phi-4-mini partial 0.75": (load_fixture("microsoft__Phi-4-mini-instruct.json"), 200000),
    "llama3 (Llama-3.1)": (load_fixture("meta-llama__Llama-3.1-8B-Instruct.json"), None),
    "llama3 factor 32 (Llama-3.2)": (load_fixture("meta-llama__Llama-3.2-3B-Instruct.json"), None),
    "llama3 partial 0.5": (
        {
            **S1,
            "rope_parameters": {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192,
                "partial_rotary_factor": 0.5,
                "rope_theta": 5e5,
            },
        },
        None,
    ),
    "proportional": (
        {**S1, "rope_parameters": {"rope_type": "proportional", "rope_theta": 1e6, "partial_rotary_factor": 0.25}},
        None,
    ),
    "proportional factor 2": (
        {
            **S1,
            "rope_parameters": {
                "rope_type": "proportional",
                "rope_theta": 1e6,
                "partial_rotary_factor": 0.5,
                "factor": 2.0,
            },
        },
        None,
    ),
    "proportional, odd int(head_dim * prf)": (
        {**S1, "rope_parameters": {"rope_type": "proportional", "rope_theta": 1e6, "partial_rotary_factor": 0.2}},
        None,
    ),
    "proportional full": ({**S1, "rope_parameters": {"rope_type": "proportional", "rope_theta": 1e4}}, None),
}


def hf_init(text: Any, seq_len: int | None) -> tuple[torch.Tensor, float]:
    """What the model's rotary module holds when ``max(position_ids) + 1 == seq_len`` (``None``: at init).

    ``default`` is the model's own static method; every other type the registry function. For ``dynamic`` the
    module (``dynamic_rope_update``) recomputes only above M, passing ``seq_len`` as an int64 tensor; at or
    below M it holds the init values.
    """
    rope_type = text.rope_parameters["rope_type"]
    if rope_type == "default":
        return ROTARY_BY_TEXT_MODEL_TYPE[text.model_type].compute_default_rope_parameters(text)
    if rope_type == "dynamic":
        grown = seq_len is not None and seq_len > text.max_position_embeddings
        return ROPE_INIT_FUNCTIONS[rope_type](text, None, seq_len=torch.tensor(seq_len) if grown else None)
    return ROPE_INIT_FUNCTIONS[rope_type](text, None, seq_len=seq_len)


@pytest.mark.parametrize("case", list(CASES))
def test_inv_freq_and_attention_factor_are_bit_exact(case: str) -> None:
    config, seq_len = CASES[case]
    normalized, text = both(config)
    expected_inv_freq, expected_attention = hf_init(text, seq_len)
    inv_freq, attention_factor = compute_inv_freq(normalized.params(), seq_len)
    assert inv_freq.dtype == torch.float32
    assert torch.equal(inv_freq, expected_inv_freq)
    assert attention_factor == expected_attention


def test_registry_keys_equal_the_schema_keys_and_cover_transformers() -> None:
    assert set(ROPE_TYPES) == set(ROPE_TYPE_KEYS)
    from_transformers = {name for name, rope_type in ROPE_TYPES.items() if rope_type.reference == "transformers 5.24"}
    assert from_transformers == {*ROPE_INIT_FUNCTIONS, "default"}
    assert set(ROPE_TYPES) - from_transformers == {"ntk"}  # vLLM's, with its own parity test


S1_ANCHORS: dict[str, tuple[list[float], float]] = {
    # spec §8 S1: inv_freq[i] for i = 0, 1, 16, 32, 48, 63, and the attention factor
    "default llama": ([1.0, 0.81461722, 0.03760603, 1.4142134e-03, 5.3182957e-05, 2.4551407e-06], 1.0),
    "linear": ([0.25, 0.21649109, 0.025, 2.4999999e-03, 2.5000001e-04, 2.8869548e-05], 1.0),
    "llama3 (Llama-3.1)": ([1.0, 0.81461722, 0.03760603, 5.2484602e-04, 6.6478697e-06, 3.0689259e-07], 1.0),
    "yarn": ([1.0, 0.80584222, 0.03162278, 6.0294115e-04, 7.9056936e-06, 3.1023444e-07], 1.138629436111989),
    "yarn mscale + mscale_all_dim (DeepSeek)": (
        [1.0, 0.86596435, 0.1, 5.5000004e-03, 2.4999999e-05, 2.8869547e-06],
        1.0,
    ),
    "dynamic beyond M": ([1.0, 0.85099429, 0.07565303, 5.7233819e-03, 4.3299119e-04, 3.8492733e-05], 1.0),
}
S1_INDICES = [0, 1, 16, 32, 48, 63]


@pytest.mark.parametrize("case", list(S1_ANCHORS))
def test_spec_s1_values_as_sanity_anchors(case: str) -> None:
    """The §8 S1 printed values (8 significant digits), next to the live comparison above."""
    config, seq_len = CASES[case]
    if case == "dynamic beyond M":  # S1 prints dynamic with θ=1e4, f=2, M=4096 at seq_len 8192
        config, seq_len = (
            {**S1, "max_position_embeddings": 4096, "rope_parameters": {"rope_type": "dynamic", "factor": 2.0}},
            8192,
        )
    normalized, _ = both(config)
    inv_freq, attention_factor = compute_inv_freq(normalized.params(), seq_len)
    values, attention = S1_ANCHORS[case]
    assert inv_freq[S1_INDICES].tolist() == pytest.approx(values, rel=2e-7)
    assert attention_factor == pytest.approx(attention, rel=1e-12)


def test_spec_s1_yarn_truncate_false_changes_only_index_32_of_the_printed_ones() -> None:
    truncated, _ = compute_inv_freq(both(CASES["yarn"][0])[0].params(), None)
    untruncated, _ = compute_inv_freq(both(CASES["yarn truncate false"][0])[0].params(), None)
    changed = truncated[S1_INDICES] != untruncated[S1_INDICES]
    assert [index for index, differs in zip(S1_INDICES, changed.tolist(), strict=True) if differs] == [32]
    assert float(untruncated[32]) == pytest.approx(6.0740800e-04, rel=2e-7)


def test_spec_s1_longrope_values() -> None:
    params = both(CASES["longrope short (init)"][0])[0].params()
    short, attention = compute_inv_freq(params, None)
    long, long_attention = compute_inv_freq(params, 4097)
    assert short[[0, 1, 16, 32]].tolist() == pytest.approx([1.0, 0.81723183, 0.04001369, 1.6321471e-03], rel=2e-7)
    assert long[[0, 1, 16, 32]].tolist() == pytest.approx([1.0, 0.55026942, 5.1573203e-03, 1.2673142e-04], rel=2e-7)
    assert attention == long_attention == pytest.approx(1.1902380714238083, rel=1e-15)


def test_proportional_keeps_the_full_head_with_a_zero_tail() -> None:
    params = both(CASES["proportional"][0])[0].params()
    inv_freq, _ = compute_inv_freq(params, None)
    assert inv_freq.shape == (64,)
    assert int((inv_freq != 0).sum()) == 16
    assert inv_freq[:3].tolist() == pytest.approx([1.0, 0.80584222, 0.64938164], rel=2e-7)
    assert rotated_width(params) == 128
    assert rotated_width(from_explicit({"rope_theta": 1e4, "head_dim": 128, "rotary_dim": 32})) == 32


def test_llama_default_ignores_partial_rotary_but_we_honour_it() -> None:
    """Documented quirk (spec §2.1, §7.4): the Llama-family default (also Qwen2/3, Qwen2-VL, Gemma-3, Cohere)
    always uses the full head and ignores ``partial_rotary_factor``; the partial-rotary models (Phi3, GLM,
    GPT-NeoX, GLM-4V, Qwen3.5) honour it. We honour it for every model type, so a Llama config carrying a
    factor gets the Phi3/GLM/NeoX result (checked bit-exact above), not Llama's full-width one."""
    config = {**S1, "rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5}}
    normalized, text = both(config)
    llama_inv_freq, _ = hf_init(text, None)
    ours, _ = compute_inv_freq(normalized.params(), None)
    assert llama_inv_freq.shape == (64,)
    assert ours.shape == (32,)
    phi3_text = both({**PHI3_S1, "hidden_size": 4096, "partial_rotary_factor": 0.5})[1]
    assert torch.equal(ours, hf_init(phi3_text, None)[0])


def test_dynamic_follows_the_run_time_float32_path_not_the_int_path() -> None:
    """At run time ``dynamic_rope_update`` passes ``seq_len`` as an int64 tensor, so transformers evaluates the
    scaled base in float32; called with a Python int it would use float64. The module only ever uses the tensor
    path above M, and that is the one we reproduce (for M=1000, f=1.7, L=5007 the two differ)."""
    config, seq_len = CASES["dynamic beyond M, odd"]
    normalized, text = both(config)
    ours, _ = compute_inv_freq(normalized.params(), seq_len)
    tensor_path, _ = ROPE_INIT_FUNCTIONS["dynamic"](text, None, seq_len=torch.tensor(seq_len))
    int_path, _ = ROPE_INIT_FUNCTIONS["dynamic"](text, None, seq_len=seq_len)
    assert torch.equal(ours, tensor_path)
    assert not torch.equal(ours, int_path)


def test_dynamic_at_or_below_m_holds_the_init_values_like_the_module() -> None:
    """Called directly with a tensor ``seq_len <= M`` the registry function evaluates ``f·M/M − (f − 1)`` in
    float32, which need not be exactly 1 (here θ' ≠ θ). The module never does that: below M it keeps (or
    restores) ``original_inv_freq`` from init. We return the init values, as the module does."""
    config = {
        "model_type": "llama",
        "hidden_size": 32,
        "num_attention_heads": 4,
        "max_position_embeddings": 64222,
        "rope_parameters": {"rope_type": "dynamic", "factor": 2.3703486068281876, "rope_theta": 100.0},
    }
    normalized, text = both(config)
    module = ROTARY_BY_TEXT_MODEL_TYPE["llama"](text)
    module(torch.zeros(1), torch.arange(33993)[None])
    ours, _ = compute_inv_freq(normalized.params(), 33993)
    direct_tensor_call, _ = ROPE_INIT_FUNCTIONS["dynamic"](text, None, seq_len=torch.tensor(33993))
    assert torch.equal(ours, module.inv_freq)
    assert not torch.equal(ours, direct_tensor_call)


ROPE_TYPE_STRATEGIES = {
    "default": st.fixed_dictionaries({}),
    "linear": st.fixed_dictionaries({"factor": st.floats(1.0, 64.0)}),
    "dynamic": st.fixed_dictionaries({"factor": st.floats(1.0, 16.0)}),
    "yarn": st.fixed_dictionaries(
        {
            "factor": st.floats(1.0, 64.0),
            "original_max_position_embeddings": st.integers(256, 65536),
            "beta_fast": st.sampled_from([None, 8, 32, 64.0]),
            "beta_slow": st.sampled_from([None, 1, 2.0]),
            "truncate": st.booleans(),
            "mscale": st.sampled_from([None, 0.707, 1.0]),
            "mscale_all_dim": st.sampled_from([None, 0.707, 1.0]),
        }
    ),
    "llama3": st.fixed_dictionaries(
        {
            "factor": st.floats(1.0, 64.0),
            "low_freq_factor": st.sampled_from([1.0, 2.0]),
            "high_freq_factor": st.sampled_from([4.0, 8.0]),
            "original_max_position_embeddings": st.sampled_from([2048, 8192, 32768]),
        }
    ),
    "proportional": st.fixed_dictionaries(
        {"factor": st.sampled_from([1.0, 2.0, 8.0]), "partial_rotary_factor": st.sampled_from([0.2, 0.25, 0.5, 1.0])}
    ),
}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    rope_type=st.sampled_from(sorted(ROPE_TYPE_STRATEGIES)),
    theta=st.floats(100.0, 1e7),
    half_head=st.integers(4, 128),
    max_positions=st.integers(512, 262144),
    seq_len=st.integers(1, 1 << 20),
    data=st.data(),
)
def test_random_parameters_match_transformers(
    rope_type: str, theta: float, half_head: int, max_positions: int, seq_len: int, data: st.DataObject
) -> None:
    keys = {k: v for k, v in data.draw(ROPE_TYPE_STRATEGIES[rope_type]).items() if v is not None}
    head_dim = 2 * half_head
    config = {
        "model_type": "llama",
        "hidden_size": head_dim * 4,
        "num_attention_heads": 4,
        "max_position_embeddings": max_positions,
        "rope_parameters": {"rope_type": rope_type, "rope_theta": theta, **keys},
    }
    length = seq_len if rope_type == "dynamic" else None
    normalized, text = both(config)
    expected_inv_freq, expected_attention = hf_init(text, length)
    inv_freq, attention_factor = compute_inv_freq(normalized.params(), length)
    assert torch.equal(inv_freq, expected_inv_freq)
    assert attention_factor == expected_attention


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    theta=st.floats(100.0, 1e7),
    half_rotary=st.integers(4, 64),
    original=st.integers(256, 16384),
    scale=st.floats(0.5, 64.0),
    seq_len=st.integers(1, 1 << 20),
    data=st.data(),
)
def test_random_longrope_matches_transformers(
    theta: float, half_rotary: int, original: int, scale: float, seq_len: int, data: st.DataObject
) -> None:
    factors = st.lists(st.floats(0.5, 64.0), min_size=half_rotary, max_size=half_rotary)
    config = {
        "model_type": "phi3",
        "hidden_size": 2 * half_rotary * 4,
        "num_attention_heads": 4,
        "max_position_embeddings": max(1, int(original * scale)),
        "original_max_position_embeddings": original,
        "rope_theta": theta,
        "rope_scaling": {
            "rope_type": "longrope",
            "short_factor": data.draw(factors),
            "long_factor": data.draw(factors),
        },
    }
    normalized, text = both(config)
    expected_inv_freq, expected_attention = hf_init(text, seq_len)
    inv_freq, attention_factor = compute_inv_freq(normalized.params(), seq_len)
    assert torch.equal(inv_freq, expected_inv_freq)
    assert attention_factor == expected_attention


@pytest.mark.parametrize(
    "params",
    [
        RopeParams("yarn", 1.0, 8, factor=4.0, original_max_position_embeddings=16),  # ln(theta) = 0
        RopeParams("yarn", 1e4, 8, factor=4.0, original_max_position_embeddings=16, attention_factor=math.inf),
        RopeParams("dynamic", 1e4, 2, factor=2.0, max_position_embeddings=16),  # dim / (dim - 2)
        RopeParams(
            "llama3", 1e4, 8, factor=8.0, original_max_position_embeddings=16, low_freq_factor=0.0, high_freq_factor=4.0
        ),
    ],
    ids=["yarn theta 1", "infinite attention factor", "dynamic rotary 2", "llama3 low_freq_factor 0"],
)
def test_parameters_outside_a_formula_domain_are_invalid_input(params: RopeParams) -> None:
    """The guard behind validate_params: unvalidated parameters never raise a bare arithmetic error or return
    a non-finite table."""
    with pytest.raises(InvalidInput, match="leave the formula's domain") as error:
        compute_inv_freq(params)
    assert error.value.field == "rope_parameters"
