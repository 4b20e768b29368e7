"""``mrope_decode_array`` (what the decode route answers from, no tensor) against a plain-int reference of the
decode rule and its checks, in their order, and ``first_true`` on numpy masks (argmax, no ``any()``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ropeserve.errors import InvalidInput, LimitExceeded
from ropeserve.positions import INT64_MAX, mrope_decode_array, mrope_decode_positions
from ropeserve.positions._common import first_true

EDGE_INTS = st.sampled_from([0, 1, -1, 7, 2**62, INT64_MAX, INT64_MAX - 3, -(2**63), 2**63, 10**30])
INTS = st.one_of(st.integers(-50, 3000), EDGE_INTS)


def _reference(deltas: list[int], cache: list[int], num_new: int) -> tuple[str, list[list[list[int]]] | str]:
    """The decode rule on Python ints: ``("ok", [3, B, num_new])`` or ``("error", field)`` of the first failed
    check (in the order the numpy code checks)."""
    if any(not -(2**63) <= value <= INT64_MAX for value in deltas):
        return "error", "mrope_position_deltas"
    if any(not -(2**63) <= value <= INT64_MAX for value in cache):
        return "error", "cache_lengths"
    if len(cache) != len(deltas):
        return "error", "cache_lengths"
    for index, value in enumerate(cache):
        if value < 0:
            return "error", f"cache_lengths[{index}]"
    for index, (value, delta) in enumerate(zip(cache, deltas, strict=True)):
        if value + delta + num_new - 1 > INT64_MAX:
            return "error", f"cache_lengths[{index}]"
    for row, (value, delta) in enumerate(zip(cache, deltas, strict=True)):
        if value + delta < 0:
            return "error", f"rows[{row}]"
    rows = [[value + delta + k for k in range(num_new)] for value, delta in zip(cache, deltas, strict=True)]
    return "ok", [rows] * 3


@settings(max_examples=300, deadline=None)
@given(
    deltas=st.lists(INTS, max_size=5),
    cache=st.lists(INTS, max_size=5),
    num_new=st.integers(1, 6),
    nested=st.booleans(),
)
def test_decode_array_follows_the_rule_and_its_check_order(
    deltas: list[int], cache: list[int], num_new: int, nested: bool
) -> None:
    expected = _reference(deltas, cache, num_new)
    given_deltas = [[delta] for delta in deltas] if nested and deltas else deltas
    try:
        array = mrope_decode_array(given_deltas, cache, num_new)
    except (InvalidInput, LimitExceeded) as error:
        assert expected == ("error", error.field)
        return
    assert expected == ("ok", array.tolist())
    assert array.dtype == np.int64 and array.shape == (3, len(cache), num_new) and array.flags.writeable
    tensor = mrope_decode_positions(given_deltas, cache, num_new)
    assert torch.equal(tensor, torch.from_numpy(array))


def test_decode_array_rows_are_independent_copies() -> None:
    array = mrope_decode_array([1, 2], [3, 4], 2)
    array[0, 0, 0] = -1
    assert array[1, 0, 0] == 4 and array[2, 0, 0] == 4


@pytest.mark.parametrize(
    ("mask", "expected"),
    [
        (np.zeros(0, dtype=bool), None),
        (np.zeros((2, 0), dtype=bool), None),
        (np.array([False, False]), None),
        (np.array([False, True, True]), 1),
        (np.array([True]), 0),
        (np.array([[False, False], [False, True]]), 3),
        (np.array(True), 0),
        (np.array(False), None),
    ],
)
def test_first_true_on_arrays_is_the_flat_index_of_the_first_true(mask: np.ndarray, expected: int | None) -> None:
    assert first_true(mask) == expected
    assert first_true(torch.from_numpy(mask.copy())) == expected
