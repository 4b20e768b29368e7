"""Native kernel vs the rope/ reference, and the CPU kernels (fused torch ops, one-pass C) vs native: bit for bit."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from kernel_cases import (
    CACHE,
    DTYPES,
    LAYOUT_SHAPES,
    ROPES,
    Case,
    Problem,
    assert_batch_matches_native,
    assert_bitwise_equal,
    build,
    parity_cases,
)

from ropeserve.config import from_explicit
from ropeserve.kernels import RotationSpec, compiled, fused, get_kernel
from ropeserve.rope import apply_rotary, mrope_cos_sin, rope_cos_sin

CASES = parity_cases()
CPU_KERNELS = ["fused", "c"]


@pytest.fixture(params=CPU_KERNELS)
def cpu_kernel(request: pytest.FixtureRequest) -> str:
    """A CPU kernel under test; the C kernel must really be built here, not fall back to the fused one."""
    if request.param == "c":
        assert compiled.available(), "the C kernel did not build (is a C compiler installed?)"
    return request.param


def reference(problem: Problem, case: Case) -> tuple[torch.Tensor, torch.Tensor | None]:
    """rope/'s own path: ``rope_cos_sin`` / ``mrope_cos_sin`` (no cache) then ``apply_rotary``."""
    params = from_explicit(ROPES[case.rope])
    cos_sin = mrope_cos_sin if problem.spec.mrope else rope_cos_sin
    cs = cos_sin(params, problem.positions, pairing=case.pairing, dtype=case.dtype, cache=None)
    return apply_rotary(
        problem.q, problem.k, cs.cos, cs.sin, head_dim=problem.spec.head_dim, layout=case.layout, pairing=case.pairing
    )


@pytest.mark.parametrize("case", CASES, ids=Case.id)
def test_native_kernel_matches_rope_reference(case: Case) -> None:
    problem = build(case)
    q_out, k_out = get_kernel("native")(problem.q, problem.k, problem.positions, problem.table, problem.spec)
    q_ref, k_ref = reference(problem, case)
    assert_bitwise_equal(q_out, q_ref)
    assert_bitwise_equal(k_out, k_ref)


@pytest.mark.parametrize("inplace", [False, True], ids=["out", "inplace"])
@pytest.mark.parametrize("case", CASES, ids=Case.id)
def test_cpu_kernel_matches_native(case: Case, inplace: bool, cpu_kernel: str) -> None:
    problem = build(case)
    expected = get_kernel("native")(problem.q, problem.k, problem.positions, problem.table, problem.spec)
    q_in, k_in = problem.q.clone(), None if problem.k is None else problem.k.clone()
    q_out, k_out = get_kernel(cpu_kernel)(q_in, k_in, problem.positions, problem.table, problem.spec, inplace=inplace)
    assert_bitwise_equal(q_out, expected[0])
    assert_bitwise_equal(k_out, expected[1])
    assert (q_out is q_in) == inplace
    if not inplace:
        assert_bitwise_equal(q_in, problem.q)


@pytest.mark.parametrize("layout", list(LAYOUT_SHAPES))
def test_cpu_kernels_cross_chunk_boundaries(layout: str, cpu_kernel: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fused, "GRAIN_ELEMENTS", 3 * 64 * 5)  # chunks of 5 tokens × 3 heads × 64 channels
    monkeypatch.setattr(compiled, "PIECE_BYTES", 3 * 64 * 4 * 5)  # C calls of 5 float32 rows
    problem = build(Case(layout=layout, tokens=23, q_heads=3, k_heads=1, rope="partial"))
    expected = get_kernel("native")(problem.q, problem.k, problem.positions, problem.table, problem.spec)
    actual = get_kernel(cpu_kernel)(problem.q, problem.k, problem.positions, problem.table, problem.spec)
    assert_bitwise_equal(actual[0], expected[0])
    assert_bitwise_equal(actual[1], expected[1])


