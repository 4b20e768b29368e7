"""Rotation kernels behind one interface (``RotateFn``): native reference, fused torch ops, one-pass C, Triton."""

from ropeserve.kernels.registry import (
    KERNELS,
    KernelInfo,
    get_batch_kernel,
    get_kernel,
    kernel_report,
    register_kernel,
    rotate_qk,
    select_kernel,
)
from ropeserve.kernels.spec import BatchItem, MropeSpec, RotateBatchFn, RotateFn, RotationSpec

__all__ = [
    "KERNELS",
    "BatchItem",
    "KernelInfo",
    "MropeSpec",
    "RotateBatchFn",
    "RotateFn",
    "RotationSpec",
    "get_batch_kernel",
    "get_kernel",
    "kernel_report",
    "register_kernel",
    "rotate_qk",
    "select_kernel",
]
