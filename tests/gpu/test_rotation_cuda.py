"""CUDA parity of the compiled Triton kernel and the fused path against the native reference (same device)."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
import torch
from kernel_cases import (
    BATCHES,
    DTYPES,
    Case,
    Problem,
    assert_batch_matches_native,
    assert_bitwise_equal,
    build,
    parity_cases,
)
from safetensors.torch import load, save

from ropeserve.config import from_explicit
from ropeserve.kernels import get_kernel, select_kernel, triton_rope
from ropeserve.rope.tables import TableCache
from ropeserve.serving import REQUIRED_TENSORS, RotationOptions, RotationService, decode_safetensors
from ropeserve.settings import Settings

pytestmark = pytest.mark.gpu


def test_cuda_selects_triton() -> None:
    assert select_kernel("cuda") == "triton"


@pytest.mark.parametrize("inplace", [False, True], ids=["out", "inplace"])
@pytest.mark.parametrize("kernel", ["triton", "fused"])
@pytest.mark.parametrize("case", parity_cases(), ids=Case.id)
def test_kernel_matches_native_on_cuda(case: Case, kernel: str, inplace: bool) -> None:
    problem = build(case, device="cuda")
    expected = get_kernel("native")(problem.q, problem.k, problem.positions, problem.table, problem.spec)
    q, k = problem.q.clone(), None if problem.k is None else problem.k.clone()
    actual = get_kernel(kernel)(q, k, problem.positions, problem.table, problem.spec, inplace=inplace)
    assert_bitwise_equal(actual[0], expected[0])
    assert_bitwise_equal(actual[1], expected[1])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_triton_matches_native_at_serving_size(dtype: torch.dtype) -> None:
    case = Case(dtype=dtype, layout="flat", tokens=8192, q_heads=28, k_heads=4, rope="qwen2vl")
    problem = build(case, device="cuda")
    expected = get_kernel("native")(problem.q, problem.k, problem.positions, problem.table, problem.spec)
    actual = get_kernel("triton")(problem.q, problem.k, problem.positions, problem.table, problem.spec)
    assert_bitwise_equal(actual[0], expected[0])
    assert_bitwise_equal(actual[1], expected[1])


def on_host_positions(problem: Problem) -> Problem:
    """The problem with its positions on the host (how the service passes them: the table path, no read-back)."""
    return dataclasses.replace(problem, positions=problem.positions.cpu())


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("batch", list(BATCHES))
def test_triton_batch_entry_point_matches_native_on_cuda(batch: str, dtype: torch.dtype) -> None:
    cases = [dataclasses.replace(case, dtype=dtype) for case in BATCHES[batch]]
    problems = [on_host_positions(build(case, seed=seed, device="cuda")) for seed, case in enumerate(cases)]
    assert_batch_matches_native(triton_rope.rotate_triton_many, problems)


def test_rotation_path_never_synchronises_on_cuda() -> None:
    """Under ``set_sync_debug_mode("error")`` any host synchronisation raises: single calls (in place and out of
    place), a batch, and the service's staging + kernel call."""
    problems = [on_host_positions(build(Case(layout=layout, tokens=64), device="cuda")) for layout in ("flat", "bhtd")]
    rotate = get_kernel("triton")
    service = RotationService(Settings(access_log=False), torch.device("cuda"), TableCache())
    params = from_explicit({"rope_theta": 10_000.0, "head_dim": 64})
    tensors = {"q": torch.randn(32, 4 * 64), "k": torch.randn(32, 2 * 64), "positions": torch.arange(32)}
    payload = decode_safetensors(bytearray(save(tensors)), max_elements=10**7, required=REQUIRED_TENSORS)
    options = RotationOptions(params, layout="flat")

    def calls() -> None:
        for p in problems:
            rotate(p.q, p.k, p.positions, p.table, p.spec, inplace=True)
            rotate(p.q, p.k, p.positions, p.table, p.spec)
        triton_rope.rotate_triton_many([(p.q, p.k, p.positions, p.spec) for p in problems], problems[0].table)
        service._rotate([service.prepare(payload, options), service.prepare(payload, options)])

    calls()  # compiles, grows the tables
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        calls()
    finally:
        torch.cuda.set_sync_debug_mode("default")


def test_triton_rotation_replays_from_a_cuda_graph() -> None:
    """Positions on the device (cos/sin computed per token there): the call captures and replays exactly."""
    problem = build(Case(rope="qwen2vl", dtype=torch.bfloat16, layout="bthd", tokens=256, q_heads=8), device="cuda")
    rotate = get_kernel("triton")
    q, k = problem.q.clone(), problem.k.clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        rotate(q, k, problem.positions, problem.table, problem.spec)  # compile and cache before capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        q_out, k_out = rotate(q, k, problem.positions, problem.table, problem.spec)
    q.copy_(problem.q * 2)
    k.copy_(problem.k * 2)
    graph.replay()
    torch.cuda.synchronize()
    expected = get_kernel("native")(problem.q * 2, problem.k * 2, problem.positions, problem.table, problem.spec)
    assert_bitwise_equal(q_out, expected[0])
    assert_bitwise_equal(k_out, expected[1])


def test_service_on_cuda_answers_like_the_cpu_service() -> None:
    """Concurrent requests (batched: one launch) through staging, kernel and copy-back equal the CPU service."""
    params = from_explicit({"rope_theta": 10_000.0, "head_dim": 64})
    generator = torch.Generator().manual_seed(3)
    bodies = [
        save(
            {
                "q": torch.randn(tokens, 4 * 64, generator=generator).to(torch.bfloat16),
                "k": torch.randn(tokens, 2 * 64, generator=generator).to(torch.bfloat16),
                "positions": torch.randint(0, 9000, (tokens,), generator=generator),
            }
        )
        for tokens in (5, 300, 4096, 1)
    ]
    options = RotationOptions(params, layout="flat")

    async def answers(device: str) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
        settings = Settings(access_log=False, batch_max_wait_us=20_000)
        service = RotationService(settings, torch.device(device), TableCache())
        payloads = [decode_safetensors(bytearray(b), max_elements=10**8, required=REQUIRED_TENSORS) for b in bodies]
        await service.start()
        try:
            results = await asyncio.gather(*(service.rotate(p, options) for p in payloads))
        finally:
            await service.stop()
        decoded = [load(result.body.to_bytes()) for result in results]
        return [(tensors["q"], tensors.get("k")) for tensors in decoded]

    for (q_gpu, k_gpu), (q_cpu, k_cpu) in zip(asyncio.run(answers("cuda")), asyncio.run(answers("cpu")), strict=True):
        assert_bitwise_equal(q_gpu, q_cpu)
        assert_bitwise_equal(k_gpu, k_cpu)
