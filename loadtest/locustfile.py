"""Locust workload for ropeserve: a weighted mix of what serving stacks and pipelines ask for.

Request bodies come from ``ropeserve_client``'s operation builders, so the load kit sends exactly what the client
sends. Requests whose endpoint is not in the server's OpenAPI document are left out of the mix (and listed in the
report). Run it through ``loadtest/run.py``, which sets the ``ROPESERVE_LOADTEST_*`` variables below; plain
``locust -f loadtest/locustfile.py --host URL`` also works (steady, 8 users, 60 s).

Every request is recorded (time, name, status, latency) to ``$ROPESERVE_LOADTEST_SAMPLES`` for the report, with
the moment load started and the number of users that actually ran. The run's clock (the shape's too) starts once
the payloads are built, not when locust starts: building them takes seconds on a busy host.
"""

from __future__ import annotations

import csv
import functools
import json
import os
import random
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import gevent
import numpy as np
from locust import FastHttpUser, LoadTestShape, between, events, task
from locust.env import Environment

from hostile import HOSTILE, HOSTILE_PREFIX, AnswerBook, HostileRequest, problem_check
from ropeserve_client import Operation
from ropeserve_client import _endpoints as api
from ropeserve_client._operations import parse_text
from scenarios import SCENARIOS, users_at

__all__ = ["MIX", "RopeUser", "ScenarioShape"]

SCENARIO = os.environ.get("ROPESERVE_LOADTEST_SCENARIO", "steady")
USERS = int(os.environ.get("ROPESERVE_LOADTEST_USERS", "8"))
DURATION_S = float(os.environ.get("ROPESERVE_LOADTEST_DURATION", "60"))
SAMPLES_PATH = os.environ.get("ROPESERVE_LOADTEST_SAMPLES")
ACCEPT = {"accept": "application/x-safetensors, application/problem+json"}
USER_SAMPLE_S = 0.25
"""How often the number of running users is recorded."""


@dataclass(frozen=True)
class Request:
    """One kind of request in the mix: stats name, weight, endpoint, a factory of fresh operations, and an optional
    check of the answer (why it is wrong, or None) that replaces the default "any 2xx is right"."""

    name: str
    weight: int
    path: str
    make: Callable[[], Operation[Any]]
    check: Callable[[Any], str | None] | None = None


def _decode_positions() -> list[int]:
    start = random.randrange(0, 8000)
    return list(range(start, start + random.choice((1, 1, 1, 4))))


def _cache_length() -> int:
    return random.randrange(1, 8192)


def _cache_lengths(batch: int = 8) -> list[int]:
    return [_cache_length() for _ in range(batch)]


