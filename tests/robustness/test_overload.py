"""A queue-filling burst on the rotation endpoint answers 429 with Retry-After (never 5xx), and latency recovers."""

from __future__ import annotations

from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import httpx

from support import BATCH_MAX_TOKENS, ROPE_APPLY, SAFETENSORS, assert_problem, median_latency_s, rope_body, server_5xx

BURST = 32
ROUNDS = 3
RECOVERY_FACTOR = 5.0
RECOVERY_SLACK_S = 0.05


def burst(client: httpx.Client, body: bytes) -> list[httpx.Response]:
    with ThreadPoolExecutor(BURST) as pool:
        return list(pool.map(lambda _: client.post(ROPE_APPLY, content=body, headers=SAFETENSORS), range(BURST)))


def test_burst_is_shed_with_429_and_latency_recovers(queued: httpx.Client) -> None:
    # Requests of a full token budget skip the batch window: each is its own kernel call.
    body = rope_body(tokens=BATCH_MAX_TOKENS, heads=32)
    before = median_latency_s(queued, ROPE_APPLY, body)
    limits = httpx.Limits(max_connections=BURST, max_keepalive_connections=BURST)
    statuses: Counter[int] = Counter()
    with httpx.Client(base_url=str(queued.base_url), timeout=30.0, limits=limits) as pool_client:
        for _ in range(ROUNDS):
            responses = burst(pool_client, body)
            statuses.update(response.status_code for response in responses)
            for response in responses:
                if response.status_code == 429:
                    assert_problem(response, {429})
                    assert int(response.headers["retry-after"]) >= 0
            if statuses[429]:
                break
    assert set(statuses) <= {200, 429}, statuses
    assert statuses[429] > 0, f"no 429 in {ROUNDS} bursts of {BURST}: {statuses}"
    after = median_latency_s(queued, ROPE_APPLY, body)
    assert after <= before * RECOVERY_FACTOR + RECOVERY_SLACK_S, (before, after)
    assert server_5xx(queued) == 0
