"""CUDA parity of the compiled Triton kernel and the fused path against the native reference (same device)."""

from __future__ import annotations

import pytest
import torch
from kernel_cases import Case, assert_bitwise_equal, build, parity_cases

from ropeserve.kernels import get_kernel, select_kernel

pytestmark = pytest.mark.gpu


def test_cuda_selects_triton() -> None:
    assert select_kernel("cuda") == "triton"


@pytest.mark.parametrize("inplace", [False, True], ids=["out", "inplace"])
@pytest.mark.parametrize("kernel", ["triton", "fused"])
@pytest.mark.parametrize("case", parity_cases(), ids=Case.id)
def test_kernel_matches_native_on_cuda(case: Case, kernel: str, inplace: bool) -> None:
    problem = build(case, device="cuda")
    expected = get_kernel("native")(problem.q, problem.k, problem.positions, problem.table, problem.spec)
    q, k = problem.q.clone(), None if problem.k is None else problem.k.clone()
    actual = get_kernel(kernel)(q, k, problem.positions, problem.table, problem.spec, inplace=inplace)
    assert_bitwise_equal(actual[0], expected[0])
    assert_bitwise_equal(actual[1], expected[1])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_triton_matches_native_at_serving_size(dtype: torch.dtype) -> None:
    case = Case(dtype=dtype, layout="flat", tokens=8192, q_heads=28, k_heads=4, rope="qwen2vl")
    problem = build(case, device="cuda")
    expected = get_kernel("native")(problem.q, problem.k, problem.positions, problem.table, problem.spec)
    actual = get_kernel("triton")(problem.q, problem.k, problem.positions, problem.table, problem.spec)
    assert_bitwise_equal(actual[0], expected[0])
    assert_bitwise_equal(actual[1], expected[1])
