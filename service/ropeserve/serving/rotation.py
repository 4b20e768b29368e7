"""Rotation service: decoded request → rope params → positions → table → kernel → response body.

``RotationService.rotate`` validates everything on the event loop (cheap: views and header checks), submits a
``RotationJob`` to the batcher, and encodes the rotated tensors. The table is ropeserve's cached one for the params,
or the caller's own when the body carries ``cos_sin_cache`` or ``cos`` + ``sin`` (a ``CallerTable``: checked,
bounded by ``max_table_elements``, compared with ropeserve's, then rotated with by the same kernels). A lone request
is rotated in place in its own request buffer and answered from it without a copy. Jobs with the same table, dtype,
head sizes, pairing and M-RoPE layout form a batch for one kernel call in the worker thread: a kernel with a batch
entry point (the C kernel) rotates each job in its own buffer, sharing one list of pieces among the threads;
otherwise the jobs are concatenated along the token axis (token-major rows ``[N, H·D]``), rotated in place, and
answered from slices of the batch (views for the token-major layouts).

On CUDA the path has no host synchronisation before the answer is copied back: q and k go to the device
through pinned memory on a copy stream (``staging.py``), positions stay on the host (their range, read there,
sizes the table; the kernel copies them), and the worker thread copies the results back to pinned memory
after the kernel, so the event loop never waits for the device.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from ropeserve.config import RopeParams, from_explicit, validate_params
from ropeserve.config.normalize import factor_for_rotary_dim
from ropeserve.errors import InvalidInput, check_limit
from ropeserve.kernels import MropeSpec, RotationSpec, get_batch_kernel, get_kernel, kernel_report, select_kernel
from ropeserve.kernels.prep import RotationInputs, from_token_major, prepare, rotary_dim_of
from ropeserve.rope.apply import Layout
from ropeserve.rope.caller_tables import (
    TABLE_TENSORS,
    CallerTable,
    TableDifference,
    caller_table,
    check_covers,
    compare_table,
    has_caller_table,
)
from ropeserve.rope.tables import (
    MAX_POSITION,
    Pairing,
    RopeTable,
    TableCache,
    effective_length,
    without_growth_wait,
)
from ropeserve.serving.batcher import Batcher, BatchObserver, DisconnectCheck, Timed
from ropeserve.serving.buffers import BodyBuffers
from ropeserve.serving.codec import METADATA_KEY, EncodedSafetensors, SafetensorsPayload, encode_safetensors
from ropeserve.serving.staging import DeviceStaging, Ready

if TYPE_CHECKING:  # injected by the api layer; serving does not import the settings module
    from ropeserve.settings import Settings

INLINE_PREPARE_ELEMENTS = 1 << 16
"""Most elements (q, k and positions together) a CPU request is prepared with on the event loop (checks, a dtype
cast); a larger one is prepared in a thread, as every request is on CUDA."""
REQUIRED_TENSORS = ("q", "positions")
OPTIONAL_TENSORS = ("k", *TABLE_TENSORS)
"""``k``, and the caller's own cos/sin table (``cos_sin_cache``, or ``cos`` and ``sin``) to rotate with."""


@dataclass(frozen=True)
class RotationOptions:
    """Resolved request parameters.

    ``mrope``: positions carry T/H/W rows (the M-RoPE endpoint). ``dtype``: cast q and k to it before rotating
    (the answer is in it); None keeps theirs. ``rotary_dim`` overrides the params' rotated width. ``atol``: rows
    of a caller's table differing from ropeserve's by more count as differing.
    """

    params: RopeParams
    pairing: Pairing = "neox"
    layout: Layout = "bhtd"
    mrope: bool = False
    dtype: torch.dtype | None = None
    rotary_dim: int | None = None
    atol: float = 0.0

    def resolved_params(self) -> RopeParams:
        """``params`` with the ``rotary_dim`` override applied and re-validated."""
        if self.rotary_dim is None or self.rotary_dim == self.params.rotary_dim:
            return self.params
        head_dim = self.params.head_dim
        if not 0 < self.rotary_dim <= head_dim:
            raise InvalidInput(f"rotary_dim {self.rotary_dim} must be in 1..head_dim ({head_dim})", field="rotary_dim")
        factor = factor_for_rotary_dim(self.rotary_dim, head_dim)
        params = dataclasses.replace(self.params, partial_rotary_factor=factor)
        validate_params(params, {"partial_rotary_factor": "rotary_dim", "mrope_section": "rotary_dim"})
        return params


