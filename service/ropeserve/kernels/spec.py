"""What a rotation kernel is asked to do, independent of the tensors: layout, pairing, M-RoPE slot map."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from ropeserve.config import RopeParams
from ropeserve.config.families import MropeLayout
from ropeserve.rope.apply import Layout
from ropeserve.rope.mrope import slot_axes
from ropeserve.rope.tables import Pairing, RopeTable


@dataclass(frozen=True)
class MropeSpec:
    """How M-RoPE frequency slots map to the T/H/W position rows (spec §5.5)."""

    section: tuple[int, ...]
    layout: MropeLayout

    @classmethod
    def of(cls, params: RopeParams) -> MropeSpec | None:
        """The slot map of ``params``, or None when it has no ``mrope_section``."""
        if params.mrope_section is None or params.mrope_layout is None:
            return None
        return cls(tuple(params.mrope_section), params.mrope_layout)

    def slot_axes(self, slots: int) -> torch.Tensor:
        """Axis (0=T, 1=H, 2=W) of each frequency slot: [slots] int64."""
        return slot_axes(self.section, self.layout, slots)


@dataclass(frozen=True)
class RotationSpec:
    """Tensor layout and pairing of one rotation call; hashable (part of the batching key).

    ``mrope`` set means positions are [3, T] or [3, B, T] (T/H/W rows); otherwise [T] or [B, T].
    The rotary width comes from the table: ``2 · table.inv_freq.numel()`` channels rotate.
    """

    head_dim: int
    layout: Layout = "bhtd"
    pairing: Pairing = "neox"
    mrope: MropeSpec | None = None


class RotateFn(Protocol):
    """A rotation kernel: rotate q (and k) by the cos/sin of ``table`` at ``positions``.

    q, k: per ``spec.layout`` (k may have another head count); positions: [T] / [B, T] int, or
    [3, T] / [3, B, T] with ``spec.mrope``. Returns tensors in the input shapes and dtypes; with
    ``inplace`` they are q and k themselves, rotated where they lie.
    """

    def __call__(
        self,
        q: torch.Tensor,
        k: torch.Tensor | None,
        positions: torch.Tensor,
        table: RopeTable,
        spec: RotationSpec,
        *,
        inplace: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]: ...


BatchItem = tuple[torch.Tensor, torch.Tensor | None, torch.Tensor, RotationSpec]
"""One request of a batch: q, k (or None), positions, and its spec (layouts may differ within a batch)."""


class RotateBatchFn(Protocol):
    """A kernel's batch entry point: rotate every item's q (and k) in place by the cos/sin of the shared
    ``table``; the items share one dtype and pairing."""

    def __call__(self, items: Sequence[BatchItem], table: RopeTable) -> None: ...
