"""M-RoPE cos/sin equal the text rotary modules of Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Qwen3.5 and GLM-4V for random
3-row position ids (spec §5.5), including YaRN + ``mrope_section``, dynamic NTK over the 3 rows, partial rotary
and GLM-4V's pair-interleaved layout; the slot layouts match spec §8 S4 and the modules' own recomposition.
"""

from __future__ import annotations

from itertools import groupby
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rope_oracle import both, hf_cos_sin, hf_rotary, load_fixture, with_rope_scaling

from ropeserve.config import from_explicit
from ropeserve.rope import TableCache, expand_pairing, mrope_cos_sin, rope_cos_sin, slot_axes

SMALL_TEXT = {"hidden_size": 512, "num_attention_heads": 4, "max_position_embeddings": 4096}
CONFIGS: dict[str, dict[str, Any]] = {
    "qwen2_vl": load_fixture("apjanco__es_qwen2_vl_pangea.json"),
    "qwen2_5_vl": load_fixture("Qwen__Qwen2.5-VL-7B-Instruct.json"),
    "qwen2_5_vl yarn": with_rope_scaling(
        "Qwen__Qwen2.5-VL-7B-Instruct.json", "Qwen__Qwen2.5-VL-7B-Instruct.yarn-snippet.json"
    ),
    "qwen2_vl dynamic": {
        "model_type": "qwen2_vl",
        **SMALL_TEXT,
        "rope_scaling": {"type": "dynamic", "factor": 2.0, "mrope_section": [16, 24, 24]},
    },
    "qwen2_5_omni thinker": {
        "model_type": "qwen2_5_omni",
        "thinker_config": {
            "model_type": "qwen2_5_omni_thinker",
            "text_config": {
                "model_type": "qwen2_5_omni_text",
                **SMALL_TEXT,
                "rope_theta": 1e6,
                "rope_scaling": {"mrope_section": [16, 24, 24], "rope_type": "default", "type": "default"},
            },
        },
    },
    "qwen3_vl": load_fixture("Qwen__Qwen3-VL-8B-Instruct.json"),
    "qwen3_vl yarn": {
        "model_type": "qwen3_vl",
        "text_config": {
            "model_type": "qwen3_vl_text",
            **SMALL_TEXT,
            "head_dim": 128,
            "rope_parameters": {
                "rope_type": "yarn",
                "factor": 4.0,
                "rope_theta": 5e6,
                "original_max_position_embeddings": 1024,
                "mrope_section": [24, 20, 20],
                "mrope_interleaved": True,
            },
        },
    },
    "qwen3_5 partial 0.25": load_fixture("Qwen__Qwen3.5-0.8B.json"),
    "glm4v partial 0.5": {
        "model_type": "glm4v",
        "text_config": {
            "model_type": "glm4v_text",
            **SMALL_TEXT,
            "head_dim": 128,
            "partial_rotary_factor": 0.5,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [8, 12, 12]},
        },
    },
}
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
SHARED_TABLES = TableCache()


def assert_matches_module(name: str, position_ids: torch.Tensor, dtype: torch.dtype) -> None:
    normalized, text = both(CONFIGS[name])
    cos, sin = hf_cos_sin(hf_rotary(text), position_ids, dtype)
    for cache in (None, SHARED_TABLES):
        ours = mrope_cos_sin(normalized.params(), position_ids, pairing=normalized.pairing, dtype=dtype, cache=cache)  # type: ignore[arg-type]
        assert ours.cos.shape == cos.shape
        assert torch.equal(ours.cos, cos)
        assert torch.equal(ours.sin, sin)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", list(CONFIGS))
