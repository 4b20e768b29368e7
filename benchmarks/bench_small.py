"""Benchmark: small JSON requests, ropeserve against a bare FastAPI app of the same shape (issue #15).

    .venv/bin/python benchmarks/bench_small.py [--rounds N] [--requests N] [--connections N]

Two uvicorn processes on 127.0.0.1 (free ports, uvloop + httptools, access log off, one worker each):
``ropeserve serve``, and a bare FastAPI app with two routes per endpoint, both taking the same body:
- the JSON echo (the issue's reference): FastAPI parses the body as JSON and the route returns a Python value of
  the same JSON shape and size as ropeserve's answer (captured first), which FastAPI serialises natively;
- the floor: the route parses the body and answers ropeserve's answer as stored bytes (no encoding at all).
A keep-alive load generator (asyncio, raw sockets, ``--connections`` connections, a bounded number of requests)
drives each endpoint on the three routes, interleaved within each round so that machine noise hits all of them;
the printed ratios are the medians of the per-round ratios of requests per second (ropeserve / echo: goal >= 70%;
ropeserve / floor: what is left above a server that does no work at all). The linter's answer cache serves a body
it answered before: ``lint one config`` repeats one body (a deployment gate's pattern), ``lint, a new config each``
sends a body never sent before with every request (the same rope parameters: linted, with the linter's
per-parameters results reused), ``lint, a new model each`` a new ``rope_theta`` each (everything computed afresh:
``FRESH_BODIES``). Then the server time of a
16-position cos/sin (``x-total-time``, measured by ropeserve's middleware; goal < 1 ms) over sequential
requests, and the JSON encoders measured on the cos/sin answer.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import timeit
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Annotated, Any

from fastapi import Body, FastAPI, Request
from fastapi.responses import Response

CONFIG = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "configs" / "Qwen__Qwen2.5-7B-Instruct.json"
ENDPOINTS: dict[str, tuple[str, str, object]] = {
    "GET probe": ("GET", "/health/live", None),
    "cos/sin 16 x 128": (
        "POST",
        "/v1/rope/cos-sin",
        {"rope": {"rope_type": "default", "rope_theta": 10000.0, "head_dim": 128}, "positions": list(range(16))},
    ),
    "positions packed 4 x 250": ("POST", "/v1/positions", {"segment_lengths": [250, 249, 251, 250]}),
    "M-RoPE positions": (
        "POST",
        "/v1/mrope/positions",
        {"preset": "qwen2.5-vl-7b", "rows": [[{"text": 12}, {"image": [1, 8, 8]}, {"text": 20}]]},
    ),
    "decode positions": ("POST", "/v1/positions", {"cache_lengths": [100, 2000, 35, 7], "num_new": 4}),
    "M-RoPE decode positions": (
        "POST",
        "/v1/mrope/decode-positions",
        {"mrope_position_deltas": [-10, 0, -3, -4], "cache_lengths": [100, 2000, 35, 7], "num_new": 4},
    ),
    "lint one config": ("POST", "/v1/config/validate", {"config": json.loads(CONFIG.read_text())}),
    "lint, a new config each": ("POST", "/v1/config/validate", {"config": json.loads(CONFIG.read_text())}),
    "lint, a new model each": ("POST", "/v1/config/validate", {"config": json.loads(CONFIG.read_text())}),
}


def _named(body: dict[str, Any], number: int) -> dict[str, Any]:
    return {**body, "config": {**body["config"], "_name_or_path": f"bench/config-{number:08d}"}}


def _new_theta(body: dict[str, Any], number: int) -> dict[str, Any]:
    return {**body, "config": {**body["config"], "rope_theta": 1_000_000.0 + number}}


FRESH_BODIES: dict[str, Callable[[dict[str, Any], int], dict[str, Any]]] = {
    "lint, a new config each": _named,
    "lint, a new model each": _new_theta,
}
"""Endpoints whose every request carries a body no earlier request sent, and how request ``number`` differs:
``lint one config`` repeats one body, as a deployment gate does (the stored answer after the first request); a new
config each (``_name_or_path`` numbered, the rope parameters of the row before) is never in the answer cache, so it
is linted, though the linter's per-rope-parameters results (numerics, derived lengths) are reused; a new model
each (``rope_theta`` numbered) misses those too: every number computed afresh."""


# --- servers -------------------------------------------------------------------------------------------------------


def bare_app(answers_dir: str):  # noqa: ANN201 - uvicorn app
    """FastAPI with the same shapes. GET: a small JSON object. POST /echo/{n}: FastAPI parses the body and the
    route returns endpoint n's answer as Python values (ropeserve's answer, parsed: the same JSON once FastAPI
    serialises it). POST /stored/{n}: parses the body, answers the stored bytes."""
    app = FastAPI()
    answers = {path.name: path.read_bytes() for path in Path(answers_dir).iterdir()}
    values = {name: json.loads(answer) for name, answer in answers.items()}

    @app.get("/health/live")
    async def live() -> dict[str, str]:
        return {"status": "live"}

    @app.post("/echo/{name}")
    async def echo(name: str, body: Annotated[Any, Body()]) -> Any:  # noqa: ANN401 - any JSON, like the endpoints' answers
        return values[name]

    @app.post("/stored/{name}")
    async def stored(name: str, request: Request) -> Response:
        json.loads(await request.body())
        return Response(answers[name], media_type="application/json")

    return app


def serve_bare(port: int, answers_dir: str) -> None:
    import uvicorn

    app = bare_app(answers_dir)
    uvicorn.run(
        app, host="127.0.0.1", port=port, log_level="warning", access_log=False, loop="uvloop", http="httptools"
    )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def server(kind: str, answers_dir: str, torch_threads: int | None = None) -> Iterator[int]:
    """The bare app, or ropeserve as deployed (``ropeserve serve``: uvloop, httptools), access log off."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    if torch_threads:
        env["OMP_NUM_THREADS"] = str(torch_threads)
    if kind == "bare":
        command = [sys.executable, __file__, "--serve-bare", "--port", str(port), "--answers", answers_dir]
    else:
        command = [sys.executable, "-m", "ropeserve.cli", "serve", "--port", str(port), "--device", "cpu"]
        env.update(ROPESERVE_ACCESS_LOG="false", ROPESERVE_HOST="127.0.0.1", ROPESERVE_LOG_LEVEL="warning")
    process = subprocess.Popen(command, env=env)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
                break
            if process.poll() is not None:
                raise RuntimeError(f"{kind} server exited with {process.returncode}")
            time.sleep(0.2)
        yield port
    finally:
        process.terminate()
        process.wait(timeout=30)


