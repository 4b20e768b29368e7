"""Triton kernel vs native under ``TRITON_INTERPRET=1`` on CPU tensors.

Not collected by name: ``test_triton_interpreter.py`` runs this file in a subprocess with the variable set,
because Triton reads it when a kernel is defined, and the main test process may have imported Triton already.
"""

from __future__ import annotations

import os

import pytest

if os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("needs TRITON_INTERPRET=1 before Triton is imported", allow_module_level=True)
pytest.importorskip("triton")

from kernel_cases import DTYPES, LAYOUT_SHAPES, ROPES, Case, assert_bitwise_equal, build, parity_cases  # noqa: E402

from ropeserve.kernels import get_kernel  # noqa: E402

LAYOUTS = list(LAYOUT_SHAPES)
COVERING = [
    Case(rope=rope, dtype=dtype, pairing=pairing, layout=LAYOUTS[index % len(LAYOUTS)])
    for index, (rope, dtype, pairing) in enumerate(
        (rope, dtype, pairing) for rope in ROPES for dtype in DTYPES for pairing in ("neox", "gptj")
    )
]
"""Every rope kind × dtype × pairing, cycling through the layouts (the interpreter is slow)."""
EDGES = parity_cases()[len(ROPES) * len(DTYPES) * 2 * len(LAYOUTS) :]


@pytest.mark.parametrize("case", COVERING + EDGES, ids=Case.id)
def test_triton_matches_native(case: Case) -> None:
    problem = build(case)
    expected = get_kernel("native")(problem.q, problem.k, problem.positions, problem.table, problem.spec)
    actual = get_kernel("triton")(problem.q, problem.k, problem.positions, problem.table, problem.spec)
    assert_bitwise_equal(actual[0], expected[0])
    assert_bitwise_equal(actual[1], expected[1])


@pytest.mark.parametrize("case", COVERING[::5] + EDGES[:3], ids=Case.id)
def test_triton_in_place_matches_native(case: Case) -> None:
    problem = build(case)
    expected = get_kernel("native")(problem.q, problem.k, problem.positions, problem.table, problem.spec)
    q, k = problem.q.clone(), None if problem.k is None else problem.k.clone()
    actual = get_kernel("triton")(q, k, problem.positions, problem.table, problem.spec, inplace=True)
    assert actual[0] is q
    assert_bitwise_equal(q, expected[0])
    assert_bitwise_equal(k, expected[1])
