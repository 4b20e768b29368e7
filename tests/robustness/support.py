"""Shared helpers for the robustness suite: request bodies, raw sockets, problem checks, metrics and RSS probes."""

from __future__ import annotations

import json
import socket
import statistics
import struct
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterable
from typing import Any

import httpx
import psutil
import torch
from safetensors.torch import save

BODY_CAP_BYTES = 8 << 20
QUEUE_SIZE = 2
BATCH_WINDOW_S = 1.5
BATCH_MAX_TOKENS = 64
ONE_THREAD = {"OMP_NUM_THREADS": "1"}
"""Settings of the servers in conftest.py that the tests also need (one place, imported by both)."""
SAFETENSORS = {"content-type": "application/x-safetensors"}
ROPE_APPLY, MROPE_APPLY, RESAMPLE = "/v1/rope/apply", "/v1/mrope/apply", "/v1/pe/resample"
TENSOR_ENDPOINTS = (ROPE_APPLY, MROPE_APPLY, RESAMPLE)
ROPE = {"rope_theta": 10_000.0, "head_dim": 16}
MROPE_PRESET = "qwen2.5-vl-7b"
MROPE_HEAD_DIM = 128
DROPPED_METRIC = "ropeserve_dropped_requests_total"
SLOW_READ_BYTES = 512
"""What ``slow_json_exchange`` reads at a time: an answer of a few kB arrives in many pieces."""


def raw_safetensors(header: dict[str, Any] | bytes, data: bytes = b"", *, claimed_length: int | None = None) -> bytes:
    """A safetensors file built by hand (so it can lie): u64 header length, header bytes, data."""
    header_bytes = header if isinstance(header, bytes) else json.dumps(header).encode()
    length = len(header_bytes) if claimed_length is None else claimed_length
    return struct.pack("<Q", length) + header_bytes + data


def with_params(params: dict[str, Any]) -> dict[str, Any]:
    """The ``__metadata__`` entry carrying request parameters."""
    return {"__metadata__": {"ropeserve": json.dumps(params)}}


def rope_body(
    tokens: int = 4,
    heads: int = 2,
    q: torch.Tensor | None = None,
    positions: torch.Tensor | None = None,
    **params: Any,
) -> bytes:
    """A /v1/rope/apply body: q [1, heads, tokens, 16] float32 and positions 0..tokens-1 unless given."""
    q = torch.randn(1, heads, tokens, ROPE["head_dim"]) if q is None else q
    positions = torch.arange(q.shape[2]) if positions is None else positions
    return save({"q": q, "positions": positions}, metadata={"ropeserve": json.dumps({"rope": ROPE} | params)})


def mrope_body(tokens: int = 4) -> bytes:
    """A valid /v1/mrope/apply body for the Qwen2.5-VL preset (T/H/W positions all equal)."""
    q = torch.randn(1, 2, tokens, MROPE_HEAD_DIM)
    positions = torch.arange(tokens).expand(3, tokens).contiguous()
    return save({"q": q, "positions": positions}, metadata={"ropeserve": json.dumps({"preset": MROPE_PRESET})})


def resample_body(table: torch.Tensor | None = None) -> bytes:
    """A valid /v1/pe/resample body: a 1 + 2×2 row table resampled to 3×3."""
    table = torch.randn(5, 8) if table is None else table
    params = {"source_grid": [2, 2], "target_grid": [3, 3], "prefix_rows": 1}
    return save({"table": table}, metadata={"ropeserve": json.dumps(params)})


VALID_BODIES: dict[str, Callable[[], bytes]] = {ROPE_APPLY: rope_body, MROPE_APPLY: mrope_body, RESAMPLE: resample_body}


def assert_problem(response: httpx.Response, statuses: Iterable[int] = range(400, 500)) -> dict[str, Any]:
    """``response`` is a problem+json answer with one of ``statuses``; returns the document."""
    assert response.status_code in statuses, f"{response.status_code}: {response.text[:500]}"
    assert response.headers["content-type"].startswith("application/problem+json"), response.headers
    document = response.json()
    assert document["status"] == response.status_code and document["type"] and document["detail"]
    return document


