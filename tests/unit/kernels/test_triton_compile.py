"""The Triton kernels compile for Hopper (sm_90) without a GPU, with 16-byte global loads and stores of q/k.

Triton compiles ahead of time for a named target with the ptxas its wheel ships, so this runs on any CPU host.
It checks what the interpreter cannot: that the GPU code path (hardware bf16 rounding, ``tl.split``/``tl.join``
for GPT-J, alignment hints in the batch kernel) compiles, and that q/k move as 128-bit vectors (a tile choice
or layout change that breaks vectorisation fails here, long before a device measures it).
"""

from __future__ import annotations

import os
import re

import pytest
import torch

pytest.importorskip("triton")
if os.environ.get("TRITON_INTERPRET") == "1":
    pytest.skip("kernels are interpreted functions under TRITON_INTERPRET=1", allow_module_level=True)

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from ropeserve.kernels import RotationSpec, triton_rope  # noqa: E402

HOPPER = GPUTarget("cuda", 90, 32)
POINTER = {torch.bfloat16: "*bf16", torch.float16: "*fp16", torch.float32: "*fp32"}
TABLES = {"cos_table": "*fp32", "sin_table": "*fp32", "positions": "*i64", "slot_axes": "*i64", "jobs": "*i64"}
DATA = {"q", "q_out", "k", "k_out", "base"}


def ptx(kernel: triton.JITFunction, dtype: torch.dtype, constants: dict[str, object]) -> str:
    """PTX of ``kernel`` for sm_90: pointers aligned to 16 bytes and every stride a multiple of 16 elements
    (what the launcher specialises on for contiguous heads of 128), other integers plain int32."""
    names = kernel.arg_names
    signature: dict[str, str] = {}
    for name in names:
        signature[name] = "constexpr" if name in constants else POINTER[dtype] if name in DATA else "i32"
        signature[name] = TABLES.get(name, signature[name])
    aligned = [name for name in names if name in DATA or name in TABLES or name.endswith(("_sb", "_st", "_sh"))]
    source = ASTSource(
        kernel,
        signature=signature,
        constexprs={(names.index(name),): value for name, value in constants.items()},
        attrs={(names.index(name),): [["tt.divisibility", 16]] for name in aligned},
    )
    compiled = triton.compile(source, target=HOPPER, options={"num_warps": 4, "enable_fp_fusion": False})
    text: str = compiled.asm["ptx"]
    return text


def constants(dtype: torch.dtype, pairing: str, head_dim: int = 128, n_freq: int = 64) -> dict[str, object]:
    """The compile-time constants a launch of 8192 tokens × 28 heads would use (``choose_tile`` on a CPU)."""
    tile = triton_rope.choose_tile(8192, 28, n_freq, torch.device("cpu"))
    return triton_rope._shape_constants(n_freq, RotationSpec(head_dim, "flat", pairing), tile, dtype)  # type: ignore[arg-type]


def assert_vectorised(text: str, dtype: torch.dtype) -> None:
    """Every global store is a 16-byte vector; 16-bit data is never loaded element by element."""
    stores = re.findall(r"st\.global[\w.]*", text)
    assert stores and all(".v4." in store for store in stores), sorted(set(stores))
    assert re.search(r"ld\.global[\w.]*\.v4\.", text)
    if dtype != torch.float32:
        assert not re.search(r"ld\.global[\w.]*\.b16\b", text)


@pytest.mark.parametrize("pairing", ["neox", "gptj"])
@pytest.mark.parametrize("dtype", list(POINTER), ids=str)
def test_single_call_kernel_compiles_for_hopper_with_vector_accesses(dtype: torch.dtype, pairing: str) -> None:
    text = ptx(triton_rope._rope_kernel, dtype, {**constants(dtype, pairing), "COPY_PASS": False})
    assert_vectorised(text, dtype)
    assert "fma" not in text  # contraction off: products are rounded before the sum, as in eager torch
    if dtype == torch.bfloat16:
        assert "cvt.rn.bf16" in text  # hardware round-to-nearest-even, not the interpreter's integer ops


def test_partial_rotary_copy_pass_compiles_with_vector_accesses() -> None:
    text = ptx(
        triton_rope._rope_kernel, torch.bfloat16, {**constants(torch.bfloat16, "neox", n_freq=32), "COPY_PASS": True}
    )
    assert_vectorised(text, torch.bfloat16)


@pytest.mark.parametrize("pairing", ["neox", "gptj"])
def test_batch_kernel_compiles_with_vector_accesses_when_offsets_align(pairing: str) -> None:
    dtype = torch.bfloat16
    batch_constants = {**constants(dtype, pairing), "JOBS_PAD": 8, "FIELDS": triton_rope.JOB_FIELDS, "ALIGN": 8}
    assert_vectorised(ptx(triton_rope._rope_batch_kernel, dtype, batch_constants), dtype)
