"""ALiBi slopes and biases against BLOOM, Falcon and MPT (transformers 5.24)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers.models.bloom.modeling_bloom import build_alibi_tensor as bloom_alibi
from transformers.models.falcon.modeling_falcon import build_alibi_tensor as falcon_alibi
from transformers.models.mpt.modeling_mpt import build_mpt_alibi_tensor

from ropeserve.encodings import alibi_bias, alibi_slopes, closest_power_of_two
from ropeserve.errors import InvalidInput

HEADS = sorted({*range(1, 17), 12, 20, 32, 40, 96})


def bloom_slopes(num_heads: int) -> torch.Tensor:
    """BLOOM's alibi at key position 1 with an all-ones mask is exactly one slope per head."""
    return bloom_alibi(torch.ones(1, 2, dtype=torch.int64), num_heads, torch.float32)[:, 0, 1]


@pytest.mark.parametrize("num_heads", HEADS)
def test_slopes_equal_bloom(num_heads: int) -> None:
    assert torch.equal(alibi_slopes(num_heads), bloom_slopes(num_heads))


@pytest.mark.parametrize("num_heads", HEADS)
def test_slopes_match_paper_sequence(num_heads: int) -> None:
    power = closest_power_of_two(num_heads)
    expected = [2 ** (-8 * k / power) for k in range(1, power + 1)]
    expected += [2 ** (-8 * k / (2 * power)) for k in range(1, 2 * (num_heads - power), 2)]
    torch.testing.assert_close(alibi_slopes(num_heads).double(), torch.tensor(expected, dtype=torch.float64))


@pytest.mark.parametrize("num_heads", HEADS)
def test_causal_bias_of_last_query_matches_mpt(num_heads: int) -> None:
    keys = 37
    expected = build_mpt_alibi_tensor(num_heads, keys)  # [H, 1, Tk] = slope · (j - (Tk - 1))
    ours = alibi_bias(alibi_slopes(num_heads), 1, keys, offset=keys - 1)
    torch.testing.assert_close(ours, expected, rtol=2e-6, atol=0)


@pytest.mark.parametrize("num_heads", [1, 5, 12, 40])
def test_causal_rows_differ_from_bloom_by_a_softmax_invariant_constant(num_heads: int) -> None:
    queries = keys = 19
    slopes = alibi_slopes(num_heads)
    bloom = bloom_alibi(torch.ones(1, keys, dtype=torch.int64), num_heads, torch.float32)  # slope · j
    ours = alibi_bias(slopes, queries, keys)
    row_shift = slopes[:, None, None] * torch.arange(queries, dtype=torch.float32)[None, :, None]
    torch.testing.assert_close(ours + row_shift, bloom.expand(num_heads, queries, keys))
    scores = torch.randn(num_heads, queries, keys)
    torch.testing.assert_close(torch.softmax(scores + ours, -1), torch.softmax(scores + bloom, -1))


@pytest.mark.parametrize("num_heads", [3, 8, 20])
def test_bfloat16_bias_is_close_to_falcon(num_heads: int) -> None:
    keys = 64
    falcon = falcon_alibi(torch.ones(1, keys, dtype=torch.int64), num_heads, torch.bfloat16)[:, 0, :]
    ours = alibi_bias(alibi_slopes(num_heads), 1, keys, offset=0, dtype=torch.bfloat16)[:, 0, :]
    torch.testing.assert_close(ours.float(), falcon.float(), rtol=1e-2, atol=1e-3)


@settings(max_examples=40, deadline=None)
@given(
    num_heads=st.integers(1, 48),
    query_len=st.integers(1, 12),
    key_len=st.integers(1, 12),
    offset=st.integers(0, 50),
    symmetric=st.booleans(),
)
def test_bias_formula(num_heads: int, query_len: int, key_len: int, offset: int, symmetric: bool) -> None:
    slopes = alibi_slopes(num_heads)
    mode = "symmetric" if symmetric else "causal"
    bias = alibi_bias(slopes, query_len, key_len, mode=mode, offset=offset)
    assert bias.shape == (num_heads, query_len, key_len) and bias.dtype == torch.float32
    h, q, k = num_heads - 1, query_len - 1, key_len // 2
    distance = k - (offset + q)
    expected = -abs(distance) if symmetric else distance
    assert bias[h, q, k].item() == pytest.approx(slopes[h].item() * expected, rel=1e-6)
    if symmetric:
        assert torch.all(bias <= 0)


def test_slopes_scale_with_max_bias() -> None:
    torch.testing.assert_close(alibi_slopes(8, max_bias=16.0), alibi_slopes(8) ** 2)
    assert math.isclose(alibi_slopes(1, max_bias=4.0).item(), 2**-4)


@pytest.mark.parametrize(
    ("options", "field"), [({"num_heads": 0}, "num_heads"), ({"num_heads": 4, "max_bias": 0}, "max_bias")]
)
def test_invalid_parameters_name_the_field(options: dict, field: str) -> None:
    with pytest.raises(InvalidInput) as raised:
        alibi_slopes(**options)
    assert raised.value.field == field
