"""Triton kernel vs native under ``TRITON_INTERPRET=1`` on CPU tensors.

Not collected by name: ``test_triton_interpreter.py`` runs this file in a subprocess with the variable set,
because Triton reads it when a kernel is defined, and the main test process may have imported Triton already.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import pytest
import torch

if os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("needs TRITON_INTERPRET=1 before Triton is imported", allow_module_level=True)
pytest.importorskip("triton")

from kernel_cases import (  # noqa: E402
    BATCHES,
    DTYPES,
    LAYOUT_SHAPES,
    ROPES,
    Case,
    assert_batch_matches_native,
    assert_bitwise_equal,
    build,
    parity_cases,
)

from ropeserve.kernels import get_kernel, triton_rope  # noqa: E402

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


class LaunchCounter:
    """Stands in for a ``@triton.jit`` kernel: counts ``kernel[grid](...)`` launches and runs the real one."""

    def __init__(self, kernel: Any) -> None:
        self.kernel, self.launches = kernel, 0

    def __getitem__(self, grid: tuple[int, ...]) -> Any:
        self.launches += 1
        return self.kernel[grid]


@pytest.fixture
def launches(monkeypatch: pytest.MonkeyPatch) -> dict[str, LaunchCounter]:
    counters = {name: LaunchCounter(getattr(triton_rope, name)) for name in ("_rope_kernel", "_rope_batch_kernel")}
    for name, counter in counters.items():
        monkeypatch.setattr(triton_rope, name, counter)
    return counters


@pytest.mark.parametrize("pairing", ["neox", "gptj"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("batch", list(BATCHES))
def test_triton_batch_is_one_launch_and_matches_native(
    batch: str, dtype: Any, pairing: str, launches: dict[str, LaunchCounter]
) -> None:
    """Requests of one batch key (layouts differ) rotated in place by a single ``_rope_batch_kernel`` launch."""
    cases = [dataclasses.replace(case, dtype=dtype, pairing=pairing) for case in BATCHES[batch]]
    assert_batch_matches_native(triton_rope.rotate_triton_many, [build(c, seed=s) for s, c in enumerate(cases)])
    assert (launches["_rope_batch_kernel"].launches, launches["_rope_kernel"].launches) == (1, 0)


def test_triton_batch_beyond_the_table_launches_per_request(launches: dict[str, LaunchCounter]) -> None:
    """Positions past the table's row cap (computed per token) or negative: one launch per request, still exact."""
    cases = [Case(position_range=(300_000, 300_050)), Case(layout="flat", position_range=(-40, 40))]
    assert_batch_matches_native(triton_rope.rotate_triton_many, [build(c, seed=s) for s, c in enumerate(cases)])
    assert (launches["_rope_batch_kernel"].launches, launches["_rope_kernel"].launches) == (0, 2)


def test_triton_batch_handles_views_at_any_offset(launches: dict[str, LaunchCounter]) -> None:
    """Jobs that are views into one buffer at odd element offsets: the alignment promise drops to 1."""
    problems = [build(Case(layout="flat", tokens=4, q_heads=1, k_heads=0), seed=seed) for seed in range(2)]
    buffer = torch.cat([problems[0].q.flatten(), torch.zeros(1), problems[1].q.flatten()])
    views = [buffer[: problems[0].q.numel()].view_as(problems[0].q), buffer[problems[0].q.numel() + 1 :]]
    expected = [get_kernel("native")(p.q, None, p.positions, p.table, p.spec)[0] for p in problems]
    items = [(view.view_as(p.q), None, p.positions, p.spec) for view, p in zip(views, problems, strict=True)]
    triton_rope.rotate_triton_many(items, problems[0].table)
    assert launches["_rope_batch_kernel"].launches == 1
    for (q, *_), want in zip(items, expected, strict=True):
        assert_bitwise_equal(q, want)


def test_stated_position_range_uses_the_table_and_clamps_to_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Positions the caller keeps on its device: a stated range selects the cached table; a range that lies
    (positions past the table's rows) reads the last row, never outside the table."""
    problem = build(Case(layout="bthd", tokens=6, position_range=(0, 50)))
    monkeypatch.setattr(triton_rope, "host_bounds", lambda positions: pytest.fail("range was stated"))
    true_range = (int(problem.positions.min()), int(problem.positions.max()))
    expected = get_kernel("native")(problem.q, problem.k, problem.positions, problem.table, problem.spec)
    actual = triton_rope.rotate_triton(
        problem.q, problem.k, problem.positions, problem.table, problem.spec, position_range=true_range
    )
    assert_bitwise_equal(actual[0], expected[0])
    rows = problem.table.rows[0].shape[0]
    beyond = problem.positions + rows
    lied = triton_rope.rotate_triton(problem.q, problem.k, beyond, problem.table, problem.spec, position_range=(0, 1))
    clamped = torch.full_like(beyond, rows - 1)
    assert_bitwise_equal(lied[0], get_kernel("native")(problem.q, None, clamped, problem.table, problem.spec)[0])
