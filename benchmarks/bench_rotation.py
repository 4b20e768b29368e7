"""Benchmark: Q/K rotation in process, over loopback HTTP, and batched vs unbatched (issue #4).

    .venv/bin/python benchmarks/bench_rotation.py [--rounds N] [--compile] [--skip-in-process] [--skip-http]
        [--skip-batching]

1. In process, CPU, float32 and bfloat16, T=8192, 28 q heads, 4 kv heads, head_dim 128 ([B,H,T,D]): transformers' eager
   path (Qwen2RotaryEmbedding cos/sin + apply_rotary_pos_emb), the native, fused and C kernels (cos/sin lookup
   included), optionally a naive torch.compile of the eager formula, each against a plain copy of the same Q/K
   bytes (``torch.empty_like(x).copy_(x)``). Every round times the copy and the candidate back to back; the
   median of the per-round ratios is printed, so machine noise hits both sides.
2. Loopback HTTP: a real uvicorn on 127.0.0.1 (free port) rotates a 64 MiB bfloat16 Q/K body (flat layout,
   T=8192, 28+4 heads × 128); end-to-end client time against the in-process copy of those bytes, with where
   the time goes (client send, server read/decode/prepare/queue/compute from the response metadata, response).
   The floor is measured in the same run: a bare TCP server process on 127.0.0.1 that receives the same bytes
   and sends them back (no HTTP, no parsing, no compute), i.e. what any loopback service pays for the payload.
3. Batching: 32 concurrent clients posting T=256 requests (``--tokens``; same heads, bfloat16), batching on vs off.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http.client
import json
import multiprocessing
import os
import resource
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from safetensors.torch import save
from transformers import Qwen2Config
from transformers.models.qwen2.modeling_qwen2 import Qwen2RotaryEmbedding, apply_rotary_pos_emb

from ropeserve.api import create_app
from ropeserve.config import from_explicit
from ropeserve.kernels import RotationSpec, get_kernel
from ropeserve.rope.tables import TableCache

TOKENS, Q_HEADS, KV_HEADS, HEAD_DIM, THETA = 8192, 28, 4, 128, 1_000_000.0
ROPE = {"rope_theta": THETA, "head_dim": HEAD_DIM}
SAFETENSORS = {"content-type": "application/x-safetensors"}


def app_with_rotation():  # noqa: ANN201 - uvicorn factory
    """The service app (create_app wires the rotation routes)."""
    return create_app()


# --- 1. in process -------------------------------------------------------------------------------------------------


def copy_qk(q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.empty_like(q).copy_(q), torch.empty_like(k).copy_(k)


def in_process_candidates(
    with_compile: bool, dtype: torch.dtype
) -> tuple[dict[str, Callable[[], object]], Callable[[], object]]:
    generator = torch.Generator().manual_seed(0)
    q = torch.randn(1, Q_HEADS, TOKENS, HEAD_DIM, generator=generator).to(dtype)
    k = torch.randn(1, KV_HEADS, TOKENS, HEAD_DIM, generator=generator).to(dtype)
    positions = torch.arange(TOKENS)
    config = Qwen2Config(
        hidden_size=Q_HEADS * HEAD_DIM, num_attention_heads=Q_HEADS, num_key_value_heads=KV_HEADS, rope_theta=THETA
    )
    rotary = Qwen2RotaryEmbedding(config)
    table = TableCache().get(from_explicit(ROPE), None, torch.device("cpu"))
    spec = RotationSpec(HEAD_DIM)
    kernels = {name: get_kernel(name) for name in ("native", "fused", "c")}
    q_work, k_work = q.clone(), k.clone()

    def transformers_eager() -> object:
        cos, sin = rotary(q, positions[None])
        return apply_rotary_pos_emb(q, k, cos, sin)

    candidates: dict[str, Callable[[], object]] = {
        "transformers eager (cos/sin + apply)": transformers_eager,
        "ropeserve native": lambda: kernels["native"](q, k, positions, table, spec),
        "ropeserve fused": lambda: kernels["fused"](q, k, positions, table, spec),
        "ropeserve fused, in place": lambda: kernels["fused"](q_work, k_work, positions, table, spec, inplace=True),
        "ropeserve c": lambda: kernels["c"](q, k, positions, table, spec),
        "ropeserve c, in place": lambda: kernels["c"](q_work, k_work, positions, table, spec, inplace=True),
    }
    if with_compile:
        compiled = torch.compile(apply_rotary_pos_emb)
        cos, sin = rotary(q, positions[None])
        started = time.perf_counter()
        compiled(q, k, cos, sin)
        print(f"  (torch.compile of apply_rotary_pos_emb compiled in {time.perf_counter() - started:.1f} s)")
        candidates["naive torch.compile (apply only)"] = lambda: compiled(q, k, cos, sin)
    return candidates, lambda: copy_qk(q, k)


def seconds(fn: Callable[[], object]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def ratio_table(candidates: dict[str, Callable[[], object]], baseline: Callable[[], object], rounds: int) -> None:
    """Time each candidate right after the copy, ``rounds`` times; print median and best times and ratios.

    ``x median`` is the median of the per-round ratios; ``x best`` compares the fastest runs, the better
    estimate on a machine shared with other work.
    """
    for fn in [baseline, *candidates.values()]:
        fn()
    times: dict[str, list[float]] = {name: [] for name in candidates}
    ratios: dict[str, list[float]] = {name: [] for name in candidates}
    copies: list[float] = []
    for _ in range(rounds):
        for name, fn in candidates.items():
            copy_time, candidate_time = seconds(baseline), seconds(fn)
            copies.append(copy_time)
            times[name].append(candidate_time)
            ratios[name].append(candidate_time / copy_time)
    print(f"  {'':40s} {'median':>9s} {'best':>9s} {'x median':>9s} {'x best':>7s}")
    row = "  {:40s} {:6.1f} ms {:6.1f} ms {:8.2f}x {:6.2f}x"
    print(row.format("plain copy of the Q/K bytes", statistics.median(copies) * 1e3, min(copies) * 1e3, 1, 1))
    for name in candidates:
        median_ms, best_ms = statistics.median(times[name]) * 1e3, min(times[name]) * 1e3
        print(row.format(name, median_ms, best_ms, statistics.median(ratios[name]), min(times[name]) / min(copies)))


def bench_in_process(rounds: int, with_compile: bool, dtype: torch.dtype) -> None:
    megabytes = (Q_HEADS + KV_HEADS) * TOKENS * HEAD_DIM * dtype.itemsize / 2**20
    shape = f"T={TOKENS}, {Q_HEADS}+{KV_HEADS} heads x {HEAD_DIM}"
    print(f"\n1. In process, CPU {str(dtype).removeprefix('torch.')} [B,H,T,D], {shape} ({megabytes:.0f} MiB)")
    print(f"   torch threads: {torch.get_num_threads()}; median of {rounds} per-round ratios vs the copy")
    candidates, baseline = in_process_candidates(with_compile, dtype)
    ratio_table(candidates, baseline, rounds)


# --- a real server ---------------------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def served(**settings: str) -> Iterator[tuple[int, int]]:
    """A uvicorn subprocess serving ``app_with_rotation`` with ``ROPESERVE_*`` settings; yields (port, pid)."""
    port = free_port()
    env = {**os.environ, "ROPESERVE_ACCESS_LOG": "false"}
    env.update({f"ROPESERVE_{key.upper()}": value for key, value in settings.items()})
    command = [
        sys.executable, "-m", "uvicorn", "--factory", "bench_rotation:app_with_rotation", "--app-dir",
        str(Path(__file__).parent), "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning",
        "--no-access-log",
    ]  # fmt: skip
    server = subprocess.Popen(command, env=env)
    try:
        wait_ready(port, server)
        yield port, server.pid
    finally:
        server.terminate()
        server.wait(timeout=30)


def wait_ready(port: int, server: subprocess.Popen[bytes], timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"the server exited with {server.returncode}")
        with contextlib.suppress(OSError):
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            connection.request("GET", "/health/ready")
            if connection.getresponse().status == 200:
                return
        time.sleep(0.2)
    raise TimeoutError("the server did not become ready")


# --- 2. one big request over loopback ------------------------------------------------------------------------------


def big_body() -> tuple[bytes, int]:
    generator = torch.Generator().manual_seed(1)
    q = torch.randn(TOKENS, Q_HEADS * HEAD_DIM, generator=generator).to(torch.bfloat16)
    k = torch.randn(TOKENS, KV_HEADS * HEAD_DIM, generator=generator).to(torch.bfloat16)
    params = {"rope": ROPE, "layout": "flat"}
    body = save({"q": q, "k": k, "positions": torch.arange(TOKENS)}, metadata={"ropeserve": json.dumps(params)})
    return body, q.nbytes + k.nbytes


def post_once(port: int, body: bytes, into: bytearray) -> dict[str, float]:
    connection = http.client.HTTPConnection("127.0.0.1", port)
    started = time.perf_counter()
    connection.request("POST", "/v1/rope/apply", body=body, headers=SAFETENSORS)
    sent = time.perf_counter()
    response = connection.getresponse()
    first_byte = time.perf_counter()
    length = int(response.headers["content-length"])
    view = memoryview(into)[:length]
    while view:
        view = view[response.readinto(view) :]
    finished = time.perf_counter()
    connection.close()
    assert response.status == 200, into[:length]
    header = json.loads(into[8 : 8 + int.from_bytes(into[:8], "little")])
    server = json.loads(header["__metadata__"]["ropeserve"])["timings"]
    return {
        "end_to_end": finished - started,
        "client send (until the body is written)": sent - started,
        "server read (body off the socket)": server["read_s"],
        "server decode (checks, views)": server["decode_s"],
        "server prepare (params, table)": server["prepare_s"],
        "server queue": server["queue_s"],
        "server compute (in-place rotation)": server["compute_s"],
        "response (encode, send, client read)": finished - first_byte,
        "server total (until the answer is ready)": server["total_s"],
    }


RAW_CHUNK = 1 << 20


def echo_server(ready: multiprocessing.Queue, size: int) -> None:  # type: ignore[type-arg]
    """Receive ``size`` bytes per connection into one buffer, then send them all back."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        ready.put(listener.getsockname()[1])
        buffer = memoryview(bytearray(size))
        while True:
            connection, _ = listener.accept()
            received = 0
            while received < size:
                received += connection.recv_into(buffer[received : received + RAW_CHUNK])
            connection.sendall(buffer)
            connection.close()


