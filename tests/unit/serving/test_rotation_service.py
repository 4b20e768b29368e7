"""Rotation service: request → params → table → (batched) kernel → response, against the rope/ reference."""

from __future__ import annotations

import asyncio
import json

import pytest
import torch
from safetensors.torch import load, save

from ropeserve.config import from_explicit, normalize_config, preset_config
from ropeserve.errors import InvalidInput, LimitExceeded, ServiceError
from ropeserve.kernels import select_kernel
from ropeserve.rope import apply_rotary, mrope_cos_sin, rope_cos_sin
from ropeserve.rope.tables import TableCache
from ropeserve.serving import (
    METADATA_KEY,
    OPTIONAL_TENSORS,
    REQUIRED_TENSORS,
    RotationOptions,
    RotationService,
    SafetensorsPayload,
    decode_safetensors,
)
from ropeserve.settings import Settings

PARAMS = from_explicit({"rope_theta": 10_000.0, "head_dim": 16})
LAYOUT_SHAPES = {
    "bhtd": lambda batch, heads, tokens: (batch, heads, tokens, 16),
    "bthd": lambda batch, heads, tokens: (batch, tokens, heads, 16),
    "flat": lambda batch, heads, tokens: (tokens, heads * 16),
}


def payload(**tensors: torch.Tensor) -> SafetensorsPayload:
    body = bytearray(save(tensors))
    return decode_safetensors(body, max_elements=10**7, required=REQUIRED_TENSORS, optional=OPTIONAL_TENSORS)


def request(
    layout: str, batch: int, tokens: int, seed: int, dtype: torch.dtype = torch.bfloat16
) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    batch = 1 if layout == "flat" else batch
    shape = LAYOUT_SHAPES[layout]
    return {
        "q": torch.randn(shape(batch, 4, tokens), generator=generator).to(dtype),
        "k": torch.randn(shape(batch, 2, tokens), generator=generator).to(dtype),
        "positions": torch.randint(0, 4000, (batch, tokens) if layout != "flat" else (tokens,), generator=generator),
    }


def reference(tensors: dict[str, torch.Tensor], options: RotationOptions) -> tuple[torch.Tensor, torch.Tensor | None]:
    """rope/'s path: rope_cos_sin (or mrope_cos_sin) then apply_rotary, in the requested dtype."""
    params = options.resolved_params()
    q, k = tensors["q"], tensors.get("k")
    if options.dtype is not None:
        q, k = q.to(options.dtype), None if k is None else k.to(options.dtype)
    cos_sin = mrope_cos_sin if options.mrope else rope_cos_sin
    cs = cos_sin(params, tensors["positions"], pairing=options.pairing, dtype=q.dtype, cache=None)
    return apply_rotary(q, k, cs.cos, cs.sin, head_dim=params.head_dim, layout=options.layout, pairing=options.pairing)


def make_service(**settings: object) -> RotationService:
    base: dict[str, object] = {"access_log": False, "batch_max_wait_us": 20_000}
    return RotationService(Settings(**(base | settings)), torch.device("cpu"), TableCache())


async def rotate_all(service: RotationService, jobs: list[tuple[SafetensorsPayload, RotationOptions]]) -> list:
    await service.start()
    try:
        return await asyncio.gather(*(service.rotate(p, options) for p, options in jobs))
    finally:
        await service.stop()


def decoded(result) -> dict[str, torch.Tensor]:  # noqa: ANN001
    return load(result.body.to_bytes())


