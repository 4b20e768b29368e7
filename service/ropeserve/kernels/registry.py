"""Registry of rotation kernels and their selection by device.

Kernels load lazily (``module:function``), so importing the registry never imports Triton: the Triton
module must see ``TRITON_INTERPRET`` at import time, and Triton is optional on CPU hosts.
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass
from functools import cache
from typing import Any

import torch

from ropeserve.kernels.spec import RotateBatchFn, RotateFn, RotationSpec
from ropeserve.rope.tables import RopeTable


@dataclass(frozen=True)
class KernelInfo:
    """A registered kernel: where it lives, which device types it serves, which modules it needs."""

    name: str
    target: str
    devices: frozenset[str]
    requires: tuple[str, ...] = ()
    description: str = ""
    batch_target: str | None = None
    """``module:function`` rotating several requests in place at once (``RotateBatchFn``); None: the caller
    concatenates a batch and calls ``target`` once."""
    probe: str | None = None
    """``module:function`` returning why the kernel cannot work here (e.g. its C library does not build), or
    None when it can; no probe: nothing beyond device and modules to check."""

    def unavailable_reason(self, device: torch.device) -> str | None:
        """Why this kernel cannot serve ``device`` here (device type, CUDA, modules, probe); None if it can."""
        if device.type not in self.devices:
            return f"serves {', '.join(sorted(self.devices))}, not {device.type}"
        if device.type == "cuda" and not torch.cuda.is_available():
            return "CUDA is not available"
        missing = [module for module in self.requires if importlib.util.find_spec(module) is None]
        if missing:
            return f"missing module(s): {', '.join(missing)}"
        reason: str | None = _resolve(self.probe)() if self.probe else None
        return reason

    def available(self, device: torch.device) -> bool:
        """Whether this kernel can serve ``device`` here."""
        return self.unavailable_reason(device) is None


KERNELS: dict[str, KernelInfo] = {}


def register_kernel(info: KernelInfo) -> KernelInfo:
    """Add ``info`` to the registry under its name."""
    KERNELS[info.name] = info
    return info


register_kernel(
    KernelInfo(
        "native",
        "ropeserve.kernels.native:rotate_native",
        frozenset({"cpu", "cuda"}),
        description="eager transformers formula (the reference)",
    )
)
register_kernel(
    KernelInfo(
        "fused",
        "ropeserve.kernels.fused:rotate_fused",
        frozenset({"cpu", "cuda"}),
        description="chunked in-place torch ops, no full-size temporaries",
    )
)
register_kernel(
    KernelInfo(
        "c",
        "ropeserve.kernels.compiled:rotate_compiled",
        frozenset({"cpu"}),
        batch_target="ropeserve.kernels.compiled:rotate_compiled_many",
        description="one pass in C (built for this CPU on first use): q and k rotated where they lie",
        probe="ropeserve.kernels.compiled:unavailable_reason",
    )
)
register_kernel(
    KernelInfo(
        "triton",
        "ropeserve.kernels.triton_rope:rotate_triton",
        frozenset({"cuda"}),
        requires=("triton",),
        batch_target="ropeserve.kernels.triton_rope:rotate_triton_many",
        description="one Triton launch: cos/sin gather + q and k rotation (one launch per batch of requests)",
    )
)

PREFERENCE: dict[str, tuple[str, ...]] = {"cuda": ("triton", "fused"), "cpu": ("c", "fused")}
"""Kernels tried in order per device type; ``native`` serves whatever is left."""


def select_kernel(device: torch.device | str) -> str:
    """Name of the fastest available kernel for ``device``: triton on CUDA when importable, c on CPU when it
    builds, else fused."""
    device = torch.device(device)
    for name in PREFERENCE.get(device.type, ()):
        if KERNELS[name].available(device):
            return name
    return "native"


def kernel_report(device: torch.device | str) -> dict[str, dict[str, Any]]:
    """Every registered kernel with its description and whether (or why not) it can serve ``device`` here."""
    device = torch.device(device)
    report: dict[str, dict[str, Any]] = {}
    for name, info in KERNELS.items():
        reason = info.unavailable_reason(device)
        report[name] = {"description": info.description, "available": reason is None, "reason": reason}
    return report


@cache
def get_kernel(name: str) -> RotateFn:
    """The kernel function registered as ``name`` (imported on first use); KeyError names the known ones."""
    if name not in KERNELS:
        raise KeyError(f"unknown kernel {name!r}; known: {sorted(KERNELS)}")
    kernel: RotateFn = _resolve(KERNELS[name].target)
    return kernel


@cache
def get_batch_kernel(name: str) -> RotateBatchFn | None:
    """The batch entry point of kernel ``name`` (imported on first use), or None when it has none."""
    target = KERNELS[name].batch_target
    if target is None:
        return None
    batch_kernel: RotateBatchFn = _resolve(target)
    return batch_kernel


def _resolve(target: str) -> Any:
    """The object named by ``module:attribute`` (the module imported on first use)."""
    module_name, _, attribute = target.partition(":")
    return getattr(importlib.import_module(module_name), attribute)


def rotate_qk(
    q: torch.Tensor,
    k: torch.Tensor | None,
    positions: torch.Tensor,
    table: RopeTable,
    spec: RotationSpec,
    *,
    kernel: str | None = None,
    inplace: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Rotate q (and k) with ``kernel`` (default: ``select_kernel(q.device)``); see ``RotateFn``."""
    rotate = get_kernel(kernel or select_kernel(q.device))
    return rotate(q, k, positions, table, spec, inplace=inplace)
