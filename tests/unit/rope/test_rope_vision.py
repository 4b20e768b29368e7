"""ViT 2-D rotary (spec §6): ``vision_cos_sin`` equals the vision rotary modules of Qwen2-VL, Qwen2.5-VL,
Qwen3-VL and GLM-4V for patch ids from ``transformers.vision_utils.get_vision_position_ids`` on random grids,
and the native rotation reproduces ``apply_rotary_pos_emb_vision`` (float32 upcast).
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers.models.glm4v.configuration_glm4v import Glm4vVisionConfig
from transformers.models.glm4v.modeling_glm4v import Glm4vVisionRotaryEmbedding
from transformers.models.qwen2_5_vl.configuration_qwen2_5_vl import Qwen2_5_VLVisionConfig
from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLVisionRotaryEmbedding
from transformers.models.qwen2_vl.configuration_qwen2_vl import Qwen2VLVisionConfig
from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLVisionRotaryEmbedding, apply_rotary_pos_emb_vision
from transformers.models.qwen3_vl.configuration_qwen3_vl import Qwen3VLVisionConfig
from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLVisionRotaryEmbedding
from transformers.vision_utils import get_vision_position_ids

from ropeserve.errors import InvalidInput
from ropeserve.rope import apply_rotary, vision_cos_sin

VISION_TOWERS = {
    # name: (rotary module, its config, head size = hidden // heads)
    "qwen2_vl": (Qwen2VLVisionRotaryEmbedding, Qwen2VLVisionConfig(), 80),
    "qwen2_5_vl": (Qwen2_5_VLVisionRotaryEmbedding, Qwen2_5_VLVisionConfig(hidden_size=1280, num_heads=16), 80),
    "qwen3_vl": (Qwen3VLVisionRotaryEmbedding, Qwen3VLVisionConfig(), 72),
    "glm4v": (Glm4vVisionRotaryEmbedding, Glm4vVisionConfig(), 128),
}


def hf_vision(name: str, hw_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    module_class, config, _ = VISION_TOWERS[name]
    return module_class(config)(torch.zeros(1), hw_ids)


grids = st.lists(st.tuples(st.integers(1, 3), st.integers(1, 6), st.integers(1, 6)), min_size=1, max_size=3).map(
    lambda rows: [(t, 2 * h, 2 * w) for t, h, w in rows]
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(list(VISION_TOWERS)), grid=grids)
def test_random_grids_equal_the_vision_module(name: str, grid: list[tuple[int, int, int]]) -> None:
    hw_ids = get_vision_position_ids(torch.tensor(grid), 2)
    cos, sin = hf_vision(name, hw_ids)
    head_dim = VISION_TOWERS[name][2]
    theta = VISION_TOWERS[name][1].rope_parameters["rope_theta"]
    ours_cos, ours_sin = vision_cos_sin(hw_ids, head_dim, theta)
    assert ours_cos.shape == (hw_ids.shape[0], head_dim)
    assert ours_cos.dtype == torch.float32
    assert torch.equal(ours_cos, cos) and torch.equal(ours_sin, sin)


def test_large_grid_and_custom_theta_equal_the_module() -> None:
    config = Qwen2VLVisionConfig(rope_parameters={"rope_type": "axial", "rope_theta": 5000.0})
    hw_ids = get_vision_position_ids(torch.tensor([[1, 128, 96], [2, 8, 8]]), 2)
    cos, sin = Qwen2VLVisionRotaryEmbedding(config)(torch.zeros(1), hw_ids)
    ours_cos, ours_sin = vision_cos_sin(hw_ids, 80, 5000.0)
    assert torch.equal(ours_cos, cos) and torch.equal(ours_sin, sin)


def test_spec_s8_values_as_sanity_anchors() -> None:
    hw_ids = get_vision_position_ids(torch.tensor([[1, 4, 4]]), 2)
    assert hw_ids[:, 0].tolist() == [0, 0, 1, 1, 0, 0, 1, 1, 2, 2, 3, 3, 2, 2, 3, 3]
    assert hw_ids[:, 1].tolist() == [0, 1, 0, 1, 2, 3, 2, 3, 0, 1, 0, 1, 2, 3, 2, 3]
    cos, _ = vision_cos_sin(hw_ids, 80)
    assert cos.shape == (16, 80)
    token = cos[5]  # h = 0, w = 3
    assert float(token[1]) == 1.0  # slot 1: h·inv1 = 0
    assert float(token[21]) == pytest.approx(math.cos(1.892872), abs=1e-6)  # slot 21: w·inv1
    assert torch.equal(token[:40], token[40:])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_vision_rotation_is_a_float32_rotation(dtype: torch.dtype) -> None:
    """``apply_rotary_pos_emb_vision`` upcasts q/k and cos/sin to float32 and casts back: rotating the upcast
    tensors natively (flash-attn layout [1, N, heads, D]) and casting back gives the same bits."""
    hw_ids = get_vision_position_ids(torch.tensor([[2, 6, 4]]), 2)
    cos, sin = vision_cos_sin(hw_ids, 80)
    generator = torch.Generator().manual_seed(0)
    q = torch.randn(hw_ids.shape[0], 16, 80, generator=generator).to(dtype)
    k = torch.randn(hw_ids.shape[0], 16, 80, generator=generator).to(dtype)
    expected_q, expected_k = apply_rotary_pos_emb_vision(q, k, cos, sin)
    q_out, k_out = apply_rotary(q.float()[None], k.float()[None], cos, sin, head_dim=80, layout="bthd")
    assert k_out is not None
    assert torch.equal(q_out[0].to(dtype), expected_q)
    assert torch.equal(k_out[0].to(dtype), expected_k)


@pytest.mark.parametrize(
    ("head_dim", "theta", "field"), [(78, 1e4, "head_dim"), (0, 1e4, "head_dim"), (80, 0.0, "theta")]
)
def test_invalid_vision_parameters(head_dim: int, theta: float, field: str) -> None:
    with pytest.raises(InvalidInput) as error:
        vision_cos_sin(torch.zeros(1, 2, dtype=torch.long), head_dim, theta)
    assert error.value.field == field
