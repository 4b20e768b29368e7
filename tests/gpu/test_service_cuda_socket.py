"""The service on CUDA over a real socket: pinned staging, batched launches and copy-back keep requests apart.

Concurrent same-size requests (batched into one launch), a slow reader and a client that hangs up halfway
through its upload: every finished request gets exactly its own rotation, and the server stays healthy.
"""

from __future__ import annotations

import http.client
import json
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import torch
from integration_support import running_server  # tests/integration, on pytest's pythonpath (pyproject.toml)
from safetensors.torch import load, save

from ropeserve.config import from_explicit
from ropeserve.rope import apply_rotary, rope_cos_sin

pytestmark = pytest.mark.gpu

ROPE = {"rope_theta": 500_000.0, "head_dim": 128}
TOKENS, Q_HEADS, K_HEADS = 2048, 8, 2
PATH = "/v1/rope/apply"
HEADERS = {"content-type": "application/x-safetensors", "accept": "application/x-safetensors"}


def request(seed: int) -> tuple[bytes, torch.Tensor, torch.Tensor]:
    """A flat bf16 body (about 5 MiB) and its expected (q, k) from rope/'s reference path on the CPU."""
    generator = torch.Generator().manual_seed(seed)
    q = torch.randn(TOKENS, Q_HEADS * 128, generator=generator).to(torch.bfloat16)
    k = torch.randn(TOKENS, K_HEADS * 128, generator=generator).to(torch.bfloat16)
    positions = torch.randint(0, 30_000, (TOKENS,), generator=generator)
    cs = rope_cos_sin(from_explicit(ROPE), positions, dtype=q.dtype, cache=None)
    q_ref, k_ref = apply_rotary(q, k, cs.cos, cs.sin, head_dim=128, layout="flat")
    metadata = {"ropeserve": json.dumps({"rope": ROPE, "layout": "flat"})}
    return save({"q": q, "k": k, "positions": positions}, metadata), q_ref, k_ref


def assert_answer(content: bytes, q_ref: torch.Tensor, k_ref: torch.Tensor | None) -> None:
    answer = load(content)
    assert torch.equal(answer["q"], q_ref) and torch.equal(answer["k"], k_ref)


def slow_read(port: int, body: bytes) -> bytes:
    """POST ``body`` and read the answer 64 KiB at a time with pauses (a slow client)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    connection.request("POST", PATH, body=body, headers=HEADERS)
    response = connection.getresponse()
    assert response.status == 200
    chunks = []
    while chunk := response.read(1 << 16):
        chunks.append(chunk)
        time.sleep(0.005)
    connection.close()
    return b"".join(chunks)


def abandon(port: int, body: bytes) -> None:
    """Send the headers and half of ``body``, then hang up."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        head = f"POST {PATH} HTTP/1.1\r\nhost: x\r\ncontent-type: application/x-safetensors\r\n"
        sock.sendall(f"{head}content-length: {len(body)}\r\n\r\n".encode() + body[: len(body) // 2])


def test_cuda_service_keeps_concurrent_slow_and_abandoned_requests_apart(tmp_path: Path) -> None:
    requests = [request(seed) for seed in range(10)]
    with (
        running_server(tmp_path, ROPESERVE_DEVICE="cuda", ROPESERVE_BATCH_MAX_WAIT_US="20000") as server,
        httpx.Client(base_url=server.url, timeout=60) as client,
        ThreadPoolExecutor(10) as pool,
    ):
        abandoned = [pool.submit(abandon, server.port, requests[i][0]) for i in (8, 9)]
        slow = pool.submit(slow_read, server.port, requests[7][0])
        posted = [pool.submit(client.post, PATH, content=body, headers=HEADERS) for body, _, _ in requests[:7]]
        for future, (_, q_ref, k_ref) in zip(posted, requests, strict=False):
            response = future.result()
            assert response.status_code == 200, response.text
            assert_answer(response.content, q_ref, k_ref)
        assert_answer(slow.result(), *requests[7][1:])
        for future in abandoned:
            future.result()
        again = client.post(PATH, content=requests[0][0], headers=HEADERS)
        assert again.status_code == 200 and client.get("/health/ready").status_code == 200
        assert_answer(again.content, *requests[0][1:])