def _padded_mask(batch: int = 8, length: int = 256) -> list[list[int]]:
    lengths = [random.randint(length // 4, length) for _ in range(batch)]
    return [[0] * (length - n) + [1] * n for n in lengths]


ROWS = [
    [{"text": 24}, {"image": [1, 28, 28]}, {"text": 40}, {"video": [4, 16, 16], "second_per_grid_t": 0.5}, {"text": 12}]
]
LINT_CONFIG = {
    "model_type": "llama",
    "max_position_embeddings": 131072,
    "rope_theta": 500000.0,
    "head_dim": 128,
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "rope_scaling": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    },
}


def _half_precision(*shape: int, seed: int = 0) -> Any:
    """Random bfloat16 activations from ``seed`` (float16 when torch is missing; numpy has no bfloat16)."""
    try:
        import torch
    except ImportError:
        return np.random.default_rng(seed).standard_normal(shape).astype(np.float16)
    return torch.randn(*shape, dtype=torch.bfloat16, generator=torch.Generator().manual_seed(seed))


@functools.cache
def rotation(tokens: int, variant: int = 0) -> Operation[Any]:
    """A Llama-3.1-8B rotation request (32 query heads, 8 KV heads, head_dim 128); built once, sent many times.
    Variants of one size hold different activations."""
    q, k = (
        _half_precision(1, 32, tokens, 128, seed=2 * variant),
        _half_precision(1, 8, tokens, 128, seed=2 * variant + 1),
    )
    return api.apply_rope(q, k, positions=np.arange(tokens), preset="llama-3.1-8b", layout="bhtd")


@functools.cache
def mrope_rotation(tokens: int) -> Operation[Any]:
    """A Qwen2.5-VL-7B M-RoPE rotation request (28 query heads, 4 KV heads)."""
    q, k = _half_precision(1, 28, tokens, 128), _half_precision(1, 4, tokens, 128)
    positions = np.tile(np.arange(tokens), (3, 1))
    return api.apply_mrope(q, k, positions=positions, preset="qwen2.5-vl-7b", layout="bhtd")


def _mrope_decode() -> Operation[Any]:
    return api.mrope_decode_positions(mrope_position_deltas=[-40], cache_lengths=[random.randrange(300, 4000)])


MIX = [
    Request("cos-sin decode", 25, "/v1/rope/cos-sin", lambda: api.cos_sin(_decode_positions(), preset="llama-3.1-8b")),
    Request("cos-sin prefill 2k", 8, "/v1/rope/cos-sin", lambda: api.cos_sin(range(2048), preset="qwen3-8b")),
    Request("positions 1-D padded", 8, "/v1/positions", lambda: api.positions(attention_mask=_padded_mask())),
    Request("positions 1-D decode", 6, "/v1/positions", lambda: api.positions(cache_lengths=_cache_lengths())),
    Request("mrope positions", 8, "/v1/mrope/positions", lambda: api.mrope_positions(family="qwen2_5_vl", rows=ROWS)),
    Request("mrope decode", 6, "/v1/mrope/decode-positions", _mrope_decode),
    Request("rotate small (decode)", 14, "/v1/rope/apply", lambda: rotation(4)),
    Request("rotate large (prefill 1k)", 2, "/v1/rope/apply", lambda: rotation(1024)),
    Request("rotate mrope (256)", 2, "/v1/mrope/apply", lambda: mrope_rotation(256)),
    Request("config lint", 3, "/v1/config/validate", lambda: api.validate_config(LINT_CONFIG, engines=["vllm"])),
    Request("pe sinusoidal", 2, "/v1/pe/sinusoidal", lambda: api.sinusoidal(range(512), dim=256)),
    Request("pe alibi", 1, "/v1/pe/alibi", lambda: api.alibi(num_heads=32, query_len=1, key_len=_cache_length())),
    Request("info", 1, "/v1/info", api.info),
    Request("ready probe", 1, "/health/ready", api.ready),
]
"""What a fleet of serving stacks asks for: mostly per-step decode work, some prefill, occasional lint and probes."""

BOOK = AnswerBook()
VERIFIED_VARIANTS = 4
"""Same-size rotations with different contents: an answer holding a neighbour's bytes no longer matches its digest."""


def _verify(key: str) -> Callable[[Any], str | None]:
    def check(response: Any) -> str | None:
        return _default_check(response) or BOOK.check(key, response.content or b"")

    return check


def _refused(response: Any) -> str | None:
    return problem_check(response.status_code or 0, response.headers or {}, response.content or b"")


def _hostile(request: HostileRequest) -> Request:
    operation = Operation(request.method, request.path, parse_text, content=request.body, headers=request.headers)
    return Request(HOSTILE_PREFIX + request.name, 1, request.path, lambda: operation, _refused)


def _verified_rotation(tokens: int, variant: int) -> Request:
    name = f"verified rotate {tokens} #{variant}"
    return Request(name, 2, "/v1/rope/apply", lambda: rotation(tokens, variant), _verify(name))


SOAK_EXTRAS = [
    *(_verified_rotation(tokens, v) for tokens in (4, 256) for v in range(VERIFIED_VARIANTS)),
    Request(
        "verified cos-sin", 4, "/v1/rope/cos-sin", lambda: api.cos_sin(range(100, 164), preset="qwen3-8b"),
        _verify("verified cos-sin"),
    ),
    *(_hostile(request) for request in HOSTILE),
]  # fmt: skip
"""The soak adds answers checked against a quiet server's and hostile requests that must get a 4xx problem."""
_VERIFIED_NAMES = frozenset(r.name for r in SOAK_EXTRAS if not r.name.startswith(HOSTILE_PREFIX))
if SCENARIO == "soak":
    MIX = MIX + SOAK_EXTRAS


def available_paths(host: str) -> set[str] | None:
    """Paths in the server's OpenAPI document (None when it cannot be read: then nothing is filtered)."""
    try:
        with urllib.request.urlopen(f"{host.rstrip('/')}/openapi.json", timeout=10) as answer:  # noqa: S310
            return set(json.load(answer)["paths"])
    except (OSError, ValueError, KeyError):
        return None


def _header_ms(response: Any, name: str) -> str:
    """A server timing header (seconds) in milliseconds, or "" when absent."""
    headers = getattr(response, "headers", None) or {}
    value = headers.get(name)
    try:
        return f"{float(value) * 1000:.3f}" if value is not None else ""
    except ValueError:
        return ""


class Recorder:
    """Every request's start time, name, status, latency, size, error and the server's timing headers
    (``x-total-time`` on every answer, ``x-queue-time`` on rotations), kept in memory and written at the end;
    also when load started and the users running every ``USER_SAMPLE_S`` from then on."""

    COLUMNS = ("start", "name", "status", "ms", "bytes", "error", "server_ms", "queue_ms")

    def __init__(self) -> None:
        self.rows: list[tuple[Any, ...]] = []
        self.skipped: list[str] = []
        self.load_started: float | None = None
        self.users: list[tuple[float, int]] = []
        """(seconds since load started, users running then)."""

    def start_load(self, environment: Environment) -> None:
        """Start the run's clock, and the shape's, now that the payloads are built; sample the running users."""
        self.load_started = time.time()
        if environment.shape_class is not None:
            environment.shape_class.reset_time()
        gevent.spawn(self._sample_users, environment)

    def _sample_users(self, environment: Environment) -> None:
        assert self.load_started is not None and environment.runner is not None
        while True:
            self.users.append((round(time.time() - self.load_started, 3), environment.runner.user_count))
            gevent.sleep(USER_SAMPLE_S)

    def on_request(self, name: str, response_time: float, response_length: int, **kwargs: Any) -> None:
        response, exception = kwargs.get("response"), kwargs.get("exception")
        status = getattr(response, "status_code", 0) or 0
        error = "" if exception is None else str(exception).splitlines()[0][:200]  # a wrong 200 has one too
        if status == 0 and exception is not None:
            error = f"transport: {type(exception).__name__}: {exception}"[:200]
        started = kwargs.get("start_time") or time.time() - response_time / 1000
        timing = (_header_ms(response, "x-total-time"), _header_ms(response, "x-queue-time"))
        self.rows.append((started, name, status, response_time, response_length or 0, error, *timing))

    def write(self, path: str) -> None:
        with open(path, "w", newline="", encoding="utf-8") as handle:
            writer = csv.writer(handle)
            writer.writerow(self.COLUMNS)
            writer.writerows(self.rows)
        with open(path + ".meta.json", "w", encoding="utf-8") as handle:
            meta = {"skipped": self.skipped, "mix": {r.name: r.weight for r in MIX}}
            json.dump(meta | {"load_started": self.load_started, "users": self.users}, handle)


RECORDER = Recorder()
events.request.add_listener(RECORDER.on_request)


@events.test_start.add_listener
def choose_mix(environment: Environment, **kwargs: Any) -> None:
    """Keep the requests whose endpoint the server has, build their payloads, weight them into the user's task
    list; then start the clock (the first users spawn right after this handler)."""
    paths = available_paths(environment.host or "")
    kept = [r for r in MIX if paths is None or r.path in paths]
    RECORDER.skipped = [f"{r.name} ({r.path})" for r in MIX if r not in kept]
    for request in kept:
        if request.make().path != request.path:  # building once also caches the rotation bodies
            raise RuntimeError(f"{request.name}: the client sends it to {request.make().path}, not {request.path}")
    RopeUser.mix = kept
    RopeUser.weights = [r.weight for r in kept]
    for request in kept:
        if request.name in _VERIFIED_NAMES:
            BOOK.record(request.name, *_send_once(environment.host or "", request.make()))
    RECORDER.start_load(environment)


def _wire(operation: Operation[Any]) -> tuple[dict[str, str], bytes | None]:
    """The headers and body the client sends for ``operation``."""
    headers = {**ACCEPT, **operation.headers} if operation.tensor_answer else dict(operation.headers)
    body = operation.content
    if operation.json is not None:
        body = json.dumps(operation.json).encode()
        headers["content-type"] = "application/json"
    return headers, body


def _send_once(host: str, operation: Operation[Any]) -> tuple[int, bytes]:
    """One request on its own (the reference answers are taken this way, before the load starts)."""
    headers, body = _wire(operation)
    url = f"{host.rstrip('/')}{operation.path}"
    request = urllib.request.Request(url, data=body, headers=headers, method=operation.method)
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:  # noqa: S310
            return answer.status, answer.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


@events.quitting.add_listener
def write_samples(environment: Environment, **kwargs: Any) -> None:
    if SAMPLES_PATH:
        RECORDER.write(SAMPLES_PATH)


class RopeUser(FastHttpUser):
    """A serving stack's sidecar: picks a request from the weighted mix, sends it, pauses per the scenario."""

    wait_time = between(*SCENARIOS[SCENARIO].think_time_s)
    network_timeout = 120.0
    connection_timeout = 10.0
    mix: list[Request] = MIX
    weights: list[int] = [r.weight for r in MIX]

    @task
    def one_request(self) -> None:
        if not self.mix:
            time.sleep(1)
            return
        request = random.choices(self.mix, weights=self.weights)[0]
        operation = request.make()
        headers, body = _wire(operation)
        with self.client.request(
            operation.method, operation.path, name=request.name, data=body, headers=headers,
            catch_response=True,
        ) as response:  # fmt: skip
            reason = request.check(response) if request.check else _default_check(response)
            if reason is None:
                response.success()
            else:
                response.failure(reason)


def _default_check(response: Any) -> str | None:
    return None if 200 <= (response.status_code or 0) < 300 else _failure_label(response)


def _failure_label(response: Any) -> str:
    """``429 overloaded`` from a problem+json answer, ``HTTP 502`` otherwise."""
    status = response.status_code or 0
    try:
        slug = str(json.loads(response.content or b"{}").get("type", "")).rsplit("/", 1)[-1]
    except (ValueError, AttributeError):
        slug = ""
    return f"{status} {slug}".strip() if slug else f"HTTP {status}"


class ScenarioShape(LoadTestShape):
    """Users over time per ``scenarios.users_at``, timed from ``Recorder.start_load``; stops the run at its duration."""

    def tick(self) -> tuple[int, float] | None:
        elapsed = self.get_run_time() if RECORDER.load_started is not None else 0.0  # the first tick builds payloads
        if elapsed >= DURATION_S:
            return None
        return users_at(SCENARIO, elapsed, USERS, DURATION_S), float(max(USERS, 1) * 4)
