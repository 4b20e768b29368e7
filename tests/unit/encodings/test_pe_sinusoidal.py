"""Sinusoidal tables against transformers' implementations (XLM/DistilBERT, Marian, FSMT, Speech2Text, Whisper)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers.models.distilbert.modeling_distilbert import _create_sinusoidal_embeddings
from transformers.models.fsmt.modeling_fsmt import SinusoidalPositionalEmbedding
from transformers.models.marian.modeling_marian import MarianSinusoidalPositionalEmbedding
from transformers.models.speech_to_text.modeling_speech_to_text import Speech2TextSinusoidalPositionalEmbedding
from transformers.models.whisper.modeling_whisper import sinusoids

from ropeserve.encodings import sinusoidal_table
from ropeserve.errors import InvalidInput

DIMS = [1, 2, 3, 5, 8, 17, 64, 129]
T2T_DIMS = [4, 5, 8, 17, 64, 129]
COUNT = 300


def table(count: int, dim: int, **options: object) -> torch.Tensor:
    return sinusoidal_table(torch.arange(count), dim, **options)  # type: ignore[arg-type]


@pytest.mark.parametrize("dim", DIMS)
def test_interleaved_matches_distilbert(dim: int) -> None:
    expected = _create_sinusoidal_embeddings(COUNT, dim, out=torch.empty(COUNT, dim))
    torch.testing.assert_close(table(COUNT, dim), expected, rtol=0, atol=1e-7)


@pytest.mark.parametrize("dim", DIMS)
def test_concat_matches_marian(dim: int) -> None:
    expected = MarianSinusoidalPositionalEmbedding(COUNT, dim).create_weight()
    torch.testing.assert_close(table(COUNT, dim, layout="concat"), expected, rtol=0, atol=1e-7)


@pytest.mark.parametrize("dim", T2T_DIMS)
@pytest.mark.parametrize(
    "reference", [SinusoidalPositionalEmbedding.get_embedding, Speech2TextSinusoidalPositionalEmbedding.get_embedding]
)
def test_tensor2tensor_matches_fairseq_ports(dim: int, reference) -> None:
    expected = reference(COUNT, dim, None)
    assert torch.equal(table(COUNT, dim, layout="concat", schedule="tensor2tensor"), expected)


@pytest.mark.parametrize("dim", [4, 8, 384])
def test_tensor2tensor_matches_whisper(dim: int) -> None:
    assert torch.equal(table(1500, dim, layout="concat", schedule="tensor2tensor"), sinusoids(1500, dim))


def test_paper_formula_entries() -> None:
    dim, base = 6, 500.0
    result = sinusoidal_table(torch.tensor([0, 7, 1234]), dim, base=base, dtype=torch.float64)
    for row, position in enumerate([0, 7, 1234]):
        for i in range(dim // 2):
            angle = position / base ** (2 * i / dim)
            assert result[row, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-12)
            assert result[row, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-12)


def test_odd_dim_ends_with_sin_for_vaswani_and_zero_for_tensor2tensor() -> None:
    positions = torch.arange(1, 9)
    vaswani = sinusoidal_table(positions, 7, dtype=torch.float64)
    expected_last = torch.sin(positions.double() / 10000 ** (6 / 7))
    torch.testing.assert_close(vaswani[:, -1], expected_last)
    for layout in ("interleaved", "concat"):
        t2t = sinusoidal_table(positions, 7, layout=layout, schedule="tensor2tensor")
        assert torch.all(t2t[:, -1] == 0)


def test_layouts_are_column_permutations() -> None:
    dim = 10
    interleaved, concat = table(50, dim), table(50, dim, layout="concat")
    order = list(range(0, dim, 2)) + list(range(1, dim, 2))
    assert torch.equal(interleaved[:, order], concat)


@settings(max_examples=40, deadline=None)
@given(
    dim=st.integers(1, 96),
    count=st.integers(0, 40),
    offset=st.integers(0, 100_000),
    layout=st.sampled_from(["interleaved", "concat"]),
)
def test_offset_continuation_equals_rows_of_the_longer_table(dim: int, count: int, offset: int, layout: str) -> None:
    continued = sinusoidal_table(torch.arange(offset, offset + count), dim, layout=layout)  # type: ignore[arg-type]
    whole = sinusoidal_table(torch.arange(offset + count), dim, layout=layout)  # type: ignore[arg-type]
    assert torch.equal(continued, whole[offset:])
    assert continued.shape == (count, dim)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_dtype_is_a_cast_of_the_float32_table(dtype: torch.dtype) -> None:
    assert torch.equal(table(64, 16, dtype=dtype), table(64, 16).to(dtype))


@pytest.mark.parametrize(
    ("options", "field"),
    [({"dim": 3, "schedule": "tensor2tensor"}, "dim"), ({"dim": 8, "base": 0.0}, "base")],
)
def test_invalid_parameters_name_the_field(options: dict, field: str) -> None:
    with pytest.raises(InvalidInput) as raised:
        sinusoidal_table(torch.arange(4), **options)
    assert raised.value.field == field
