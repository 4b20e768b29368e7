"""GPU check in one command (under 5 minutes on an H200): Triton kernel parity, bandwidth, host cost, tiles.

    .venv/bin/python benchmarks/gpu_check.py [--budget-s 200] [--no-compile] [--no-sweep]

Without CUDA (or Triton) it says so and exits 0. With a device:
1. Parity, bit for bit: the Triton kernel against the native reference on the same device over ropes
   (default, partial GPT-J, YaRN, chunked and interleaved M-RoPE), dtypes, pairings and layouts, in place and out
   of place; its batch entry point (several requests, mixed layouts, one launch); and transformers' eager
   ``Qwen2RotaryEmbedding`` + ``apply_rotary_pos_emb`` at a serving size.
2. Bandwidth: rotation of q and k (28 + 4 heads × 128), flat and [B, H, T, D], bf16 and fp32, T = 1024 .. 65536,
   as a multiple of a device copy of the same bytes measured in the same run (1.00× = copy speed): transformers
   eager, Triton out of place and in place (positions on the device with their range stated: the pure kernel),
   Triton in place with host positions (the service's call: positions copied per call), and the batch entry
   point over 8 requests of T/8 tokens in place.
3. Host cost per call at T=1024: wall time of back-to-back calls (no sync between them) against the GPU time.
4. ``torch.compile`` of the eager formula (dynamic shapes) beside Triton in place, T ≥ 8192.
5. Tile sweep (T=65536, bf16, flat, in place): the kernel time per (tokens per program, heads per step,
   warps), to pick ``TOKENS_PER_PROGRAM`` / ``HEAD_STEP_CHANNELS`` in ``kernels/triton_rope.py``.

Sections 4 and 5 stop adding rows once ``--budget-s`` seconds have passed since parity ended (compiling
dominates). Exits 1 when any parity case differs.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ropeserve.config import from_explicit
from ropeserve.kernels import MropeSpec, RotationSpec, get_kernel
from ropeserve.rope.tables import RopeTable, TableCache

if importlib.util.find_spec("triton") is not None:  # main() says so and stops when it is missing
    from ropeserve.kernels import triton_rope

ROPES: dict[str, dict[str, Any]] = {
    "llama-like": {"rope_theta": 500_000.0, "head_dim": 128},
    "partial-gptj": {"rope_theta": 10_000.0, "head_dim": 128, "rotary_dim": 64},
    "yarn": {
        "rope_type": "yarn",
        "rope_theta": 1e6,
        "head_dim": 128,
        "factor": 4.0,
        "original_max_position_embeddings": 32_768,
        "max_position_embeddings": 131_072,
    },
    "qwen2-vl": {"rope_theta": 1e6, "head_dim": 128, "mrope_section": [16, 24, 24], "model_type": "qwen2_vl"},
    "qwen3-vl": {"rope_theta": 5e6, "head_dim": 128, "mrope_section": [24, 20, 20], "model_type": "qwen3_vl"},
}
LAYOUTS = {
    "bhtd": lambda b, h, t, d: (b, h, t, d),
    "bthd": lambda b, h, t, d: (b, t, h, d),
    "flat": lambda b, h, t, d: (t, h * d),
}
Q_HEADS, K_HEADS, THETA = 28, 4, 500_000.0
CACHE = TableCache()


@dataclass(frozen=True)
class Case:
    rope: str
    dtype: torch.dtype
    layout: str
    pairing: str = "neox"
    batch: int = 2
    tokens: int = 333
    q_heads: int = Q_HEADS
    k_heads: int = K_HEADS


@dataclass
class Problem:
    q: torch.Tensor
    k: torch.Tensor
    positions: torch.Tensor
    table: RopeTable
    spec: RotationSpec


def problem(case: Case, device: torch.device, *, sequential: bool = False) -> Problem:
    """Random q/k and positions (random in 0..40000, or 0..T-1 with ``sequential``) on ``device``."""
    params = from_explicit(ROPES[case.rope])
    mrope = MropeSpec.of(params)
    batch = 1 if case.layout == "flat" else case.batch
    shape = LAYOUTS[case.layout]
    q = torch.randn(shape(batch, case.q_heads, case.tokens, params.head_dim), device=device).to(case.dtype)
    k = torch.randn(shape(batch, case.k_heads, case.tokens, params.head_dim), device=device).to(case.dtype)
    rows = (3,) if mrope else ()
    if sequential:
        positions = torch.arange(case.tokens, device=device).expand(*rows, batch, case.tokens).contiguous()
    else:
        positions = torch.randint(0, 40_000, (*rows, batch, case.tokens), device=device)
    spec = RotationSpec(params.head_dim, case.layout, case.pairing, mrope)  # type: ignore[arg-type]
    return Problem(q, k, positions, CACHE.get(params, None, device), spec)


# --- 1. parity -----------------------------------------------------------------------------------------------------


def parity_cases() -> list[Case]:
    cases = [
        Case(rope, dtype, layout, pairing)
        for rope in ROPES
        for dtype in (torch.float32, torch.bfloat16, torch.float16)
        for layout in LAYOUTS
        for pairing in ("neox", "gptj")
    ]
    return [
        *cases,
        Case("qwen2-vl", torch.bfloat16, "flat", tokens=8192),
        Case("llama-like", torch.float16, "bthd", batch=1),
    ]


def mismatches(name: str, actual: tuple[Any, ...], expected: tuple[Any, ...]) -> int:
    """Count (and print) the tensors of ``actual`` that differ from ``expected`` in any bit."""
    failures = 0
    for tensor_name, got, want in zip("qk", actual, expected, strict=True):
        if got is None or want is None or not torch.equal(got, want):
            failures += 1
            diff = (got.float() - want.float()).abs().max().item() if got is not None else float("nan")
            print(f"  MISMATCH {name} tensor {tensor_name}: max |diff| {diff:.3g}")
    return failures


def check_parity(device: torch.device) -> int:
    native, triton_kernel = get_kernel("native"), get_kernel("triton")
    failures = 0
    cases = parity_cases()
    for index, case in enumerate(cases):
        p = problem(case, device)
        expected = native(p.q, p.k, p.positions, p.table, p.spec)
        for positions in (p.positions.cpu(), p.positions)[: 2 if index % 3 == 0 else 1]:
            for inplace in (False, True):
                actual = triton_kernel(p.q.clone(), p.k.clone(), positions, p.table, p.spec, inplace=inplace)
                where = "host" if positions.device.type == "cpu" else "device"
                failures += mismatches(f"{case} positions on {where}, inplace={inplace}", actual, expected)
    print(
        f"1. Parity vs native: {len(cases)} cases (a third also with positions on the device), in and out of place:"
        f" {failures} mismatches"
    )
    batch_failures = check_batch_parity(device)
    transformers_failures = check_transformers_parity(device)
    return failures + batch_failures + transformers_failures


def check_batch_parity(device: torch.device) -> int:
    """The batch entry point over requests of one batch key in mixed layouts, against native per request."""
    native = get_kernel("native")
    failures = 0
    for dtype in (torch.bfloat16, torch.float32):
        for rope in ("llama-like", "qwen2-vl"):
            problems = [
                problem(Case(rope, dtype, layout, tokens=tokens), device)
                for layout, tokens in (("flat", 300), ("bhtd", 77), ("bthd", 5), ("flat", 1))
            ]
            items = [(p.q.clone(), p.k.clone(), p.positions.cpu(), p.spec) for p in problems]
            triton_rope.rotate_triton_many(items, problems[0].table)
            for p, (q, k, _, _) in zip(problems, items, strict=True):
                failures += mismatches(
                    f"batch {rope} {dtype} {p.spec.layout}", (q, k), native(p.q, p.k, p.positions, p.table, p.spec)
                )
    print(f"   Batch entry point vs native (mixed layouts, one launch): {failures} mismatches")
    return failures


def transformers_eager(device: torch.device) -> tuple[Callable[..., Any], Any] | None:
    """(apply_rotary_pos_emb, rotary embedding module) of transformers' Qwen2 on ``device``; None without it."""
    if importlib.util.find_spec("transformers") is None:
        return None
    from transformers import Qwen2Config
    from transformers.models.qwen2.modeling_qwen2 import Qwen2RotaryEmbedding, apply_rotary_pos_emb

    config = Qwen2Config(
        hidden_size=Q_HEADS * 128, num_attention_heads=Q_HEADS, num_key_value_heads=K_HEADS, rope_theta=THETA
    )
    return apply_rotary_pos_emb, Qwen2RotaryEmbedding(config).to(device)


