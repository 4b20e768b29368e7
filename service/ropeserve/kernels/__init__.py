"""Rotation kernels behind one interface (``RotateFn``): native reference, fused CPU, Triton."""

from ropeserve.kernels.registry import KERNELS, KernelInfo, get_kernel, register_kernel, rotate_qk, select_kernel
from ropeserve.kernels.spec import MropeSpec, RotateFn, RotationSpec

__all__ = [
    "KERNELS",
    "KernelInfo",
    "MropeSpec",
    "RotateFn",
    "RotationSpec",
    "get_kernel",
    "register_kernel",
    "rotate_qk",
    "select_kernel",
]
