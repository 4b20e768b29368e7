"""Native rotation ``apply_rotary`` equals transformers' ``apply_rotary_pos_emb`` (spec §4.2–4.4).

Oracles: Llama (NeoX rotate-half), Phi3 and GPT-NeoX (partial rotary), GLM (GPT-J pairs, built from a NeoX cos),
Cohere (GPT-J pairs, float32 only: it upcasts q/k). Layouts bhtd / bthd / flat, GQA head counts, float32 and
bfloat16; plus the algebraic properties every rotation must have.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers.models.cohere.modeling_cohere import apply_rotary_pos_emb as cohere_apply
from transformers.models.glm.modeling_glm import apply_rotary_pos_emb as glm_apply
from transformers.models.gpt_neox.modeling_gpt_neox import apply_rotary_pos_emb as neox_apply
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb as llama_apply
from transformers.models.phi3.modeling_phi3 import apply_rotary_pos_emb as phi3_apply

from ropeserve.config import from_explicit
from ropeserve.errors import InvalidInput
from ropeserve.rope import apply_rotary, rope_cos_sin

HEAD_DIM = 64
HEAD_COUNTS = [(8, 8), (8, 2), (4, 1)]  # MHA, GQA, MQA
DTYPES = [torch.float32, torch.bfloat16]


def tables(positions: torch.Tensor, rotary_dim: int, pairing: str, theta: float = 1e4) -> tuple[torch.Tensor, ...]:
    """float32 cos/sin [*positions.shape, rotary_dim] in ``pairing`` layout."""
    params = from_explicit({"rope_theta": theta, "head_dim": HEAD_DIM, "rotary_dim": rotary_dim})
    result = rope_cos_sin(params, positions, pairing=pairing, cache=None)  # type: ignore[arg-type]
    return result.cos, result.sin


def random_qk(batch: int, heads: tuple[int, int], tokens: int, dtype: torch.dtype, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, heads[0], tokens, HEAD_DIM, generator=generator).to(dtype)
    k = torch.randn(batch, heads[1], tokens, HEAD_DIM, generator=generator).to(dtype)
    return q, k


def to_layout(x: torch.Tensor, layout: str) -> torch.Tensor:
    """From [B, H, T, D] (transformers) to ``layout``; flat is [T, H*D] (batch 1)."""
    if layout == "bhtd":
        return x
    tokens_first = x.transpose(1, 2).contiguous()
    return tokens_first if layout == "bthd" else tokens_first[0].reshape(x.shape[2], -1)


def ours_in_bhtd(q, k, cos, sin, layout: str, pairing: str, batch_cos: bool):
    """Run ``apply_rotary`` in ``layout`` and bring the result back to [B, H, T, D]."""
    cos_arg, sin_arg = (cos, sin) if batch_cos else (cos[0], sin[0])
    q_out, k_out = apply_rotary(
        to_layout(q, layout),
        to_layout(k, layout),
        cos_arg,
        sin_arg,
        head_dim=HEAD_DIM,
        layout=layout,
        pairing=pairing,  # type: ignore[arg-type]
    )
    assert q_out.dtype == q.dtype and k_out is not None
    if layout == "bhtd":
        return q_out, k_out
    if layout == "bthd":
        return q_out.transpose(1, 2), k_out.transpose(1, 2)
    tokens = q.shape[2]
    return (
        q_out.view(tokens, q.shape[1], HEAD_DIM).transpose(0, 1)[None],
        k_out.view(tokens, k.shape[1], HEAD_DIM).transpose(0, 1)[None],
    )


def batches_for(layout: str) -> list[tuple[int, bool]]:
    """(batch, whether cos carries a batch dim): flat is one sequence; others also take per-row positions."""
    return [(1, False)] if layout == "flat" else [(1, False), (3, True)]


LAYOUT_CASES = [(layout, b, bc) for layout in ("bhtd", "bthd", "flat") for b, bc in batches_for(layout)]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("heads", HEAD_COUNTS, ids=str)
@pytest.mark.parametrize(("layout", "batch", "batch_cos"), LAYOUT_CASES)
def test_neox_equals_llama(
    layout: str, batch: int, batch_cos: bool, heads: tuple[int, int], dtype: torch.dtype
) -> None:
    tokens = 11
    positions = torch.randint(0, 40_000, (batch, tokens), generator=torch.Generator().manual_seed(1))
    cos, sin = tables(positions, HEAD_DIM, "neox")
    q, k = random_qk(batch, heads, tokens, dtype)
    expected_q, expected_k = llama_apply(q, k, cos.to(dtype), sin.to(dtype))
    q_out, k_out = ours_in_bhtd(q, k, cos, sin, layout, "neox", batch_cos)
    assert torch.equal(q_out, expected_q)
    assert torch.equal(k_out, expected_k)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("rotary_dim", [HEAD_DIM, 32], ids=["full", "partial"])
@pytest.mark.parametrize(("layout", "batch", "batch_cos"), LAYOUT_CASES)
def test_gptj_equals_glm(layout: str, batch: int, batch_cos: bool, rotary_dim: int, dtype: torch.dtype) -> None:
    """GLM takes a NeoX-layout cos and interleaves it itself; we take the GPT-J layout directly."""
    tokens = 9
    positions = torch.randint(0, 40_000, (batch, tokens), generator=torch.Generator().manual_seed(2))
    neox_cos, neox_sin = tables(positions, rotary_dim, "neox")
    cos, sin = tables(positions, rotary_dim, "gptj")
    q, k = random_qk(batch, (4, 2), tokens, dtype)
    expected_q, expected_k = glm_apply(q, k, neox_cos.to(dtype), neox_sin.to(dtype))
    q_out, k_out = ours_in_bhtd(q, k, cos, sin, layout, "gptj", batch_cos)
    assert torch.equal(q_out, expected_q)
    assert torch.equal(k_out, expected_k)


@pytest.mark.parametrize("oracle", [phi3_apply, neox_apply], ids=["phi3", "gpt_neox"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("rotary_dim", [48, 16])
def test_partial_neox_equals_phi3_and_gpt_neox(rotary_dim: int, dtype: torch.dtype, oracle) -> None:
    positions = torch.arange(100_000, 100_013)[None]
    cos, sin = tables(positions, rotary_dim, "neox")
    q, k = random_qk(1, (6, 2), 13, dtype)
    expected_q, expected_k = oracle(q, k, cos.to(dtype), sin.to(dtype))
    q_out, k_out = apply_rotary(q, k, cos[0], sin[0], head_dim=HEAD_DIM, layout="bhtd", pairing="neox")
    assert torch.equal(q_out, expected_q)
    assert torch.equal(k_out, expected_k)
    assert torch.equal(q_out[..., rotary_dim:], q[..., rotary_dim:])


def test_gptj_equals_cohere_in_float32() -> None:
    positions = torch.arange(0, 7000, 500)[None]
    cos, sin = tables(positions, HEAD_DIM, "gptj")
    q, k = random_qk(1, (4, 4), positions.shape[1], torch.float32)
    expected_q, expected_k = cohere_apply(q, k, cos, sin)
    q_out, k_out = apply_rotary(q, k, cos[0], sin[0], head_dim=HEAD_DIM, pairing="gptj")
    assert torch.equal(q_out, expected_q) and torch.equal(k_out, expected_k)


def test_cohere_bfloat16_rotates_in_float32_unlike_the_native_rule() -> None:
    """Documented difference: Cohere upcasts q/k to float32 for the rotation and casts back; the native
    reference follows Llama/GLM (arithmetic in x's dtype). Upcasting q/k ourselves reproduces Cohere."""
    positions = torch.arange(0, 7000, 500)[None]
    cos, sin = tables(positions, HEAD_DIM, "gptj")
    q, k = random_qk(1, (4, 4), positions.shape[1], torch.bfloat16)
    cos16, sin16 = cos.to(torch.bfloat16), sin.to(torch.bfloat16)
    expected_q, _ = cohere_apply(q, k, cos16, sin16)
    native_q, _ = apply_rotary(q, None, cos16[0], sin16[0], head_dim=HEAD_DIM, pairing="gptj")
    upcast_q, _ = apply_rotary(q.float(), None, cos16[0].float(), sin16[0].float(), head_dim=HEAD_DIM, pairing="gptj")
    assert not torch.equal(native_q, expected_q)
    assert torch.equal(upcast_q.to(torch.bfloat16), expected_q)


def test_gptj_is_neox_conjugated_by_the_channel_permutation() -> None:
    """Spec §8 S2: interleaved pairs == NeoX on channels permuted [x0..x_{d/2-1}, y0..] -> [x0, y0, x1, y1, ...]."""
    positions = torch.arange(0, 3000, 97)
    neox = tables(positions, HEAD_DIM, "neox")
    gptj = tables(positions, HEAD_DIM, "gptj")
    q = torch.randn(1, 2, positions.numel(), HEAD_DIM, generator=torch.Generator().manual_seed(3))
    interleave = torch.stack((torch.arange(HEAD_DIM // 2), torch.arange(HEAD_DIM // 2, HEAD_DIM)), dim=1).flatten()
    neox_out, _ = apply_rotary(q, None, *neox, head_dim=HEAD_DIM, pairing="neox")
    gptj_out, _ = apply_rotary(q[..., interleave], None, *gptj, head_dim=HEAD_DIM, pairing="gptj")
    assert torch.equal(gptj_out, neox_out[..., interleave])


def test_spec_s2_rotate_half_pairs_channel_0_with_4() -> None:
    result = rope_cos_sin(from_explicit({"head_dim": 8}), torch.tensor([1]), cache=None)
    e0 = torch.zeros(1, 1, 1, 8)
    e0[..., 0] = 1.0
    rotated, _ = apply_rotary(e0, None, result.cos, result.sin, head_dim=8)
    assert rotated.flatten().tolist() == pytest.approx([0.540302, 0, 0, 0, 0.841471, 0, 0, 0], abs=1e-6)


# ------------------------------------------------------------------------------------------------------ properties
def rotate_vector(x: torch.Tensor, position: int, pairing: str, rotary_dim: int = HEAD_DIM) -> torch.Tensor:
    cos, sin = tables(torch.tensor([position]), rotary_dim, pairing)
    out, _ = apply_rotary(x.view(1, 1, 1, HEAD_DIM), None, cos, sin, head_dim=HEAD_DIM, pairing=pairing)  # type: ignore[arg-type]
    return out.flatten()


vectors = st.lists(st.floats(-4, 4, allow_nan=False, width=32), min_size=HEAD_DIM, max_size=HEAD_DIM).map(
    lambda values: torch.tensor(values, dtype=torch.float32)
)


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    q=vectors,
    k=vectors,
    p=st.integers(0, 4096),
    r=st.integers(0, 4096),
    shift=st.integers(-4096, 4096),
    pairing=st.sampled_from(["neox", "gptj"]),
)
def test_scores_depend_only_on_the_relative_position(
    q: torch.Tensor, k: torch.Tensor, p: int, r: int, shift: int, pairing: str
) -> None:
    """⟨R(p)q, R(r)k⟩ == ⟨R(p+s)q, R(r+s)k⟩ up to float32 angle rounding (|angle error| ≤ ~1e-3 rad here)."""
    shift = max(shift, -min(p, r))
    score = torch.dot(rotate_vector(q, p, pairing), rotate_vector(k, r, pairing))
    shifted = torch.dot(rotate_vector(q, p + shift, pairing), rotate_vector(k, r + shift, pairing))
    scale = float(q.norm() * k.norm()) + 1e-6
    assert abs(float(score - shifted)) <= 2e-3 * scale


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    x=vectors,
    position=st.integers(0, 1 << 20),
    pairing=st.sampled_from(["neox", "gptj"]),
    rotary_dim=st.sampled_from([HEAD_DIM, 32, 2]),
)
def test_rotation_preserves_norms(x: torch.Tensor, position: int, pairing: str, rotary_dim: int) -> None:
    rotated = rotate_vector(x, position, pairing, rotary_dim)
    assert float(rotated.norm()) == pytest.approx(float(x.norm()), rel=1e-5, abs=1e-5)
    assert torch.equal(rotated[rotary_dim:], x[rotary_dim:])


def test_position_zero_is_the_identity_with_attention_factor_one() -> None:
    x = torch.randn(HEAD_DIM, generator=torch.Generator().manual_seed(4))
    for pairing in ("neox", "gptj"):
        assert torch.equal(rotate_vector(x, 0, pairing), x)


# ---------------------------------------------------------------------------------------------------------- errors
@pytest.mark.parametrize(
    ("q", "k", "cos_shape", "layout", "field"),
    [
        (torch.zeros(1, 2, 3, 64), None, (3, 66), "bhtd", "cos"),  # rotary_dim > head_dim
        (torch.zeros(1, 2, 3, 64), None, (3, 63), "bhtd", "cos"),  # odd
        (torch.zeros(1, 2, 3, 64), None, (4, 64), "bhtd", "cos"),  # tokens mismatch
        (torch.zeros(2, 2, 3, 64), None, (3, 3, 64), "bhtd", "cos"),  # batch mismatch
        (torch.zeros(1, 2, 3, 32), None, (3, 32), "bhtd", "q"),  # head_dim mismatch
        (torch.zeros(3, 130), None, (3, 64), "flat", "q"),  # not a multiple of head_dim
        (torch.zeros(1, 2, 3, 64), torch.zeros(1, 2, 4, 64), (3, 64), "bhtd", "k"),  # k tokens
    ],
)
def test_bad_shapes_name_the_input(q, k, cos_shape, layout: str, field: str) -> None:
    cos = torch.zeros(cos_shape)
    with pytest.raises(InvalidInput) as error:
        apply_rotary(q, k, cos, cos, head_dim=64, layout=layout)  # type: ignore[arg-type]
    assert error.value.field == field


def test_inputs_are_not_modified() -> None:
    q, k = random_qk(1, (2, 2), 5, torch.float32)
    before = q.clone(), k.clone()
    cos, sin = tables(torch.arange(5), HEAD_DIM, "neox")
    apply_rotary(q, k, cos, sin, head_dim=HEAD_DIM)
    assert torch.equal(q, before[0]) and torch.equal(k, before[1])
