"""GPU check in one command (well under 5 minutes): Triton kernel parity and achieved memory bandwidth.

    .venv/bin/python benchmarks/gpu_check.py

Without CUDA (or Triton) it says so and exits 0. With a device:
1. Parity: the Triton kernel against the native reference on the same device, bit for bit, over dtypes,
   pairings, layouts, partial rotary, GQA and chunked/interleaved M-RoPE (including a serving-size shape).
2. Bandwidth: Triton rotation of q and k (in place and out of place) at T=8192..65536, 28+4 heads × 128, bf16,
   as GB/s of q/k bytes moved (read + write), against the device's theoretical DRAM bandwidth (memory clock ×
   bus width from the device properties) and a measured device-to-device copy.

Exits 1 when any parity case differs.
"""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass
from typing import Any

import torch

from ropeserve.config import from_explicit
from ropeserve.kernels import MropeSpec, RotationSpec, get_kernel
from ropeserve.rope.tables import TableCache

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
CACHE = TableCache()


@dataclass(frozen=True)
class Case:
    rope: str
    dtype: torch.dtype
    layout: str
    pairing: str = "neox"
    batch: int = 2
    tokens: int = 333
    q_heads: int = 28
    k_heads: int = 4


def problem(case: Case, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, Any, RotationSpec]:
    params = from_explicit(ROPES[case.rope])
    mrope = MropeSpec.of(params)
    batch = 1 if case.layout == "flat" else case.batch
    shape = LAYOUTS[case.layout]
    q = torch.randn(shape(batch, case.q_heads, case.tokens, params.head_dim), device=device).to(case.dtype)
    k = torch.randn(shape(batch, case.k_heads, case.tokens, params.head_dim), device=device).to(case.dtype)
    rows = (3,) if mrope else ()
    positions = torch.randint(0, 40_000, (*rows, batch, case.tokens), device=device)
    spec = RotationSpec(params.head_dim, case.layout, case.pairing, mrope)  # type: ignore[arg-type]
    return q, k, positions, CACHE.get(params, None, device), spec


def parity_cases() -> list[Case]:
    cases = [
        Case(rope, dtype, layout, pairing)
        for rope in ROPES
        for dtype in (torch.float32, torch.bfloat16, torch.float16)
        for layout in LAYOUTS
        for pairing in ("neox", "gptj")
    ]
    return [*cases, Case("qwen2-vl", torch.bfloat16, "flat", tokens=8192), Case("llama-like", torch.float16, "bthd", 1)]


def check_parity(device: torch.device) -> int:
    native, triton_kernel = get_kernel("native"), get_kernel("triton")
    failures = 0
    for case in parity_cases():
        q, k, positions, table, spec = problem(case, device)
        expected = native(q, k, positions, table, spec)
        for inplace in (False, True):
            q_in, k_in = q.clone(), k.clone()
            actual = triton_kernel(q_in, k_in, positions, table, spec, inplace=inplace)
            for name, got, want in zip("qk", actual, expected, strict=True):
                if got is None or want is None or not torch.equal(got, want):
                    failures += 1
                    diff = (got.float() - want.float()).abs().max().item() if got is not None else float("nan")
                    print(f"  MISMATCH {case} inplace={inplace} tensor {name}: max |diff| {diff:.3g}")
    print(f"1. Parity: {len(parity_cases())} cases x (out of place, in place): {failures} mismatches")
    return failures


def cuda_seconds(fn: Any, repeats: int = 20) -> float:
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


def measured_copy_bandwidth(device: torch.device) -> float:
    source = torch.empty(1 << 30, dtype=torch.uint8, device=device)
    target = torch.empty_like(source)
    return 2 * source.numel() / cuda_seconds(lambda: target.copy_(source))


def report_bandwidth(device: torch.device) -> None:
    peak = theoretical_bandwidth(device)
    copy = measured_copy_bandwidth(device)
    peak_text = f"{peak / 1e9:.0f} GB/s theoretical, " if peak else ""
    print(f"2. Bandwidth ({torch.cuda.get_device_name(device)}: {peak_text}{copy / 1e9:.0f} GB/s measured copy)")
    triton_kernel = get_kernel("triton")
    for tokens in (8192, 32_768, 65_536):
        case = Case("llama-like", torch.bfloat16, "flat", tokens=tokens)
        q, k, positions, table, spec = problem(case, device)
        moved = 2 * (q.nbytes + k.nbytes)
        for inplace in (True, False):
            seconds = cuda_seconds(lambda: triton_kernel(q, k, positions, table, spec, inplace=inplace))  # noqa: B023
            rate = moved / seconds
            versus = f"{rate / peak:5.1%} of theoretical, " if peak else ""
            mode = "in place" if inplace else "out of place"
            print(
                f"  T={tokens:6d} {mode:12s} {seconds * 1e6:8.1f} us  {rate / 1e9:7.0f} GB/s  "
                f"({versus}{rate / copy:5.1%} of copy)"
            )


def main() -> int:
    if not torch.cuda.is_available():
        print("gpu_check: no CUDA device here; nothing to check (the Triton kernel is tested on CPU in tests/).")
        return 0
    if importlib.util.find_spec("triton") is None:
        print("gpu_check: CUDA is present but Triton is not installed (pip install triton).")
        return 0
    device = torch.device("cuda")
    failures = check_parity(device)
    report_bandwidth(device)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