@pytest.mark.parametrize("batching", [True, False], ids=["batched", "unbatched"])
def test_concurrent_requests_match_the_reference(batching: bool, caplog: pytest.LogCaptureFixture) -> None:
    shapes = [("bhtd", 2, 5), ("bthd", 3, 4), ("flat", 1, 9), ("bhtd", 1, 7), ("bthd", 1, 1), ("flat", 1, 3)]
    requests = [request(layout, batch, tokens, seed) for seed, (layout, batch, tokens) in enumerate(shapes)]
    options = [RotationOptions(PARAMS, "gptj" if batching else "neox", layout) for layout, _, _ in shapes]
    results = asyncio.run(
        rotate_all(
            make_service(batching=batching),
            [(payload(**tensors), option) for tensors, option in zip(requests, options, strict=True)],
        )
    )
    for tensors, option, result in zip(requests, options, results, strict=True):
        expected_q, expected_k = reference(tensors, option)
        answer = decoded(result)
        assert torch.equal(answer["q"], expected_q) and torch.equal(answer["k"], expected_k)
    batch_sizes = [result.metadata["batch"]["size"] for result in results]
    assert max(batch_sizes) > 1 if batching else set(batch_sizes) == {1}
    assert not [record for record in caplog.records if record.name == "ropeserve.serving"]  # no batch fell apart


def test_mrope_request_matches_the_reference() -> None:
    normalized = normalize_config(preset_config("qwen2-vl-7b"))
    params = normalized.params()
    generator = torch.Generator().manual_seed(1)
    tensors = {
        "q": torch.randn(1, 6, 4, params.head_dim, generator=generator).to(torch.bfloat16),
        "positions": torch.randint(0, 300, (3, 1, 6), generator=generator, dtype=torch.int32),
    }
    options = RotationOptions(params, "neox", "bthd", mrope=True)
    (result,) = asyncio.run(rotate_all(make_service(), [(payload(**tensors), options)]))
    expected_q, _ = reference({**tensors, "positions": tensors["positions"].long()}, options)
    answer = decoded(result)
    assert set(answer) == {"q"} and torch.equal(answer["q"], expected_q)
    assert result.metadata["mrope"] == {"section": [16, 24, 24], "layout": "chunked"}


def test_dtype_option_rotates_in_the_requested_dtype() -> None:
    tensors = request("bthd", 2, 5, seed=3)
    options = RotationOptions(PARAMS, layout="bthd", dtype=torch.float32)
    (result,) = asyncio.run(rotate_all(make_service(), [(payload(**tensors), options)]))
    expected_q, expected_k = reference(tensors, options)
    answer = decoded(result)
    assert answer["q"].dtype == torch.float32 and torch.equal(answer["q"], expected_q)
    assert torch.equal(answer["k"], expected_k)


def test_rotary_dim_override_rotates_a_prefix() -> None:
    tensors = request("flat", 1, 6, seed=4, dtype=torch.float32)
    options = RotationOptions(PARAMS, layout="flat", rotary_dim=6)
    (result,) = asyncio.run(rotate_all(make_service(), [(payload(**tensors), options)]))
    answer = decoded(result)
    assert torch.equal(answer["q"], reference(tensors, options)[0])
    assert torch.equal(answer["q"].view(6, 4, 16)[..., 6:], tensors["q"].view(6, 4, 16)[..., 6:])
    assert result.metadata["rotary_dim"] == 6


def test_lone_request_is_rotated_in_its_own_buffer() -> None:
    tensors = request("bthd", 1, 8, seed=5)
    body = payload(**tensors)
    (result,) = asyncio.run(rotate_all(make_service(batching=False), [(body, RotationOptions(PARAMS, layout="bthd"))]))
    assert torch.equal(body.tensors["q"], decoded(result)["q"])
    q_bytes = torch.frombuffer(result.body.chunks[1], dtype=torch.uint8)
    assert q_bytes.data_ptr() == body.tensors["q"].data_ptr()  # the answer is the request's own bytes
    assert result.metadata["kernel"] == select_kernel("cpu")
    assert set(result.headers) == {"x-queue-time", "x-compute-time"}
    assert {"prepare_s", "queue_s", "compute_s", "total_s"} <= set(result.metadata["timings"])
    assert json.loads(load_metadata(result)) == result.metadata


def load_metadata(result) -> str:  # noqa: ANN001
    raw = result.body.to_bytes()
    header_length = int.from_bytes(raw[:8], "little")
    return json.loads(raw[8 : 8 + header_length])["__metadata__"][METADATA_KEY]


