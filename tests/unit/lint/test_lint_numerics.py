"""The torch-free dtype emulation and cos/sin error model, checked against torch and the spec's values."""

from __future__ import annotations

import math
import random
import struct

import pytest

from ropeserve.config import from_explicit
from ropeserve.lint.numerics import (
    ROUNDERS,
    float32_frequencies,
    float32_inverse_frequencies,
    forget_results,
    phase_waves,
    round_bfloat16,
    round_float16,
    round_float32,
    table_error,
)

torch = pytest.importorskip("torch")
SAMPLES = [random.Random(7).uniform(-1e5, 1e5) for _ in range(300)] + [1.0, 0.5403023058681398, 65504.0, 1e-8]


@pytest.mark.parametrize(
    ("rounder", "dtype"),
    [(round_float32, torch.float32), (round_bfloat16, torch.bfloat16), (round_float16, torch.float16)],
)
def test_rounding_matches_torch_casts(rounder, dtype) -> None:
    values = torch.tensor(SAMPLES, dtype=torch.float64)
    expected = values.to(dtype).to(torch.float64).tolist()
    assert [rounder(v) for v in SAMPLES] == expected


@pytest.mark.parametrize(
    ("name", "dtype"), [("float32", torch.float32), ("bfloat16", torch.bfloat16), ("float16", torch.float16)]
)
def test_list_rounding_matches_torch_casts_past_the_range_too(name: str, dtype) -> None:
    """The whole-list rounders (one conversion per list) agree with torch, overflow to infinity included."""
    values = [*SAMPLES, 1e6, -1e6, 65519.0, 65520.0, 3.4028236e38, -1e300, 1e-46, math.inf]
    expected = torch.tensor(values, dtype=torch.float64).to(dtype).to(torch.float64).tolist()
    assert ROUNDERS[name](values) == expected
    assert math.isnan(ROUNDERS[name]([math.nan])[0])


def test_overflow_and_non_finite() -> None:
    assert round_float16(1e6) == math.inf
    assert math.isnan(round_bfloat16(math.nan))
    assert round_float32(-1e300) == -math.inf


@pytest.mark.parametrize("theta", [1e4, 5e5, 1e6])
def test_float32_inv_freq_within_one_ulp_of_torch(theta: float) -> None:
    params = from_explicit({"rope_theta": theta, "head_dim": 128})
    _, emulated = float32_frequencies(params, None)
    exponents = torch.arange(0, 128, 2, dtype=torch.int64).float() / 128
    reference = (1.0 / (theta**exponents)).tolist()
    for ours, theirs in zip(emulated, reference, strict=True):
        assert abs(ours - theirs) <= math.ulp(theirs) * 2**29  # one float32 ulp


def test_float32_angle_error_matches_spec_s6b() -> None:
    params = from_explicit({"rope_theta": 1e6, "head_dim": 128})
    assert 3e-3 < table_error(params, 131071, "float32", "float32").worst < 7e-3  # spec: 5.5e-3 rad
    assert 4e-2 < table_error(params, 1_000_000, "float32", "float32").worst < 8e-2  # spec: 6.2e-2 rad


def test_low_precision_phases_are_catastrophic() -> None:
    params = from_explicit({"rope_theta": 5e5, "head_dim": 128})
    assert table_error(params, 8191, "bfloat16", "bfloat16").worst > 0.1
    assert table_error(params, 8191, "float32", "bfloat16").worst < 5e-3
    assert table_error(params, 100_000, "float16", "float16").cos == math.inf


def test_bf16_table_error_is_bounded_by_half_an_ulp_near_one() -> None:
    params = from_explicit({"rope_theta": 1e4, "head_dim": 8})
    error = table_error(params, 1, "float32", "bfloat16")
    assert error.worst <= 2**-9 + 1e-6


def test_cached_table_errors_match_the_uncached_computation() -> None:
    """``table_error`` (cached, sharing one cached ``phase_waves`` per position) equals a fresh computation over
    varied rope types, thetas, positions and dtypes, whatever was asked before."""
    rng = random.Random(11)
    shapes = [
        {},
        {"rope_type": "linear", "factor": 4.0},
        {"rope_type": "dynamic", "factor": 2.0, "max_position_embeddings": 4096},
    ]
    for _ in range(40):
        shape = rng.choice(shapes)
        params = from_explicit(
            {"rope_theta": rng.choice([1e4, 5e5, 1e6]), "head_dim": rng.choice([8, 64, 128]), **shape}
        )
        position, phase = rng.choice([0, 255, 8191, 32767, 100_000]), rng.choice(list(ROUNDERS))
        for table in rng.sample(list(ROUNDERS), 2):
            fresh = phase_waves.__wrapped__(params, position, phase).error(table)
            assert table_error(params, position, phase, table) == fresh
            assert (fresh.position, fresh.phase_dtype, fresh.table_dtype) == (position, phase, table)


def test_cached_inverse_frequencies_match_the_uncached_computation() -> None:
    """The float32 ``inv_freq`` cache (shared by every length and rope type of one theta and width) returns what
    a fresh computation does, and the frequencies built on it do not depend on what was asked before."""
    rng = random.Random(13)
    for _ in range(30):
        theta, dim = round_float32(rng.choice([1e4, 5e5, 1e6, rng.uniform(2, 1e7)])), float(rng.choice([8, 64, 256]))
        count = int(dim) // 2
        assert float32_inverse_frequencies(theta, dim, count) == float32_inverse_frequencies.__wrapped__(
            theta, dim, count
        )
    for shape in ({"head_dim": 128}, {"head_dim": 256, "rope_type": "proportional", "partial_rotary_factor": 0.25}):
        params = from_explicit({"rope_theta": 1e6, **shape})
        before = float32_frequencies(params, 4096)
        float32_inverse_frequencies.cache_clear()
        assert float32_frequencies(params, 4096) == before


def test_bfloat16_lanes_match_torch_for_any_bit_pattern() -> None:
    """The big-integer bfloat16 rounding of a whole list (finite lanes carry, non-finite ones kept) agrees with
    torch on random float32 bit patterns, NaN and infinities among them."""
    rng = random.Random(5)
    patterns = [rng.getrandbits(32) for _ in range(2000)] + [0x7F7FFFFF, 0xFF7FFFFF, 0x7F7F8000, 0x00008000, 0x80000000]
    values = list(struct.unpack(f"<{len(patterns)}f", struct.pack(f"<{len(patterns)}I", *patterns)))
    expected = torch.tensor(values, dtype=torch.float32).to(torch.bfloat16).to(torch.float64).tolist()
    ours = ROUNDERS["bfloat16"](values)
    assert [math.isnan(v) for v in ours] == [math.isnan(v) for v in expected]
    assert [v for v in ours if not math.isnan(v)] == [v for v in expected if not math.isnan(v)]


def test_overflowing_phases_give_infinite_errors_for_every_table_dtype() -> None:
    params = from_explicit({"rope_theta": 5e5, "head_dim": 128})
    waves = phase_waves(params, 100_000, "float16")
    assert waves.emulated is None and waves.exact == ()
    assert all(table_error(params, 100_000, "float16", dtype).cos == math.inf for dtype in ROUNDERS)


def test_forget_results_empties_every_cross_request_cache() -> None:
    params = from_explicit({"rope_theta": 10000.0, "head_dim": 64})
    table_error(params, 4095, "float32", "bfloat16")
    forget_results()
    caches = (table_error, phase_waves, float32_inverse_frequencies)
    assert [cached.cache_info().currsize for cached in caches] == [0, 0, 0]
