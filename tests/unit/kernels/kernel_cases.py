"""Shared inputs for kernel parity tests (fused CPU here, Triton under the interpreter, CUDA in tests/gpu)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from ropeserve.config import from_explicit
from ropeserve.kernels import MropeSpec, RotateBatchFn, RotationSpec, get_kernel
from ropeserve.rope.tables import RopeTable, TableCache

CACHE = TableCache()
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
LAYOUT_SHAPES = {
    "bhtd": lambda batch, heads, tokens, head_dim: (batch, heads, tokens, head_dim),
    "bthd": lambda batch, heads, tokens, head_dim: (batch, tokens, heads, head_dim),
    "flat": lambda batch, heads, tokens, head_dim: (tokens, heads * head_dim),
    "batched_flat": lambda batch, heads, tokens, head_dim: (batch, tokens, heads * head_dim),
}
ROPES: dict[str, dict[str, Any]] = {
    "default": {"rope_theta": 10_000.0, "head_dim": 64},
    "partial": {"rope_theta": 10_000.0, "head_dim": 64, "rotary_dim": 32},
    "yarn": {
        "rope_type": "yarn",
        "rope_theta": 1e6,
        "head_dim": 32,
        "factor": 4.0,
        "original_max_position_embeddings": 64,
        "max_position_embeddings": 256,
    },
    "proportional": {"rope_type": "proportional", "rope_theta": 10_000.0, "head_dim": 32, "partial_rotary_factor": 0.5},
    "qwen2vl": {"rope_theta": 1e6, "head_dim": 32, "mrope_section": [4, 6, 6], "model_type": "qwen2_vl"},
    "qwen3vl": {"rope_theta": 5e5, "head_dim": 32, "mrope_section": [6, 5, 5], "model_type": "qwen3_vl"},
    "glm4v": {
        "rope_theta": 10_000.0,
        "head_dim": 64,
        "partial_rotary_factor": 0.5,
        "mrope_section": [4, 6, 6],
        "model_type": "glm4v",
    },
}


@dataclass(frozen=True)
class Case:
    """One rotation problem; ``k_heads=0`` means no k, ``shared_positions`` gives [T] instead of [B, T]."""

    rope: str = "default"
    dtype: torch.dtype = torch.float32
    pairing: str = "neox"
    layout: str = "bhtd"
    batch: int = 2
    tokens: int = 5
    q_heads: int = 3
    k_heads: int = 2
    shared_positions: bool = False
    position_range: tuple[int, int] = (0, 300)
    extra: dict[str, Any] = field(default_factory=dict)

    def id(self) -> str:
        dtype = str(self.dtype).removeprefix("torch.")
        shape = f"B{self.batch}T{self.tokens}H{self.q_heads}x{self.k_heads}"
        low, high = self.position_range
        return (
            f"{self.rope}-{dtype}-{self.pairing}-{self.layout}-{shape}-p{low}:{high}"
            + "-shared" * self.shared_positions
        )


@dataclass
class Problem:
    q: torch.Tensor
    k: torch.Tensor | None
    positions: torch.Tensor
    table: RopeTable
    spec: RotationSpec


def build(case: Case, seed: int = 0, device: str = "cpu") -> Problem:
    """Random q/k/positions for ``case`` (flat layout forces batch 1)."""
    params = from_explicit(ROPES[case.rope])
    mrope = MropeSpec.of(params)
    batch = 1 if case.layout == "flat" else case.batch
    generator = torch.Generator().manual_seed(seed)
    shape = LAYOUT_SHAPES[case.layout]

    def tensor(heads: int) -> torch.Tensor:
        values = torch.randn(shape(batch, heads, case.tokens, params.head_dim), generator=generator)
        return values.to(device=device, dtype=case.dtype)

    rows = (3,) if mrope else ()
    grid = (case.tokens,) if case.shared_positions else (batch, case.tokens)
    low, high = case.position_range
    positions = torch.randint(low, high, rows + grid, generator=generator).to(device)
    table = CACHE.get(params, None, torch.device(device))
    spec = RotationSpec(params.head_dim, case.layout, case.pairing, mrope)
    return Problem(tensor(case.q_heads), tensor(case.k_heads) if case.k_heads else None, positions, table, spec)


def parity_cases() -> list[Case]:
    """Every rope kind × dtype × pairing × layout once, plus shape and position edge cases."""
    grid = [
        Case(rope=rope, dtype=dtype, pairing=pairing, layout=layout)
        for rope in ROPES
        for dtype in DTYPES
        for pairing in ("neox", "gptj")
        for layout in LAYOUT_SHAPES
    ]
    edges = [
        Case(k_heads=0),
        Case(tokens=0),
        Case(q_heads=0),
        Case(layout="flat", q_heads=0),
        Case(batch=1, tokens=1, q_heads=1, k_heads=1),
        Case(shared_positions=True, batch=3),
        Case(rope="qwen2vl", shared_positions=True, batch=3),
        Case(layout="bthd", tokens=300, q_heads=5, k_heads=1, rope="yarn"),
        Case(position_range=(-40, 40)),
        Case(rope="qwen3vl", position_range=(-5, 40)),
        Case(position_range=(300_000, 300_050), dtype=torch.bfloat16),
    ]
    return grid + edges


BATCHES: dict[str, list[Case]] = {
    "mixed-layouts": [
        Case(layout="bhtd"),
        Case(layout="flat", tokens=11),
        Case(layout="bthd", batch=3, tokens=2),
        Case(layout="batched_flat", batch=2, tokens=5),
    ],
    "shared-positions": [Case(shared_positions=True, batch=3), Case(layout="bthd", tokens=7), Case(tokens=1, batch=1)],
    "no-k": [Case(k_heads=0, layout="flat", tokens=6), Case(k_heads=0, layout="bhtd")],
    "partial": [Case(rope="partial", layout="bthd"), Case(rope="partial", layout="flat", tokens=9)],
    "mrope": [Case(rope="qwen2vl", layout="bhtd"), Case(rope="qwen2vl", layout="flat", shared_positions=True)],
    "mrope-interleaved": [Case(rope="qwen3vl", layout="bthd", tokens=3), Case(rope="qwen3vl", layout="bhtd")],
    "empty-member": [Case(layout="flat", tokens=0), Case(layout="bhtd", tokens=4)],
}
"""Requests that share a batch key (layouts differ), for the kernels' batch entry points."""


def assert_bitwise_equal(actual: torch.Tensor | None, expected: torch.Tensor | None) -> None:
    if expected is None:
        assert actual is None
        return
    assert actual is not None
    assert actual.shape == expected.shape and actual.dtype == expected.dtype
    torch.testing.assert_close(actual.cpu(), expected.cpu(), rtol=0, atol=0, equal_nan=True)


def assert_batch_matches_native(rotate_many: RotateBatchFn, problems: list[Problem]) -> None:
    """Rotate copies of ``problems`` (one table) in place by one ``rotate_many`` call (a kernel's batch entry
    point); each equals native, bit for bit."""
    expected = [get_kernel("native")(p.q, p.k, p.positions, p.table, p.spec) for p in problems]
    items = [(p.q.clone(), None if p.k is None else p.k.clone(), p.positions, p.spec) for p in problems]
    rotate_many(items, problems[0].table)
    for (q, k, _, _), (q_ref, k_ref) in zip(items, expected, strict=True):
        assert_bitwise_equal(q, q_ref)
        assert_bitwise_equal(k, k_ref)
