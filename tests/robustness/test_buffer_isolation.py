"""Pooled body buffers never leak one request's bytes into another's answer (issue 13, item 1).

Over a real socket against a real uvicorn (httptools + uvloop): slow readers take their answers a few KiB at a
time while other clients send requests of the same size class, so every freed buffer is reused at once; other
clients leave mid-answer. Every answer that arrives is compared, element by element, with the rotation computed
here. Before the fix the last up-to-64 KiB of a slow reader's answer were still referenced by the transport when
its buffer went back to the pool, and came out holding another request's bytes.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator

import httpx
import pytest
import torch
from safetensors.torch import load, save

from ropeserve.api.negotiation import split_tail
from ropeserve.config import from_explicit
from ropeserve.rope import apply_rotary, rope_cos_sin
from ropeserve_client import testing
from ropeserve_client.testing import LocalServer
from support import ROPE, ROPE_APPLY, SAFETENSORS, request_head, server_5xx

listening_socket = testing._listening_socket

TOKENS, HEADS = 4192, 8
"""q is [1, 8, 4096, 16] float32: 2 MiB, so every body lands in the pool's 4 MiB size class."""
SERVER_SNDBUF = 65536
"""The server's socket send buffer, pinned small (as on hosts with a small ``net.ipv4.tcp_wmem``) so that a
slow reader's answer drains from the transport in small steps and its end regularly waits there."""
SLOW_READERS = 4
LEAVERS = 4
FAST_CLIENTS = 3
FAST_REQUESTS_MAX = 60
SLOW_READ_BYTES = 8192
SLOW_READ_PAUSE_S = 0.004


@pytest.fixture(scope="module")
def pooled_server() -> Iterator[LocalServer]:
    """Default pool (on), no batching (each request owns its buffer end to end), one torch thread."""
    env = {"ROPESERVE_BATCHING": "false", "OMP_NUM_THREADS": "1"}

    def small_send_buffer() -> socket.socket:
        sock = listening_socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SERVER_SNDBUF)  # accepted sockets inherit it
        return sock

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(testing, "_listening_socket", small_send_buffer)
        with LocalServer(env=env) as server:
            yield server


def request(seed: int) -> tuple[bytes, torch.Tensor]:
    """A rotation body with q drawn from ``seed`` and the rotated q expected back."""
    q = torch.randn(1, HEADS, TOKENS, ROPE["head_dim"], generator=torch.Generator().manual_seed(seed))
    positions = torch.arange(TOKENS)
    params = from_explicit({"rope_type": "default", **ROPE})
    table = rope_cos_sin(params, positions, cache=None)
    expected, _ = apply_rotary(q, None, table.cos, table.sin, head_dim=ROPE["head_dim"])
    body = save({"q": q, "positions": positions}, metadata={"ropeserve": json.dumps({"rope": ROPE})})
    return body, expected


def assert_rotated(answer: bytes, expected: torch.Tensor, who: str) -> None:
    got = load(answer)["q"]
    mismatched = int((~torch.isclose(got, expected, rtol=1e-5, atol=1e-5)).sum())
    assert mismatched == 0, f"{who}: {mismatched} of {expected.numel()} elements are not this request's answer"


def raw_exchange(url: str, body: bytes, read_limit: int | None = None) -> bytes:
    """POST ``body`` on a socket with a small receive buffer, then read the answer slowly; returns the body.

    With ``read_limit`` the client leaves after that many bytes (mid-answer) and b"" is returned.
    """
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SLOW_READ_BYTES)
    host, port = url.removeprefix("http://").split(":")
    sock.settimeout(30)
    sock.connect((host, int(port)))
    with sock:
        sock.sendall(request_head(ROPE_APPLY, {**SAFETENSORS, "content-length": str(len(body))}) + body)
        received = b""
        while b"\r\n\r\n" not in received:
            received += sock.recv(SLOW_READ_BYTES)
        head, _, content = received.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200"), head
        length = int(
            next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length"))
        )
        while len(content) < length:
            if read_limit is not None and len(content) >= read_limit:
                return b""
            chunk = sock.recv(SLOW_READ_BYTES)
            assert chunk, "the server closed the connection mid-answer"
            content += chunk
            threading.Event().wait(SLOW_READ_PAUSE_S)
        return content


def fast_client(url: str, seed: int, stop: threading.Event, failures: list[str]) -> None:
    with httpx.Client(base_url=url, timeout=30) as client:
        for index in range(FAST_REQUESTS_MAX):
            if stop.is_set():
                return
            body, expected = request(seed * 1000 + index)
            try:
                response = client.post(ROPE_APPLY, content=body, headers=SAFETENSORS)
                assert response.status_code == 200, response.text
                assert_rotated(response.content, expected, f"fast client {seed} request {index}")
            except AssertionError as error:
                failures.append(str(error))


def slow_reader(url: str, seed: int, failures: list[str]) -> None:
    body, expected = request(seed)
    try:
        assert_rotated(raw_exchange(url, body), expected, f"slow reader {seed}")
    except AssertionError as error:
        failures.append(str(error))


def leaver(url: str, seed: int, failures: list[str]) -> None:
    body, _ = request(seed)
    try:
        raw_exchange(url, body, read_limit=len(body) // 2)
    except (AssertionError, OSError) as error:
        failures.append(f"leaver {seed}: {error!r}")


@pytest.mark.timeout(180)
def test_slow_readers_and_leavers_only_ever_get_their_own_bytes(pooled_server: LocalServer) -> None:
    url, stop, failures = pooled_server.url, threading.Event(), []
    fast = [threading.Thread(target=fast_client, args=(url, seed, stop, failures)) for seed in range(FAST_CLIENTS)]
    others = [threading.Thread(target=slow_reader, args=(url, 100 + i, failures)) for i in range(SLOW_READERS)]
    others += [threading.Thread(target=leaver, args=(url, 200 + i, failures)) for i in range(LEAVERS)]
    for thread in fast + others:
        thread.start()
    for thread in others:
        thread.join(120)
    stop.set()
    for thread in fast:
        thread.join(60)
    assert failures == []
    with httpx.Client(base_url=url, timeout=30) as client:
        assert server_5xx(client) == 0


def test_split_tail_copies_exactly_the_last_bytes_across_chunks() -> None:
    chunks = (b"head", memoryview(bytearray(range(10))), memoryview(bytearray(b"xyz")))
    pieces, tail = split_tail(chunks, 5)
    assert type(tail) is bytes and tail == b"\x08\x09xyz"
    assert b"".join(pieces) + tail == b"head" + bytes(range(10)) + b"xyz"
    assert all(isinstance(piece, memoryview) for piece in pieces)  # the rest stays views, not copies
    assert split_tail(chunks, 100) == ([], b"head" + bytes(range(10)) + b"xyz")
