"""``compare_table``: ropeserve's rows from the service's table cache equal the formula's, row for row."""

from __future__ import annotations

import pytest
import torch

from ropeserve.config import RopeParams
from ropeserve.rope.caller_tables import compare_table
from ropeserve.rope.tables import TableCache, rope_cos_sin

PARAMS = [
    RopeParams(rope_type="default", rope_theta=10000.0, head_dim=64),
    RopeParams(rope_type="dynamic", rope_theta=10000.0, head_dim=64, max_position_embeddings=16, factor=2.0),
]


def _exact_half(params: RopeParams, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The neox half of ropeserve's own table at ``0..rows-1``: [rows, rotary_dim/2] each."""
    own = rope_cos_sin(params, torch.arange(rows), cache=None)
    half = params.rotary_dim // 2
    return own.cos[:, :half].clone(), own.sin[:, :half].clone()


@pytest.mark.parametrize("params", PARAMS, ids=lambda p: p.rope_type)
@pytest.mark.parametrize("rows", [1, 40])
def test_cached_comparison_equals_the_uncached_one(params: RopeParams, rows: int) -> None:
    cos, sin = _exact_half(params, rows)
    cache = TableCache()
    exact = compare_table(params, cos, sin, cache=cache)
    assert exact == compare_table(params, cos, sin)
    assert exact.max_abs_error == 0.0 and exact.first_differing_position is None
    assert len(cache) == 1  # the rows now live in the cache for the next request
    sin[rows - 1, 3] += 0.5
    corrupted = compare_table(params, cos, sin, cache=cache)
    assert corrupted == compare_table(params, cos, sin)
    assert corrupted.first_differing_position == rows - 1
    assert corrupted.max_abs_error == pytest.approx(0.5, abs=1e-6)