Rotated = tuple[torch.Tensor, torch.Tensor | None]
"""A job's rotated (q, k): the job's own tensors, or views into a batch."""


@dataclass
class RotationJob:
    """One validated request, ready for the kernel: q/k on the compute device in the asked dtype (their copy
    complete at ``ready``), positions on the host."""

    q: torch.Tensor
    k: torch.Tensor | None
    positions: torch.Tensor
    inputs: RotationInputs
    table: RopeTable
    spec: RotationSpec
    params: RopeParams
    ready: Ready = None
    caller: TableDifference | None = None
    """With the caller's own table (``table`` is then a ``CallerTable``): how it differs from ropeserve's."""

    @property
    def tokens(self) -> int:
        return self.inputs.q4.shape[0] * self.inputs.q4.shape[1]

    @property
    def batch_key(self) -> Hashable:
        k_heads = None if self.inputs.k4 is None else self.inputs.k4.shape[2]
        spec = self.spec
        return (id(self.table), self.q.dtype, spec.head_dim, spec.pairing, spec.mrope, self.inputs.q4.shape[2], k_heads)


@dataclass(frozen=True)
class RotationResult:
    """The response: body chunks, timing headers, the metadata written into the body, and the rotated tensors."""

    body: EncodedSafetensors
    headers: dict[str, str]
    metadata: dict[str, Any]
    tensors: dict[str, torch.Tensor]