def assert_healthy(client: httpx.Client) -> None:
    """Ready, and a normal rotation still succeeds."""
    assert client.get("/health/ready").status_code == 200
    response = client.post(ROPE_APPLY, content=rope_body(), headers=SAFETENSORS)
    assert response.status_code == 200, response.text


def metric_total(metrics_text: str, name: str) -> float:
    """Sum of every sample of ``name`` (all label sets) in a Prometheus text exposition."""
    total = 0.0
    for line in metrics_text.splitlines():
        if line.startswith(name) and line[len(name) : len(name) + 1] in (" ", "{"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def scrape(client: httpx.Client, name: str) -> float:
    return metric_total(client.get("/metrics").text, name)


def server_5xx(client: httpx.Client) -> float:
    """5xx answers the server recorded (``ropeserve_requests_total`` by status), including unseen ones."""
    lines = client.get("/metrics").text.splitlines()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in lines
        if line.startswith("ropeserve_http_requests_total{") and 'status="5' in line
    )


def rss_mb(pid: int) -> float:
    return psutil.Process(pid).memory_info().rss / 2**20


def wait_for(check: Callable[[], bool], timeout: float, what: str, interval: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def median_latency_s(client: httpx.Client, path: str, body: bytes, count: int = 7) -> float:
    """Median wall time of ``count`` sequential successful requests."""
    times = []
    for _ in range(count):
        started = time.perf_counter()
        response = client.post(path, content=body, headers=SAFETENSORS)
        times.append(time.perf_counter() - started)
        assert response.status_code == 200, response.text
    return statistics.median(times)


def open_socket(url: str, timeout: float = 10.0) -> socket.socket:
    parts = urllib.parse.urlsplit(url)
    sock = socket.create_connection((parts.hostname, parts.port), timeout=timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def request_head(path: str, headers: dict[str, str]) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", *(f"{key}: {value}" for key, value in headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def slow_json_exchange(port: int, path: str, body: object, *, leave: bool = False) -> bytes | None:
    """POST ``body`` as JSON on a raw socket (``Connection: close``) and read the answer ``SLOW_READ_BYTES`` at a
    time; returns its body after asserting a 200. ``leave``: close the socket right after sending (None)."""
    payload = json.dumps(body).encode()
    headers = {"Content-Type": "application/json", "Content-Length": str(len(payload)), "Connection": "close"}
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(request_head(path, headers) + payload)
        if leave:
            return None
        chunks = []
        while chunk := sock.recv(SLOW_READ_BYTES):
            chunks.append(chunk)
    status, _, rest = b"".join(chunks).partition(b"\r\n")
    assert b" 200 " in status, status + rest[:300]
    return rest.split(b"\r\n\r\n", 1)[1]


def run_concurrently(runs: Iterable[tuple[Callable[[int], None], int]], failures: list[str]) -> None:
    """Each ``(run, seed)`` in a thread of its own, all at once; an exception a run raises is appended to ``failures``
    (``run``'s name and seed first). Asserts that every thread ended within two minutes."""

    def reporting(run: Callable[[int], None], seed: int) -> None:
        try:
            run(seed)
        except Exception as error:  # noqa: BLE001 - a thread's failure is reported by the test
            failures.append(f"{run.__name__} {seed}: {error!r}")

    threads = [threading.Thread(target=reporting, args=run) for run in runs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not any(thread.is_alive() for thread in threads)


def read_status(sock: socket.socket) -> int:
    """The status code of the HTTP response arriving on ``sock`` (reads until the status line is complete)."""
    received = b""
    while b"\r\n" not in received:
        chunk = sock.recv(4096)
        if not chunk:
            raise AssertionError(f"connection closed before a status line; got {received!r}")
        received += chunk
    return int(received.split(b" ", 2)[1])


def send_until_refused(sock: socket.socket, chunks: Iterable[bytes]) -> int:
    """Send ``chunks`` until the server stops reading (reset or closed); returns the bytes it took."""
    sent = 0
    try:
        for chunk in chunks:
            sock.sendall(chunk)
            sent += len(chunk)
    except (BrokenPipeError, ConnectionResetError, TimeoutError):
        pass
    return sent