def eager_formula(layout: str, apply: Callable[..., Any], rotary: Any) -> Callable[..., Any]:
    """transformers' eager rotation of q/k in ``layout`` ([1, H, T, D] or flat [T, H·D]) at positions [1, T]."""

    def rotate(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if layout == "flat":
            q4, k4 = q.view(1, q.shape[0], -1, 128), k.view(1, k.shape[0], -1, 128)
            cos, sin = rotary(q4, positions)
            q_out, k_out = apply(q4, k4, cos, sin, unsqueeze_dim=2)
            return q_out.view(q.shape), k_out.view(k.shape)
        cos, sin = rotary(q, positions)
        out: tuple[torch.Tensor, torch.Tensor] = apply(q, k, cos, sin)
        return out

    return rotate


def check_transformers_parity(device: torch.device) -> int:
    eager = transformers_eager(device)
    if eager is None:
        print("   transformers is not installed: no parity against its eager path")
        return 0
    failures = 0
    for dtype in (torch.bfloat16, torch.float32):
        for layout in ("flat", "bhtd"):
            p = problem(Case("llama-like", dtype, layout, batch=1, tokens=8192), device)
            expected = eager_formula(layout, *eager)(p.q, p.k, p.positions.reshape(1, -1))
            actual = get_kernel("triton")(p.q, p.k, p.positions.cpu(), p.table, p.spec)
            failures += mismatches(f"transformers {dtype} {layout}", actual, expected)
    print(
        f"   Triton vs transformers eager (Qwen2RotaryEmbedding + apply_rotary_pos_emb, T=8192): {failures} mismatches"
    )
    return failures


# --- 2. bandwidth --------------------------------------------------------------------------------------------------


def cuda_seconds(fn: Callable[[], Any], repeats: int = 20) -> float:
    """GPU time per call (CUDA events around ``repeats`` back-to-back calls, after one warm-up)."""
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1e3 / repeats


def theoretical_bandwidth(device: torch.device) -> float | None:
    """DRAM bytes/s from the device properties (double data rate × bus width), when torch exposes them."""
    properties = torch.cuda.get_device_properties(device)
    clock_khz = getattr(properties, "memory_clock_rate", 0)
    bus_bits = getattr(properties, "memory_bus_width", 0)
    return 2 * clock_khz * 1e3 * bus_bits / 8 if clock_khz and bus_bits else None


class Budget:
    """Seconds left for the optional rows (sections 4 and 5)."""

    def __init__(self, seconds: float) -> None:
        self.deadline = time.perf_counter() + seconds

    def spent(self) -> bool:
        return time.perf_counter() > self.deadline


def candidates(p: Problem, layout: str, device: torch.device) -> dict[str, Callable[[], Any]]:
    """What each column times (positions are 0..T-1: the cached table covers them)."""
    host_positions = p.positions.cpu()
    tokens = p.positions.shape[-1]
    stated = (0, tokens - 1)
    q_work, k_work = p.q.clone(), p.k.clone()
    shares = [slice(i * tokens // 8, (i + 1) * tokens // 8) for i in range(8)]
    items = [
        (
            (q_work[:, :, share] if layout == "bhtd" else q_work[share]),
            (k_work[:, :, share] if layout == "bhtd" else k_work[share]),
            host_positions[..., share],
            p.spec,
        )
        for share in shares
    ]
    columns: dict[str, Callable[[], Any]] = {}
    eager = transformers_eager(device)
    if eager is not None:
        formula = eager_formula(layout, *eager)
        positions_2d = p.positions.reshape(1, -1)
        columns["transformers eager"] = lambda: formula(p.q, p.k, positions_2d)
    columns["triton out"] = lambda: triton_rope.rotate_triton(
        p.q, p.k, p.positions, p.table, p.spec, position_range=stated
    )
    columns["triton in"] = kernel_in_place(p)
    columns["triton in, host pos"] = lambda: triton_rope.rotate_triton(
        q_work, k_work, host_positions, p.table, p.spec, inplace=True
    )
    columns["triton batch x8 in"] = lambda: triton_rope.rotate_triton_many(items, p.table)
    return columns


BANDWIDTH_ROWS = [
    *(("flat", dtype, tokens) for dtype in (torch.bfloat16, torch.float32) for tokens in (1024, 8192, 65_536)),
    *(("bhtd", dtype, tokens) for dtype in (torch.bfloat16, torch.float32) for tokens in (8192, 65_536)),
]
COMPILE_ROWS = [row for row in BANDWIDTH_ROWS if row[2] >= 8192]


def kernel_in_place(p: Problem) -> Callable[[], Any]:
    """Triton in place, positions (0..T-1) on the device with their range stated: the kernel alone."""
    stated = (0, p.positions.shape[-1] - 1)
    return lambda: triton_rope.rotate_triton(
        p.q, p.k, p.positions, p.table, p.spec, inplace=True, position_range=stated
    )


def copy_seconds(p: Problem) -> float:
    """GPU time of a device copy of q's and k's bytes (the 1.00x of every ratio)."""
    return cuda_seconds(lambda: (torch.empty_like(p.q).copy_(p.q), torch.empty_like(p.k).copy_(p.k)))


def row_name(layout: str, dtype: torch.dtype, tokens: int) -> str:
    return f"{layout} {str(dtype).removeprefix('torch.')} T={tokens}"


def report_bandwidth(device: torch.device) -> None:
    peak = theoretical_bandwidth(device)
    peak_text = f"{peak / 1e9:.0f} GB/s theoretical" if peak else "theoretical bandwidth unknown"
    print(f"2. Bandwidth on {torch.cuda.get_device_name(device)} ({peak_text}); time as a multiple of a device copy")
    header_done = False
    for layout, dtype, tokens in BANDWIDTH_ROWS:
        p = problem(Case("llama-like", dtype, layout, batch=1, tokens=tokens), device, sequential=True)
        copy = copy_seconds(p)
        ratios = {name: cuda_seconds(fn) / copy for name, fn in candidates(p, layout, device).items()}
        if not header_done:
            print("  " + " | ".join([f"{'case':22s}", "copy GB/s", *(f"{name:>19s}" for name in ratios)]))
            header_done = True
        moved = 2 * (p.q.nbytes + p.k.nbytes)
        cells = [f"{row_name(layout, dtype, tokens):22s}", f"{moved / copy / 1e9:9.0f}"]
        print("  " + " | ".join([*cells, *(f"{ratio:18.2f}x" for ratio in ratios.values())]))


def report_compile(device: torch.device, budget: Budget) -> None:
    """torch.compile (dynamic shapes, one compiled function per layout) of the eager formula beside the kernel."""
    eager = transformers_eager(device)
    if eager is None:
        print("4. torch.compile: transformers is not installed")
        return
    print("4. torch.compile of the eager formula vs Triton in place (x copy; compile time in brackets)")
    compiled = {layout: torch.compile(eager_formula(layout, *eager), dynamic=True) for layout in LAYOUTS}
    for layout, dtype, tokens in COMPILE_ROWS:
        if budget.spent():
            print(f"  (time budget spent: rows from {row_name(layout, dtype, tokens)} on skipped)")
            return
        p = problem(Case("llama-like", dtype, layout, batch=1, tokens=tokens), device, sequential=True)
        copy = copy_seconds(p)
        positions_2d = p.positions.reshape(1, -1)
        started = time.perf_counter()
        compiled[layout](p.q, p.k, positions_2d)
        compile_s = time.perf_counter() - started
        compile_ratio = cuda_seconds(lambda: compiled[layout](p.q, p.k, positions_2d)) / copy  # noqa: B023
        triton_ratio = cuda_seconds(kernel_in_place(p)) / copy
        print(
            f"  {row_name(layout, dtype, tokens):22s} torch.compile {compile_ratio:5.2f}x ({compile_s:4.1f} s)"
            f"  triton in place {triton_ratio:5.2f}x"
        )


# --- 3. host cost --------------------------------------------------------------------------------------------------


def report_host_cost(device: torch.device) -> None:
    """Wall time per call of back-to-back calls at T=1024 (launch-bound) against their GPU time."""
    p = problem(Case("llama-like", torch.bfloat16, "flat", batch=1, tokens=1024), device, sequential=True)
    host_positions = p.positions.cpu()
    calls = {
        "device positions, range stated": kernel_in_place(p),
        "host positions (service call)": lambda: triton_rope.rotate_triton(
            p.q, p.k, host_positions, p.table, p.spec, inplace=True
        ),
    }
    print("3. Host cost per call, T=1024 bf16 flat in place (200 calls back to back, no sync between them)")
    for name, fn in calls.items():
        gpu = cuda_seconds(fn, repeats=200)
        walls = []
        for _ in range(3):
            torch.cuda.synchronize()
            started = time.perf_counter()
            for _ in range(200):
                fn()
            walls.append((time.perf_counter() - started) / 200)
            torch.cuda.synchronize()
        print(f"  {name:32s} host {statistics.median(walls) * 1e6:7.1f} us/call, GPU {gpu * 1e6:7.1f} us/call")


# --- 4. tile sweep -------------------------------------------------------------------------------------------------


def sweep_tiles(device: torch.device, budget: Budget) -> None:
    p = problem(Case("llama-like", torch.bfloat16, "flat", batch=1, tokens=65_536), device, sequential=True)
    copy = cuda_seconds(lambda: (torch.empty_like(p.q).copy_(p.q), torch.empty_like(p.k).copy_(p.k)))
    chosen = triton_rope.choose_tile
    results: list[tuple[float, triton_rope.Tile]] = []
    print("5. Tile sweep, T=65536 bf16 flat in place (x copy; the default first)")
    try:
        default = chosen(65_536, Q_HEADS, 64, device)
        tiles = [default] + [
            triton_rope.Tile(block_t, max(1, channels // 128), warps)
            for block_t in (1, 2, 4, 8)
            for channels in (512, 1024, 2048)
            for warps in (4, 8)
        ]
        for tile in tiles:
            if budget.spent():
                print("  (time budget spent: sweep cut short)")
                break
            triton_rope.choose_tile = lambda *args, tile=tile: tile  # type: ignore[misc]
            seconds = cuda_seconds(kernel_in_place(p))
            results.append((seconds / copy, tile))
    finally:
        triton_rope.choose_tile = chosen
    for ratio, tile in [results[0], *sorted(results[1:], key=lambda r: r[0])[:5]] if results else []:
        print(f"  {dataclasses.astuple(tile)} (tokens/program, heads/step, warps): {ratio:5.2f}x")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget-s", type=float, default=200.0, help="seconds for sections 4-5 after parity")
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile column")
    parser.add_argument("--no-sweep", action="store_true", help="skip the tile sweep")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("gpu_check: no CUDA device here; nothing to check (the Triton kernel is tested on CPU in tests/).")
        return 0
    if importlib.util.find_spec("triton") is None:
        print("gpu_check: CUDA is present but Triton is not installed (pip install triton).")
        return 0
    device = torch.device("cuda")
    failures = check_parity(device)
    budget = Budget(args.budget_s)
    report_bandwidth(device)
    report_host_cost(device)
    if not args.no_compile:
        report_compile(device, budget)
    if not args.no_sweep:
        sweep_tiles(device, budget)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