class RotationService:
    """Owns the kernel choice, the batcher and the request buffer pool; ``start``/``stop`` with the app's lifespan."""

    def __init__(
        self,
        settings: Settings,
        device: torch.device,
        tables: TableCache,
        *,
        kernel: str | None = None,
        observer: BatchObserver | None = None,
    ) -> None:
        self.settings, self.device, self.tables = settings, device, tables
        self.kernel_name = kernel or select_kernel(device)
        self.rotate_kernel = get_kernel(self.kernel_name)
        self.rotate_batch = get_batch_kernel(self.kernel_name)
        self.body_buffers = BodyBuffers(settings.body_buffer_pool_bytes)
        self.staging = DeviceStaging(device)
        self.batcher: Batcher[RotationJob, Rotated] = Batcher(
            self.run,
            max_batch_tokens=settings.batch_max_tokens,
            max_wait_s=settings.batch_max_wait_us / 1e6,
            queue_size=settings.batch_queue_size,
            retry_after_s=settings.retry_after_s,
            enabled=settings.batching,
            observer=observer,
        )

    async def start(self) -> None:
        await self.batcher.start()

    def kernel_report(self) -> dict[str, dict[str, Any]]:
        """Every registered kernel: description, and whether (or why not) it could serve this device."""
        return kernel_report(self.device)

    def warm_up(self) -> None:
        """Run the kernel, and its batch entry point for two requests, once per common dtype (head_dim 128, NeoX,
        in place, host positions as requests have them) so no request pays a compile."""
        params = from_explicit({"rope_theta": 10_000.0, "head_dim": 128})
        table = self.tables.get(params, None, self.device)
        positions, spec = torch.arange(16), RotationSpec(128, "flat")
        for dtype in (torch.bfloat16, torch.float32):
            items = [
                (
                    torch.zeros(16, 2 * 128, dtype=dtype, device=self.device),
                    torch.zeros(16, 128, dtype=dtype, device=self.device),
                    positions,
                    spec,
                )
                for _ in range(2)
            ]
            self.rotate_kernel(*items[0][:3], table, spec, inplace=True)
            if self.rotate_batch is not None:
                self.rotate_batch(items, table)

    async def stop(self) -> None:
        await self.batcher.stop()

    async def rotate(
        self,
        payload: SafetensorsPayload,
        options: RotationOptions,
        *,
        is_disconnected: DisconnectCheck | None = None,
        started: float | None = None,
        timings: Mapping[str, float] | None = None,
    ) -> RotationResult:
        """Validate, rotate (batched) and encode. ``started``: perf_counter at request start, for ``total_s``;
        ``timings``: earlier phases (e.g. ``read_s``) to report alongside."""
        started = time.perf_counter() if started is None else started
        prepare_start = time.perf_counter()
        if self.staging.stream is None and _elements(payload) <= INLINE_PREPARE_ELEMENTS:
            with without_growth_wait():  # (a caller's table is compared with rows of the shared cache)
                job = self.prepare(payload, options)
        else:  # host work (pinned copies on CUDA; a large body's casts and checks): keep it off the event loop
            job = await asyncio.to_thread(self.prepare, payload, options)
        phases = {**(timings or {}), "prepare_s": time.perf_counter() - prepare_start}
        timed = await self.batcher.submit(job, is_disconnected)
        return self.respond(job, timed, phases, started)

    def prepare(self, payload: SafetensorsPayload, options: RotationOptions) -> RotationJob:
        """All checks before compute; InvalidInput / LimitExceeded name the tensor or parameter."""
        params = options.resolved_params()
        tensors = payload.tensors
        q, k, positions = tensors["q"], tensors.get("k"), tensors["positions"]
        check_limit(positions.numel(), self.settings.max_positions, "positions", "positions")
        _check_position_values(positions)
        mrope = MropeSpec.of(params) if options.mrope else None
        if options.mrope and mrope is None:
            raise InvalidInput("M-RoPE needs params with mrope_section (config, preset or rope)", field="mrope_section")
        spec = RotationSpec(params.head_dim, options.layout, options.pairing, mrope)
        max_position = int(positions.max()) if positions.numel() else 0
        table, caller = self._table(tensors, params, options, max_position)
        q, q_ready = self.staging.to_device(q, options.dtype)
        k, k_ready = (None, None) if k is None else self.staging.to_device(k, options.dtype)
        inputs = prepare(q, k, positions, table, spec, positions_to_device=False)
        return RotationJob(q, k, positions, inputs, table, spec, params, k_ready or q_ready, caller)

    def _table(
        self, tensors: Mapping[str, torch.Tensor], params: RopeParams, options: RotationOptions, max_position: int
    ) -> tuple[RopeTable, TableDifference | None]:
        """ropeserve's cached table for ``params`` (grown to ``max_position`` within the limit), or the caller's
        own (``cos_sin_cache`` or ``cos`` + ``sin``: checked, bounded, compared with ropeserve's)."""
        if not has_caller_table(tensors):
            table = self.tables.get(params, effective_length(params, max_position), self.device)
            _check_table_growth(table, max_position, self.settings.max_table_elements)
            return table, None
        cos, sin = caller_table(tensors, params.rotary_dim, options.pairing)
        limit = self.settings.max_table_elements
        check_limit(2 * cos.numel(), limit, "table elements (cos+sin)", "cos_sin_cache")
        check_covers(cos.shape[0], max_position)
        difference = compare_table(params, cos, sin, atol=options.atol, cache=self.tables, max_growth=limit)
        return CallerTable.of(cos, sin, self.device), difference

    def run(self, jobs: Sequence[RotationJob]) -> list[Rotated]:
        """Worker thread: once the jobs' copies are in (a wait on the device), rotate one job in place, or
        several in one kernel call: in place through the kernel's batch entry point when it has one, else on
        their concatenation; then the results in host memory."""
        self.staging.wait([job.ready for job in jobs])
        hosted = self.staging.to_host([x for rotated in self._rotate(jobs) for x in rotated])
        return [(q, k) for q, k in zip(hosted[::2], hosted[1::2], strict=True) if q is not None]  # q is never None

    def _rotate(self, jobs: Sequence[RotationJob]) -> list[Rotated]:
        if len(jobs) > 1 and self.rotate_batch is not None:
            self.rotate_batch([(job.q, job.k, job.positions, job.spec) for job in jobs], jobs[0].table)
            return [(job.q, job.k) for job in jobs]
        if len(jobs) > 1:
            return self._run_concatenated(jobs)
        job = jobs[0]
        return [self.rotate_kernel(job.q, job.k, job.positions, job.table, job.spec, inplace=True)]

    def _run_concatenated(self, jobs: Sequence[RotationJob]) -> list[Rotated]:
        """Concatenate token-major rows, rotate them once (flat layout), and hand each job its slice."""
        first = jobs[0]
        q_rows = torch.cat([_rows(job.inputs.q4) for job in jobs])
        k_rows = None if first.k is None else torch.cat([_rows(job.inputs.k4) for job in jobs])
        positions = torch.cat([job.inputs.positions.flatten(1) for job in jobs], dim=1)
        flat = dataclasses.replace(first.spec, layout="flat")
        self.rotate_kernel(
            q_rows, k_rows, positions if first.spec.mrope else positions[0], first.table, flat, inplace=True
        )
        results: list[Rotated] = []
        offset = 0
        for job in jobs:
            rows = slice(offset, offset + job.tokens)
            q_out = _from_rows(q_rows[rows], job.inputs.q4, job.q, job.spec)
            k_out = None
            if k_rows is not None and job.k is not None and job.inputs.k4 is not None:
                k_out = _from_rows(k_rows[rows], job.inputs.k4, job.k, job.spec)
            results.append((q_out, k_out))
            offset += job.tokens
        return results

    def respond(
        self, job: RotationJob, timed: Timed[Rotated], phases: Mapping[str, float], started: float
    ) -> RotationResult:
        q, k = timed.value
        mrope = job.spec.mrope
        tensors = {"q": q} if k is None else {"q": q, "k": k}
        total = time.perf_counter() - started
        metadata = {
            "kernel": self.kernel_name,
            "device": str(self.device),
            "rope_type": job.params.rope_type,
            "head_dim": job.params.head_dim,
            "rotary_dim": rotary_dim_of(job.table),
            "attention_factor": None if job.caller is not None else job.table.attention_factor,
            "pairing": job.spec.pairing,
            "layout": job.spec.layout,
            "mrope": None if mrope is None else {"section": list(mrope.section), "layout": mrope.layout},
            "dtype": str(q.dtype).removeprefix("torch."),
            "table": None if job.caller is None else job.caller.as_dict(),
            "batch": {"size": timed.batch_size, "tokens": timed.batch_tokens},
            "timings": {**phases, "queue_s": timed.queue_s, "compute_s": timed.compute_s, "total_s": total},
        }
        headers = {"x-queue-time": f"{timed.queue_s:.6f}", "x-compute-time": f"{timed.compute_s:.6f}"}
        body = encode_safetensors(tensors, {METADATA_KEY: json.dumps(metadata)})
        return RotationResult(body, headers, metadata, tensors)