# --- load generator ------------------------------------------------------------------------------------------------


def request_bytes(method: str, path: str, body: object) -> bytes:
    payload = b"" if body is None else json.dumps(body).encode()
    head = f"{method} {path} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
    return head.encode() + f"content-length: {len(payload)}\r\n\r\n".encode() + payload


async def exchange(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, raw: bytes) -> tuple[int, dict, bytes]:
    writer.write(raw)
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {key.lower(): value.strip() for key, _, value in (line.partition(":") for line in lines[1:] if line)}
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return status, headers, body


async def _connection(port: int, raws: Sequence[bytes], statuses: list[int]) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        for raw in raws:
            status, _headers, _body = await exchange(reader, writer, raw)
            statuses.append(status)
    finally:
        writer.close()


async def _load(port: int, raws: Sequence[bytes], connections: int) -> float:
    statuses: list[int] = []
    started = time.perf_counter()
    per_connection = max(1, len(raws) // connections)
    shares = [raws[c * per_connection : (c + 1) * per_connection] for c in range(connections)]
    await asyncio.wait_for(asyncio.gather(*(_connection(port, share, statuses) for share in shares)), timeout=120)
    elapsed = time.perf_counter() - started
    if set(statuses) != {200}:
        raise RuntimeError(f"unexpected statuses {sorted(set(statuses))} for {raws[0][:60]!r}")
    return len(statuses) / elapsed


def rate(port: int, raws: Sequence[bytes], connections: int) -> float:
    """Requests per second over the keep-alive requests ``raws``, spread on ``connections`` connections."""
    return asyncio.run(_load(port, raws, connections))


class Bodies:
    """The request bytes of one endpoint on one side: the same bytes every time, or (``vary``) bytes no earlier
    request of the run sent, ``vary(body, number)`` for the next numbers (``FRESH_BODIES``)."""

    def __init__(
        self, method: str, path: str, body: object, vary: Callable[[dict[str, Any], int], dict[str, Any]] | None
    ) -> None:
        self.method, self.path, self.body, self.vary = method, path, body, vary
        self.sent = 0

    def take(self, count: int) -> list[bytes]:
        if self.vary is None:
            return [request_bytes(self.method, self.path, self.body)] * count
        assert isinstance(self.body, dict)
        numbered = [self.vary(self.body, self.sent + k) for k in range(count)]
        self.sent += count
        return [request_bytes(self.method, self.path, body) for body in numbered]


async def _one(port: int, raw: bytes) -> tuple[dict, bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        status, headers, body = await exchange(reader, writer, raw)
    finally:
        writer.close()
    if status != 200:
        raise RuntimeError(f"status {status}: {body[:300]!r}")
    return headers, body


async def _server_times(port: int, raw: bytes, count: int) -> list[float]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        return [float((await exchange(reader, writer, raw))[1]["x-total-time"]) for _ in range(count)]
    finally:
        writer.close()


# --- report --------------------------------------------------------------------------------------------------------


SIDES = ("echo", "floor", "ropeserve")


def capture_answers(port: int, answers_dir: Path) -> dict[str, tuple[dict[str, Bodies], int]]:
    """Ropeserve's answers (stored for the bare app), and per endpoint the request bodies of each side."""
    requests: dict[str, tuple[dict[str, Bodies], int]] = {}
    for index, (name, (method, path, body)) in enumerate(ENDPOINTS.items()):
        fresh = FRESH_BODIES.get(name)
        ours = Bodies(method, path, body, fresh)
        _, answer = asyncio.run(_one(port, ours.take(1)[0]))
        (answers_dir / str(index)).write_bytes(answer)
        bare = {
            side: path if method == "GET" else f"/{route}/{index}"
            for side, route in (("echo", "echo"), ("floor", "stored"))
        }
        sides = {side: Bodies(method, bare[side], body, fresh) for side in ("echo", "floor")}
        requests[name] = ({**sides, "ropeserve": ours}, len(answer))
    return requests


def encoder_figures(answer: bytes) -> None:
    """Time the JSON encoders on the cos/sin answer's Python lists (the values the service serialises)."""
    import pydantic_core

    values = json.loads(answer)
    encoders = {"json.dumps (stdlib)": json.dumps, "pydantic_core.to_json": pydantic_core.to_json}
    for module in ("orjson", "msgspec"):
        with contextlib.suppress(ImportError):
            encoders[module] = __import__(module).dumps if module == "orjson" else __import__(module).json.encode
    print("\nJSON encoders on the cos/sin answer (16 x 128 x 2 + 64 floats):")
    for name, encode in encoders.items():
        identical = json.loads(encode(values)) == values
        per_call = min(timeit.repeat(lambda encode=encode: encode(values), number=50, repeat=5)) / 50
        print(f"  {name:24s} {per_call * 1e6:8.0f} us   values identical after parsing: {identical}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=400, help="requests per endpoint, per side and round")
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument(
        "--torch-threads",
        type=int,
        default=0,
        help="OMP_NUM_THREADS of the ropeserve process (0: torch's default, one per core); the Kubernetes "
        "manifests set it from the CPU limit",
    )
    parser.add_argument("--only", help="run the endpoints whose name contains this text")
    parser.add_argument("--serve-bare", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--answers", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_bare:
        serve_bare(args.port, args.answers)
        return
    threads = args.torch_threads or "default"
    load = ", ".join(f"{value:.1f}" for value in os.getloadavg())
    print(f"{os.cpu_count()} CPUs, load average {load}; ropeserve torch threads: {threads}")
    with tempfile.TemporaryDirectory() as answers_dir, server("ropeserve", answers_dir, args.torch_threads) as ours:
        requests = capture_answers(ours, Path(answers_dir))
        with server("bare", answers_dir) as bare:
            print(f"{args.rounds} rounds x {args.requests} requests per side, {args.connections} connections")
            print(
                f"  {'endpoint':26s} {'answer':>8s} {'echo req/s':>11s} {'floor':>7s} {'ropeserve':>10s} "
                f"{'/ echo':>7s} {'range':>10s} {'/ floor':>8s}"
            )
            ports = {"echo": bare, "floor": bare, "ropeserve": ours}
            for name, (raws, size) in requests.items():
                if args.only and args.only not in name:
                    continue
                for side in SIDES:  # warm every route
                    rate(ports[side], raws[side].take(50), 4)
                rounds = [
                    {side: rate(ports[side], raws[side].take(args.requests), args.connections) for side in SIDES}
                    for _ in range(args.rounds)
                ]
                echo = [r["ropeserve"] / r["echo"] for r in rounds]
                floor = [r["ropeserve"] / r["floor"] for r in rounds]
                medians = {side: statistics.median(r[side] for r in rounds) for side in SIDES}
                print(
                    f"  {name:26s} {size / 1000:6.1f}kB {medians['echo']:11.0f} {medians['floor']:7.0f} "
                    f"{medians['ropeserve']:10.0f} {statistics.median(echo):7.0%} "
                    f"{min(echo):4.0%}-{max(echo):.0%} {statistics.median(floor):8.0%}"
                )
        cos_sin = requests["cos/sin 16 x 128"][0]["ropeserve"].take(1)[0]
        times = asyncio.run(_server_times(ours, cos_sin, 300))[50:]
        print(
            f"\nserver time of a 16-position cos/sin (x-total-time, sequential): median "
            f"{statistics.median(times) * 1e3:.3f} ms, best {min(times) * 1e3:.3f} ms (goal < 1 ms)"
        )
        encoder_figures(asyncio.run(_one(ours, cos_sin))[1])


if __name__ == "__main__":
    main()
