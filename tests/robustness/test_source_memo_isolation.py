"""The remembered rope sources (``config.sources``) are shared by every request that names rope parameters.

Over a real socket against the served app (uvloop + httptools, in a thread of this process, with the memory shrunk
to four sources, so entries are evicted and resolved again while other requests read them): clients ask for the
cos/sin of the same number of positions under rope sources that differ in one value (explicit parameters, configs
and presets; some shared by every client, some a client's own, some invalid), other clients leave before reading
their answer, others read it a few bytes at a time. Every answer is that of its own source, resolved afresh in this
process; every invalid source gets its own 422 naming its own field.
"""

from __future__ import annotations

import functools
import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from served import Served, serving

from ropeserve.config import sources
from ropeserve.rope import rope_cos_sin
from support import run_concurrently, slow_json_exchange

CONFIG = json.loads((Path(__file__).parents[1] / "fixtures" / "configs" / "Qwen__Qwen2.5-7B-Instruct.json").read_text())
REMEMBERED = 4
CLIENTS = 4
REQUESTS_PER_CLIENT = 12
LEAVERS = 2
POSITIONS = list(range(0, 48, 3))


def source(k: int) -> dict[str, Any]:
    """Source ``k``: explicit parameters, a config or a preset, each variant differing from the others in a value."""
    if k % 3 == 0:
        return {"rope": {"rope_type": "linear", "rope_theta": 10_000.0 + k, "head_dim": 64, "factor": 1.0 + k % 7}}
    if k % 3 == 1:
        return {"config": {**CONFIG, "rope_theta": 1_000_000.0 + k}}
    return {"preset": ["llama-3.1-8b", "qwen3-8b-yarn", "phi-3-mini-128k"][k % 9 // 3]}


def invalid(k: int) -> tuple[dict[str, Any], str]:
    """An invalid source (explicit parameters or a config, by ``k``) and the field its 422 names."""
    if k // 4 % 2:
        return {"rope": {"rope_type": "linear", "rope_theta": 10_000.0, "head_dim": 64, f"factor_{k}": 1.0}}, (
            f"rope.factor_{k}"
        )
    return {"config": {**CONFIG, "rope_theta": -float(k)}}, "config.rope_theta"


def expected(body: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The tables of ``body``'s source resolved afresh (no memory) at ``POSITIONS``, with no table cache."""
    kind = next(kind for kind in ("rope", "config", "preset") if kind in body)
    params, _ = sources._resolve(kind, body[kind], None)  # type: ignore[arg-type]
    result = rope_cos_sin(params, torch.tensor(POSITIONS), cache=None)
    return {"cos": result.cos, "sin": result.sin, "inv_freq": result.inv_freq}


def requests(seed: int) -> list[tuple[dict[str, Any], str | None]]:
    """A client's requests and the field each one's 422 names (None: a 200): every other source shared by all
    clients, the rest its own; every third request invalid (shared and own in turn)."""
    rng = random.Random(seed)
    chosen = []
    for k in range(REQUESTS_PER_CLIENT):
        index = rng.randrange(8) if k % 2 else 100 * (seed + 1) + k
        body, field = invalid(index) if k % 3 == 2 else (source(index), None)
        chosen.append(({**body, "positions": POSITIONS}, field))
    return chosen


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    shrunk = functools.lru_cache(maxsize=REMEMBERED)(sources._remembered.__wrapped__)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sources, "_remembered", shrunk)
        with serving() as server:
            yield server


def test_concurrent_requests_get_their_own_source_while_the_memory_churns(served: Served) -> None:
    failures: list[str] = []
    path = "/v1/rope/cos-sin"

    def client(seed: int) -> None:
        for k, (body, refused_field) in enumerate(requests(seed)):
            if refused_field is not None:
                response = httpx.post(served.url + path, json=body, timeout=30)
                if response.status_code != 422 or response.json().get("field") != refused_field:
                    failures.append(f"client {seed} request {k}: {response.text[:200]}, not a 422 at {refused_field}")
                continue
            answer = json.loads(slow_json_exchange(served.port, path, body) or b"{}")
            for name, tensor in expected(body).items():
                if not torch.equal(torch.tensor(answer[name], dtype=tensor.dtype), tensor):
                    failures.append(f"client {seed} request {k}: {name} is not that of its own source")

    def leaver(seed: int) -> None:
        for body, _ in requests(50 + seed):
            slow_json_exchange(served.port, path, body, leave=True)

    run_concurrently(
        [(client, seed) for seed in range(CLIENTS)] + [(leaver, seed) for seed in range(LEAVERS)], failures
    )
    assert not failures, failures[:5]
    assert sources._remembered.cache_info().currsize == REMEMBERED