def _check_position_values(positions: torch.Tensor) -> None:
    if positions.dtype.is_floating_point:
        raise InvalidInput(f"positions must be integers, got {positions.dtype}", field="positions")
    if positions.numel() and (int(positions.min()) < 0 or int(positions.max()) > MAX_POSITION):
        raise InvalidInput(f"positions must be in 0..{MAX_POSITION}", field="positions")


def _check_table_growth(table: RopeTable, max_position: int, limit: int) -> None:
    """Refuse positions that would grow the shared cos/sin table past ``limit`` elements."""
    check_limit(table.growth_elements(max_position), limit, "rope table elements (cos+sin rows)", "positions")


def _rows(x4: torch.Tensor | None) -> torch.Tensor:
    """A [B, T, H, D] view as token-major rows [B·T, H·D] (a copy unless already token-major)."""
    assert x4 is not None
    return x4.reshape(x4.shape[0] * x4.shape[1], -1)


def _from_rows(rows: torch.Tensor, x4: torch.Tensor, like: torch.Tensor, spec: RotationSpec) -> torch.Tensor:
    """Token-major rows [B·T, H·D] back in the layout of ``like`` (token-major view ``x4``); a view."""
    return from_token_major(rows.view(x4.shape), spec.layout, like)


def _elements(payload: SafetensorsPayload) -> int:
    return sum(tensor.numel() for tensor in payload.tensors.values())