@st.composite
def random_problems(draw: st.DrawFn) -> tuple[Problem, bool]:
    head_dim = 2 * draw(st.integers(1, 40))
    rotary_dim = 2 * draw(st.integers(1, head_dim // 2))
    params = from_explicit(
        {"rope_theta": draw(st.sampled_from([1e4, 5e5])), "head_dim": head_dim, "rotary_dim": rotary_dim}
    )
    layout = draw(st.sampled_from(sorted(LAYOUT_SHAPES)))
    batch = 1 if layout == "flat" else draw(st.integers(1, 3))
    tokens, q_heads, k_heads = draw(st.integers(0, 40)), draw(st.integers(1, 5)), draw(st.integers(0, 3))
    dtype = draw(st.sampled_from(DTYPES))
    generator = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    shape = LAYOUT_SHAPES[layout]

    def tensor(heads: int) -> torch.Tensor:
        return torch.randn(shape(batch, heads, tokens, head_dim), generator=generator).to(dtype)

    positions = torch.randint(0, 5000, (batch, tokens), generator=generator)
    spec = RotationSpec(head_dim, layout, draw(st.sampled_from(["neox", "gptj"])))
    table = CACHE.get(params, None, torch.device("cpu"))
    problem = Problem(tensor(q_heads), tensor(k_heads) if k_heads else None, positions, table, spec)
    return problem, draw(st.booleans())


@settings(max_examples=60, deadline=None)
@given(random_problems())
def test_cpu_kernels_match_native_on_random_shapes(drawn: tuple[Problem, bool]) -> None:
    problem, inplace = drawn
    expected = get_kernel("native")(problem.q, problem.k, problem.positions, problem.table, problem.spec)
    for name in CPU_KERNELS:
        q, k = problem.q.clone(), None if problem.k is None else problem.k.clone()
        actual = get_kernel(name)(q, k, problem.positions, problem.table, problem.spec, inplace=inplace)
        assert_bitwise_equal(actual[0], expected[0])
        assert_bitwise_equal(actual[1], expected[1])


def test_mrope_with_equal_rows_is_plain_rope() -> None:
    """A text token has T = H = W: every slot layout reduces to 1-D RoPE (spec §5.5)."""
    problem = build(Case(rope="qwen3vl", tokens=9))
    one_row = problem.positions[0]
    three_rows = one_row.expand(3, *one_row.shape)
    plain = RotationSpec(problem.spec.head_dim, problem.spec.layout, problem.spec.pairing)
    for name in ("native", *CPU_KERNELS):
        rotated = get_kernel(name)(problem.q, problem.k, three_rows, problem.table, problem.spec)
        expected = get_kernel(name)(problem.q, problem.k, one_row, problem.table, plain)
        assert_bitwise_equal(rotated[0], expected[0])


SPECIAL_VALUES = [0.0, -0.0, 1.0, -2.5, float("inf"), float("-inf"), float("nan"), 1e-40, -1e-45, 3e38, 65504.0, 6e-8]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("pairing", ["neox", "gptj"])
def test_cpu_kernels_match_native_bit_for_bit_on_special_values(
    dtype: torch.dtype, pairing: str, cpu_kernel: str
) -> None:
    """Signed zeros, infinities, NaN, subnormals and overflowing products: same bits as the eager formula
    (NaN only needs to land in the same places; its payload bits are not specified)."""
    generator = torch.Generator().manual_seed(3)
    values = torch.tensor(SPECIAL_VALUES)
    picks = torch.randint(0, len(SPECIAL_VALUES), (2, 3, 40, 16), generator=generator)
    q = values[picks].to(dtype)
    positions = torch.randint(0, 70_000, (2, 40), generator=generator)
    table = CACHE.get(from_explicit({"rope_theta": 10_000.0, "head_dim": 16}), None, torch.device("cpu"))
    spec = RotationSpec(16, "bhtd", pairing)
    expected = get_kernel("native")(q, None, positions, table, spec)[0]
    actual = get_kernel(cpu_kernel)(q.clone(), None, positions, table, spec, inplace=True)[0]
    assert torch.equal(actual.isnan(), expected.isnan())
    bits = torch.int32 if dtype == torch.float32 else torch.int16
    finite_or_inf = ~expected.isnan()
    assert torch.equal(actual.view(bits)[finite_or_inf], expected.view(bits)[finite_or_inf])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_c_batch_entry_point_matches_native_per_request(dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch) -> None:
    """Several requests (mixed layouts, with and without k) rotated in place by one ``rotate_compiled_many``."""
    assert compiled.available()
    monkeypatch.setattr(compiled, "PIECE_BYTES", 256)  # many pieces, interleaved across requests
    cases = [Case(layout="bhtd", dtype=dtype), Case(layout="flat", dtype=dtype, tokens=11, k_heads=0)]
    cases.append(Case(layout="bthd", dtype=dtype, batch=3, tokens=2))
    problems = [build(case, seed=seed) for seed, case in enumerate(cases)]
    assert_batch_matches_native(compiled.rotate_compiled_many, problems)


def test_c_batch_entry_point_falls_back_per_request_without_the_library(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compiled, "c_function", lambda dtype: None)
    problems = [build(Case(rope="partial", tokens=tokens), seed=tokens) for tokens in (3, 8)]
    assert_batch_matches_native(compiled.rotate_compiled_many, problems)