def echo_once(port: int, body: bytes, into: bytearray) -> float:
    view = memoryview(into)[: len(body)]
    with socket.create_connection(("127.0.0.1", port)) as connection:
        started = time.perf_counter()
        connection.sendall(body)
        received = 0
        while received < len(body):
            received += connection.recv_into(view[received : received + RAW_CHUNK])
        return time.perf_counter() - started


def loopback_floor(body: bytes, rounds: int) -> float:
    """Median seconds to send ``body`` to a bare TCP echo process on 127.0.0.1 and receive it back."""
    context = multiprocessing.get_context("fork")
    ready = context.Queue()
    server = context.Process(target=echo_server, args=(ready, len(body)), daemon=True)
    server.start()
    try:
        port = ready.get(timeout=30)
        buffer = bytearray(len(body))
        return statistics.median([echo_once(port, body, buffer) for _ in range(rounds + 1)][1:])
    finally:
        server.kill()
        server.join()


def bench_http(rounds: int) -> None:
    body, qk_bytes = big_body()
    q_like = torch.empty(qk_bytes // 2, dtype=torch.bfloat16)
    copy_times = [seconds(lambda: torch.empty_like(q_like).copy_(q_like)) for _ in range(rounds + 1)][1:]
    copy_s = statistics.median(copy_times)
    print(f"\n2. Loopback HTTP, {qk_bytes / 2**20:.0f} MiB bfloat16 Q/K (flat, T={TOKENS}), {rounds} requests")
    buffer = bytearray(len(body) + (1 << 16))
    with served(batching="false", max_body_bytes=str(2 * len(body))) as (port, pid):
        post_once(port, body, buffer)
        server_cpu, client_cpu = process_cpu_seconds(pid), own_cpu_seconds()
        runs = [post_once(port, body, buffer) for _ in range(rounds)]
        server_cpu, client_cpu = process_cpu_seconds(pid) - server_cpu, own_cpu_seconds() - client_cpu
        shm_rows = bench_shm(port, rounds, q_like)
    floor_s = loopback_floor(body, rounds)
    medians = {phase: statistics.median(run[phase] for run in runs) for phase in runs[0]}
    print(f"  {'':44s} {'median':>11s} {'x copy':>7s} {'x floor':>8s}")
    row = "  {:44s} {:8.1f} ms {:6.2f}x {:7.2f}x"
    print(row.format("in-process copy of the Q/K bytes", copy_s * 1e3, 1.0, copy_s / floor_s))
    print(row.format("floor: bare TCP echo of the body, no HTTP", floor_s * 1e3, floor_s / copy_s, 1.0))
    for phase, value in medians.items():
        print(row.format(phase, value * 1e3, value / copy_s, value / floor_s))
    print("  shared memory (client transport='shm', same server, same run; x copy: median of per-round ratios):")
    for phase, (value, ratio) in shm_rows.items():
        print(row.format(phase, value * 1e3, ratio, value / floor_s))
    cpu_ms = (server_cpu + client_cpu) / rounds * 1e3
    cores = os.cpu_count() or 1
    print(
        f"  CPU per request: server {server_cpu / rounds * 1e3:.1f} ms + client {client_cpu / rounds * 1e3:.1f} ms "
        f"= {cpu_ms:.1f} ms; on {cores} cores no schedule finishes in under {cpu_ms / cores:.1f} ms "
        f"({cpu_ms / cores / (copy_s * 1e3):.2f}x the copy)"
    )


def bench_shm(port: int, rounds: int, q_like: torch.Tensor) -> dict[str, tuple[float, float]]:
    """The same rotation through shared memory with the Python client, end to end from its call to its result
    (staging copy into the reused region, JSON request, in-place rotation, views back); each round times the
    in-process copy right before it. ``{phase: (median seconds, median ratio to the copy)}``."""
    from ropeserve_client import Client

    generator = torch.Generator().manual_seed(1)
    q = torch.randn(TOKENS, Q_HEADS * HEAD_DIM, generator=generator).to(torch.bfloat16)
    k = torch.randn(TOKENS, KV_HEADS * HEAD_DIM, generator=generator).to(torch.bfloat16)
    positions = torch.arange(TOKENS)
    phases: dict[str, list[tuple[float, float]]] = {}
    with Client(f"http://127.0.0.1:{port}") as client:

        def rotate() -> dict[str, float]:
            return client.apply_rope(q, k, positions=positions, rope=ROPE, layout="flat", transport="shm").meta

        rotate()
        for _ in range(rounds):
            copy_s = seconds(lambda: torch.empty_like(q_like).copy_(q_like))
            started = time.perf_counter()
            timings = rotate()["timings"]
            measured = {
                "in-process copy, timed before each shm round": copy_s,
                "shm end to end (client call to result)": time.perf_counter() - started,
                "shm server total (prepare, queue, compute)": timings["total_s"],
                "shm server compute (in-place rotation)": timings["compute_s"],
            }
            for phase, value in measured.items():
                phases.setdefault(phase, []).append((value, value / copy_s))
    return {
        phase: (statistics.median(v for v, _ in values), statistics.median(r for _, r in values))
        for phase, values in phases.items()
    }  # the copy's own row reads 1.00x


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (all its threads), from /proc (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def own_cpu_seconds() -> float:
    """User + system CPU seconds of this process (the client)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


# --- 3. batching ---------------------------------------------------------------------------------------------------


def small_body(seed: int, tokens: int = 256) -> bytes:
    generator = torch.Generator().manual_seed(seed)
    q = torch.randn(tokens, Q_HEADS * HEAD_DIM, generator=generator).to(torch.bfloat16)
    k = torch.randn(tokens, KV_HEADS * HEAD_DIM, generator=generator).to(torch.bfloat16)
    positions = torch.arange(seed, seed + tokens)
    return save(
        {"q": q, "k": k, "positions": positions}, metadata={"ropeserve": json.dumps({"rope": ROPE, "layout": "flat"})}
    )


async def client_loop(port: int, bodies: list[bytes], latencies: list[float], batch_sizes: list[int]) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        for body in bodies:
            request = (
                f"POST /v1/rope/apply HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/x-safetensors\r\n"
                f"content-length: {len(body)}\r\n\r\n"
            ).encode()
            started = time.perf_counter()
            writer.write(request)
            writer.write(body)
            head = await reader.readuntil(b"\r\n\r\n")
            headers = dict(line.split(": ", 1) for line in head.decode("latin-1").split("\r\n")[1:] if ": " in line)
            answer = await reader.readexactly(int(headers["content-length"]))
            latencies.append(time.perf_counter() - started)
            assert head.startswith(b"HTTP/1.1 200"), head
            header = json.loads(answer[8 : 8 + int.from_bytes(answer[:8], "little")])
            batch_sizes.append(json.loads(header["__metadata__"]["ropeserve"])["batch"]["size"])
    finally:
        writer.close()


async def drive(port: int, clients: int, per_client: int, bodies: list[bytes]) -> tuple[float, list[float], list[int]]:
    latencies: list[float] = []
    batch_sizes: list[int] = []
    started = time.perf_counter()
    await asyncio.gather(
        *(
            client_loop(port, [bodies[(c + i) % len(bodies)] for i in range(per_client)], latencies, batch_sizes)
            for c in range(clients)
        )
    )
    return time.perf_counter() - started, latencies, batch_sizes


def metric_total(port: int, name: str) -> tuple[float, float]:
    """(sum, count) of a histogram on the server's /metrics."""
    connection = http.client.HTTPConnection("127.0.0.1", port)
    connection.request("GET", "/metrics")
    lines = connection.getresponse().read().decode().splitlines()
    values = {line.split(" ")[0]: float(line.split(" ")[1]) for line in lines if line.startswith(name)}
    return values.get(f"{name}_sum", 0.0), values.get(f"{name}_count", 0.0)


def bench_batching(clients: int, per_client: int, tokens: int, rounds: int) -> None:
    bodies = [small_body(seed, tokens) for seed in range(8)]
    total = clients * per_client
    size = f"T={tokens}, {Q_HEADS}+{KV_HEADS} heads bf16, {len(bodies[0]) / 2**20:.2f} MiB each"
    print(f"\n3. Batching: {clients} clients x {per_client} requests ({size}), modes alternated {rounds}x")
    for _ in range(rounds):
        for batching in ("true", "false"):
            with served(batching=batching) as (port, _):
                asyncio.run(drive(port, clients, 2, bodies))
                before, _ = metric_total(port, "ropeserve_batch_compute_seconds")
                elapsed, latencies, sizes = asyncio.run(drive(port, clients, per_client, bodies))
                kernel_s = metric_total(port, "ropeserve_batch_compute_seconds")[0] - before
            latencies.sort()
            p50, p99 = latencies[len(latencies) // 2], latencies[int(len(latencies) * 0.99) - 1]
            print(
                f"  batching {'on ' if batching == 'true' else 'off'}: {total / elapsed:7.1f} req/s   "
                f"p50 {p50 * 1e3:6.1f} ms   p99 {p99 * 1e3:6.1f} ms   mean batch {statistics.mean(sizes):5.1f}   "
                f"kernel busy {kernel_s * 1e3:7.1f} ms"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--compile", action="store_true", help="also time a naive torch.compile (slow to compile)")
    parser.add_argument("--skip-in-process", action="store_true", help="skip section 1 (CPU kernels in process)")
    parser.add_argument("--skip-http", action="store_true")
    parser.add_argument("--skip-batching", action="store_true")
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--requests-per-client", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=256, help="tokens per request in the batching benchmark")
    parser.add_argument("--batching-rounds", type=int, default=2, help="how often to alternate batching on/off")
    args = parser.parse_args()
    load = ", ".join(f"{value:.1f}" for value in os.getloadavg())
    print(f"ropeserve rotation benchmark: {os.cpu_count()} CPUs, load average {load} (other work skews wall times)")
    for dtype in () if args.skip_in_process else (torch.float32, torch.bfloat16):
        bench_in_process(args.rounds, args.compile, dtype)
    if not args.skip_http:
        bench_http(args.rounds)
    if not args.skip_batching:
        bench_batching(args.clients, args.requests_per_client, args.tokens, args.batching_rounds)


if __name__ == "__main__":
    main()