def test_fixed_positions_equal_the_module(name: str, dtype: torch.dtype) -> None:
    generator = torch.Generator().manual_seed(0)
    position_ids = torch.randint(0, 300_000, (3, 2, 7), generator=generator)
    position_ids[:, 0, 0] = 0
    assert_matches_module(name, position_ids, dtype)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    name=st.sampled_from(list(CONFIGS)),
    dtype=st.sampled_from(DTYPES),
    batch=st.integers(1, 3),
    tokens=st.integers(1, 12),
    high=st.sampled_from([16, 4096, 40_000, 1_000_000]),
    data=st.data(),
)
def test_random_three_row_positions_equal_the_module(
    name: str, dtype: torch.dtype, batch: int, tokens: int, high: int, data: st.DataObject
) -> None:
    values = data.draw(st.lists(st.integers(0, high), min_size=3 * batch * tokens, max_size=3 * batch * tokens))
    assert_matches_module(name, torch.tensor(values).view(3, batch, tokens), dtype)


def test_text_tokens_reduce_to_plain_rope() -> None:
    """T = H = W for text: every layout gives the 1-D cos/sin (spec §5.5)."""
    for name in CONFIGS:
        normalized = both(CONFIGS[name])[0]
        params = normalized.params()
        positions = torch.tensor([0, 5, 4095, 4096, 77_777])
        pairing = normalized.pairing
        mrope = mrope_cos_sin(params, positions.expand(3, -1), pairing=pairing, cache=None)  # type: ignore[arg-type]
        plain = rope_cos_sin(params, positions, pairing=pairing, cache=None)  # type: ignore[arg-type]
        assert torch.equal(mrope.cos, plain.cos) and torch.equal(mrope.sin, plain.sin), name


def run_lengths(axes: list[int]) -> str:
    return " ".join(f"{'THW'[axis]}{len(list(run))}" for axis, run in groupby(axes))


@pytest.mark.parametrize(
    ("section", "layout", "slots", "pairing", "expected"),
    [
        ((16, 24, 24), "chunked", 64, "neox", "T16 H24 W24"),
        ((24, 20, 20), "chunked", 64, "neox", "T24 H20 W20"),
        ((24, 20, 20), "interleaved", 64, "neox", " ".join(["T1 H1 W1"] * 20 + ["T4"])),
        ((8, 12, 12), "chunked", 32, "gptj", "T16 H24 W24"),
    ],
)
def test_spec_s4_slot_layouts(section, layout, slots: int, pairing: str, expected: str) -> None:
    """Axis per cos channel; NeoX repeats the slot pattern over the second half (printed once here)."""
    axes = expand_pairing(slot_axes(section, layout, slots), pairing).tolist()  # type: ignore[arg-type]
    if pairing == "neox":
        assert axes[:slots] == axes[slots:]
        axes = axes[:slots]
    assert run_lengths(axes) == expected


def test_spec_s4_interleaved_counts() -> None:
    axes = slot_axes((24, 20, 20), "interleaved", 64)
    assert [int((axes == axis).sum()) for axis in range(3)] == [24, 20, 20]
    assert (axes == 0).nonzero().flatten().tolist() == [*range(0, 60, 3), 60, 61, 62, 63]


@pytest.mark.parametrize("name", ["qwen2_vl", "qwen3_vl", "qwen3_5 partial 0.25", "glm4v partial 0.5"])
def test_slot_axes_equal_the_modules_recomposition(name: str) -> None:
    """Spec §8 S4 recipe: push axis ids through the module's ``recomposition_frequencies``."""
    normalized, text = both(CONFIGS[name])
    params = normalized.params()
    module = hf_rotary(text)
    slots = params.rotary_dim // 2
    axis_ids = torch.arange(3, dtype=torch.float32).view(3, 1, 1, 1).expand(3, 1, 1, slots).clone()
    expected = module.recomposition_frequencies(axis_ids)[0, 0].long()
    ours = expand_pairing(slot_axes(params.mrope_section, params.mrope_layout, slots), normalized.pairing)  # type: ignore[arg-type]
    assert torch.equal(ours, expected)


def test_mrope_needs_sections() -> None:
    with pytest.raises(ValueError, match="mrope_section"):
        mrope_cos_sin(from_explicit({"head_dim": 8}), torch.zeros(3, 1, 2, dtype=torch.long), cache=None)