BAD_REQUESTS = {
    "negative position": (lambda t: {**t, "positions": -t["positions"] - 1}, {}, InvalidInput, "positions"),
    "float positions": (lambda t: {**t, "positions": t["positions"].float()}, {}, InvalidInput, "positions"),
    "integer q": (lambda t: {**t, "q": t["q"].to(torch.int32)}, {}, InvalidInput, "q"),
    "k dtype": (lambda t: {**t, "k": t["k"].float()}, {}, InvalidInput, "k"),
    "k tokens": (lambda t: {**t, "k": t["k"][:, :, :-1].contiguous()}, {}, InvalidInput, "k"),
    "mrope without section": (lambda t: t, {"mrope": True}, InvalidInput, "mrope_section"),
    "odd rotary_dim": (lambda t: t, {"rotary_dim": 5}, InvalidInput, "rotary_dim"),
    "rotary_dim over head_dim": (lambda t: t, {"rotary_dim": 32}, InvalidInput, "rotary_dim"),
}


@pytest.mark.parametrize("name", list(BAD_REQUESTS))
def test_invalid_requests_fail_before_compute(name: str) -> None:
    mutate, option_changes, error, field = BAD_REQUESTS[name]
    service = make_service()
    tensors = mutate(request("bhtd", 2, 5, seed=6))
    with pytest.raises(ServiceError) as raised:
        service.prepare(payload(**tensors), RotationOptions(PARAMS, **option_changes))
    assert type(raised.value) is error and raised.value.field == field


def test_position_count_limit() -> None:
    service = make_service(max_positions=4)
    with pytest.raises(LimitExceeded) as raised:
        service.prepare(payload(**request("flat", 1, 5, seed=7)), RotationOptions(PARAMS, layout="flat"))
    assert raised.value.field == "positions"


def mixed_layout_jobs(service: RotationService) -> tuple[list, list[RotationOptions], list]:
    shapes = [("bhtd", 2, 5), ("bthd", 3, 4), ("flat", 1, 9)]
    requests = [request(layout, batch, tokens, seed) for seed, (layout, batch, tokens) in enumerate(shapes)]
    options = [RotationOptions(PARAMS, "neox", layout) for layout, _, _ in shapes]
    return requests, options, [service.prepare(payload(**t), o) for t, o in zip(requests, options, strict=True)]


def test_a_batch_entry_point_rotates_every_job_in_its_own_buffer() -> None:
    """With the C kernel's batch entry point, ``run`` makes one call for all jobs and copies nothing."""
    service = make_service()
    assert service.rotate_batch is not None
    requests, options, jobs = mixed_layout_jobs(service)
    calls: list[int] = []
    batch = service.rotate_batch
    service.rotate_batch = lambda items, table: calls.append(len(items)) or batch(items, table)
    results = service.run(jobs)
    assert calls == [len(jobs)]
    for tensors, option, job, (q_out, k_out) in zip(requests, options, jobs, results, strict=True):
        assert q_out is job.q and k_out is job.k
        expected_q, expected_k = reference(tensors, option)
        assert torch.equal(q_out, expected_q) and torch.equal(k_out, expected_k)


def test_without_a_batch_entry_point_one_kernel_call_serves_the_concatenation() -> None:
    """``run`` on several jobs concatenates them; each answer is a view of the batch in its own layout."""
    service = make_service()
    service.rotate_batch = None
    requests, options, jobs = mixed_layout_jobs(service)
    calls: list[int] = []
    kernel = service.rotate_kernel
    service.rotate_kernel = lambda q, *args, **kwargs: calls.append(q.shape[0]) or kernel(q, *args, **kwargs)
    results = service.run(jobs)
    assert calls == [sum(job.tokens for job in jobs)]
    for tensors, option, (q_out, k_out) in zip(requests, options, results, strict=True):
        expected_q, expected_k = reference(tensors, option)
        assert torch.equal(q_out, expected_q) and torch.equal(k_out, expected_k)
