"""The lint answer cache (``serving.answers.AnswerCache``) is shared by every ``POST /v1/config/validate`` request.

Over a real socket against the served app (uvloop + httptools, in a thread of this process, with the cache shrunk
to 160 KiB, so about fifteen answers fit and entries are evicted and stored again while other requests read them):
clients send configs of the same size that differ in one value (each variant its own report), some variants shared
by every client (cache hits while the others churn), some a client's own; other clients leave before reading their
answer, others read it 512 bytes at a time. Every answer that arrives is, byte for byte, the report the linter
computes for that body in this process.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from served import Served, serving

from ropeserve.api.fast_json import encode_json
from ropeserve.lint import validate_config_request
from support import metric_total, run_concurrently, slow_json_exchange

CONFIG = json.loads((Path(__file__).parents[1] / "fixtures" / "configs" / "Qwen__Qwen2.5-7B-Instruct.json").read_text())
CACHE_BYTES = 160 * 1024
CLIENTS = 4
REQUESTS_PER_CLIENT = 16
LEAVERS = 2
SHARED_VARIANTS = 3


def variant(k: int) -> dict[str, Any]:
    """A request body whose config differs from the fixture in its lengths and theta (same size for k < 9000)."""
    config = {**CONFIG, "max_position_embeddings": 20_000 + k, "rope_theta": 1_000_000.0 + k}
    return {"config": config, "intent": {"engines": ["vllm", "sglang"], "max_model_len": 30_000 + k}}


def expected(body: dict[str, Any]) -> bytes:
    return encode_json(validate_config_request(json.loads(json.dumps(body))))


def bodies(seed: int) -> list[dict[str, Any]]:
    """A client's requests: every other one a variant all clients share, the rest variants of its own."""
    rng = random.Random(seed)
    return [
        variant(rng.randrange(SHARED_VARIANTS) if k % 2 else 100 + seed * REQUESTS_PER_CLIENT + k)
        for k in range(REQUESTS_PER_CLIENT)
    ]


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    with serving(lint_answer_cache_bytes=CACHE_BYTES) as server:
        yield server


def test_concurrent_lint_requests_get_their_own_report_while_the_cache_churns(served: Served) -> None:
    failures: list[str] = []
    path = "/v1/config/validate"

    def client(seed: int) -> None:
        for k, body in enumerate(bodies(seed)):
            if slow_json_exchange(served.port, path, body) != expected(body):
                failures.append(f"client {seed} request {k}: not the report of its own config")

    def leaver(seed: int) -> None:
        for body in bodies(50 + seed):
            slow_json_exchange(served.port, path, body, leave=True)

    run_concurrently(
        [(client, seed) for seed in range(CLIENTS)] + [(leaver, seed) for seed in range(LEAVERS)], failures
    )
    assert not failures, failures[:5]
    cache = served.runtime.lint_answers
    assert 0 < cache.nbytes <= CACHE_BYTES
    page = httpx.get(served.url + "/metrics").text
    hits = metric_total(page, 'ropeserve_lint_answer_cache_lookups_total{result="hit"}')
    looked_up = metric_total(page, "ropeserve_lint_answer_cache_lookups_total")
    assert hits > 0
    assert CLIENTS * REQUESTS_PER_CLIENT <= looked_up <= (CLIENTS + LEAVERS) * REQUESTS_PER_CLIENT
