"""Benchmark: /health/live latency while clients post JSON bodies at the size cap (issue 13, item 7).

Starts ``ropeserve serve`` (default settings, e.g. ``max_json_body_bytes`` 2 MiB) on a free loopback port and probes
``/health/live`` every 20 ms: first idle (the reference), then while ``--clients`` threads post position lists
of just under the JSON cap to ``/v1/rope/cos-sin`` (parsed, validated, answered 422 for a bad theta, as in the
issue's 80 MB case), then while they post 80 MB bodies (refused 413 from Content-Length). The table gives probe
p50/p99 in each phase and the loaded/idle ratio; the goal is p99 under 100 ms with the cap-sized load.

    .venv/bin/python benchmarks/bench_probe_latency.py [--seconds S] [--clients N]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor

import httpx

from ropeserve.settings import Settings

GOAL_P99_S = 0.100
PROBE_INTERVAL_S = 0.02
JSON = {"content-type": "application/json"}
BAD_ROPE = {"rope_theta": -1.0, "head_dim": 16}


def positions_body(size: int) -> bytes:
    """A /v1/rope/cos-sin body of about ``size`` bytes: a long positions list and an invalid theta (422)."""
    count = size // 8
    body = json.dumps({"rope": BAD_ROPE, "positions": list(range(1_000_000, 1_000_000 + count))}).encode()
    while len(body) > size:
        count = count * size // len(body) - 1
        body = json.dumps({"rope": BAD_ROPE, "positions": list(range(1_000_000, 1_000_000 + count))}).encode()
    return body


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_server(port: int) -> subprocess.Popen[bytes]:
    env = {**os.environ, "ROPESERVE_PORT": str(port), "ROPESERVE_DEVICE": "cpu", "ROPESERVE_ACCESS_LOG": "false"}
    command = [sys.executable, "-m", "ropeserve.cli", "serve"]
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health/ready", timeout=1).status_code == 200:
                return process
        except httpx.HTTPError:
            time.sleep(0.2)
    process.kill()
    raise RuntimeError("ropeserve did not become ready")


def probe_latencies(url: str, seconds: float) -> list[float]:
    latencies = []
    deadline = time.monotonic() + seconds
    with httpx.Client(base_url=url, timeout=10) as client:
        while time.monotonic() < deadline:
            started = time.perf_counter()
            assert client.get("/health/live").status_code == 200
            latencies.append(time.perf_counter() - started)
            time.sleep(PROBE_INTERVAL_S)
    return latencies


def post_until(url: str, body: bytes, stop_at: float) -> Counter[int]:
    """One load process: post ``body`` until ``stop_at`` (monotonic); the answers' status counts."""
    statuses: Counter[int] = Counter()
    with httpx.Client(base_url=url, timeout=60) as client:
        while time.monotonic() < stop_at:
            try:
                statuses[client.post("/v1/rope/cos-sin", content=body, headers=JSON).status_code] += 1
            except httpx.HTTPError:
                statuses[0] += 1  # the server closed mid-upload after a 413 from Content-Length
    return statuses


def under_load(url: str, seconds: float, clients: int, body: bytes) -> tuple[list[float], Counter[int]]:
    """Probe latencies while ``clients`` processes (not threads: the prober keeps its own GIL) post ``body``."""
    stop_at = time.monotonic() + seconds + 1.0
    with ProcessPoolExecutor(clients) as pool:
        loads = [pool.submit(post_until, url, body, stop_at) for _ in range(clients)]
        time.sleep(0.5)
        latencies = probe_latencies(url, seconds)
        return latencies, sum((load.result() for load in loads), Counter())


def percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 else values[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=8.0, help="probing time per phase")
    parser.add_argument("--clients", type=int, default=4, help="concurrent posting clients")
    args = parser.parse_args()
    cap = Settings().max_json_body_bytes
    at_cap, huge = positions_body(cap), b" " * (80 * 10**6)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = start_server(port)
    try:
        idle = probe_latencies(url, args.seconds)
        loaded, statuses = under_load(url, args.seconds, args.clients, at_cap)
        refused, refused_statuses = under_load(url, args.seconds, args.clients, huge)
    finally:
        server.terminate()
        server.wait(30)
    print(f"probe /health/live every {PROBE_INTERVAL_S * 1e3:.0f} ms, {args.clients} posting clients, JSON cap {cap} B")
    print(f"{'phase':<34} {'probes':>7} {'p50 ms':>8} {'p99 ms':>8} {'p99/idle':>9}  answers")
    reference = percentile(idle, 99)
    for name, latencies, answers in (
        ("idle", idle, Counter[int]()),
        (f"{len(at_cap) / 2**20:.1f} MiB positions (422)", loaded, statuses),
        ("80 MB bodies (413)", refused, refused_statuses),
    ):
        p50, p99 = percentile(latencies, 50), percentile(latencies, 99)
        figures = f"{p50 * 1e3:>8.2f} {p99 * 1e3:>8.2f} {p99 / reference:>9.1f}"
        print(f"{name:<34} {len(latencies):>7} {figures}  {dict(answers)}")
    worst = max(percentile(loaded, 99), percentile(refused, 99))
    verdict = "meets" if worst < GOAL_P99_S else "MISSES"
    print(f"worst loaded p99 {worst * 1e3:.1f} ms: {verdict} the {GOAL_P99_S * 1e3:.0f} ms goal")
    return 0 if worst < GOAL_P99_S else 1


if __name__ == "__main__":
    sys.exit(main())
