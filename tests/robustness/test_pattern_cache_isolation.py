"""The per-grid pattern cache behind GLM-Image, HunYuan-VL, MiniCPM-V and Qwen2.5/3-Omni positions is shared by every
request.

Over a real socket against the served app (uvloop + httptools, in a thread of this process, with the cache shrunk
to 64 KiB so that entries are evicted and rebuilt while other requests read them): clients send batches of one
family concurrently, some with the same grid shapes (one cached entry read by all), some with fresh shapes; other
clients leave before reading their answer, others read it a few bytes at a time. Every answer that arrives equals
transformers' ``get_rope_index`` for that request.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from omni_oracle import (
    audio_tokens_qwen3,
    hf_omni_get_rope_index,
    hf_qwen3_omni_get_rope_index,
    render_omni,
)
from positions_oracle import MINICPM_MARKERS, hf_glm_image, hf_hunyuan, hf_minicpmv
from served import Served, serving

from ropeserve.positions import _patterns
from support import run_concurrently, slow_json_exchange

Case = tuple[dict[str, Any], dict[str, torch.Tensor]]
"""(request body, expected answer fields)."""

CLIENTS = 4
REQUESTS_PER_CLIENT = 12
LEAVERS = 2


def _left_padded(rows: list[list[int]], fill: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(row) for row in rows)
    ids = torch.full((len(rows), width), fill, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for b, row in enumerate(rows):
        ids[b, width - len(row) :], mask[b, width - len(row) :] = torch.tensor(row), 1
    return ids, mask


def glm_case(rng: random.Random, shapes: list[tuple[int, int]]) -> Case:
    rows, grids, counts = [], [], []
    for _ in range(rng.randint(1, 3)):
        row: list[int] = []
        row_grids = [[1, *rng.choice(shapes)] for _ in range(rng.randint(1, 3))]
        for grid in row_grids[:-1]:  # the last one is generated
            row += [7] * rng.randint(1, 9) + [16384, *[5] * (grid[1] * grid[2]), 16385]
        rows.append([*row, 7, 16384])
        grids += row_grids
        counts.append(len(row_grids))
    ids, mask = _left_padded(rows, 7)
    per_sample = torch.tensor(counts)
    expected, deltas, decode = hf_glm_image(ids, torch.tensor(grids), per_sample, mask)
    body = {
        "family": "glm_image",
        "input_ids": ids.tolist(),
        "attention_mask": mask.tolist(),
        "image_grid_thw": grids,
        "images_per_sample": counts,
    }
    return body, {"position_ids": expected, "mrope_position_deltas": deltas, "decode_position_ids": decode}


def hunyuan_case(rng: random.Random, shapes: list[tuple[int, int]]) -> Case:
    rows, grids = [], []
    for _ in range(rng.randint(1, 3)):
        row: list[int] = []
        for _ in range(rng.randint(1, 3)):
            h, w = rng.choice(shapes)
            row += [0] * rng.randint(1, 9) + [1] * (h * (w + 1) + 2)
            grids.append([1, 2 * h, 2 * w])
        rows.append([*row, 0])
    types, mask = _left_padded(rows, 0)
    case = {"types": types, "mask": mask, "grids": torch.tensor(grids), "merge": 2, "axes": 4}
    expected, deltas = hf_hunyuan(case)
    body = {
        "family": "hunyuan_vl",
        "mm_token_type_ids": types.tolist(),
        "attention_mask": mask.tolist(),
        "image_grid_thw": grids,
    }
    return body, {"position_ids": expected, "mrope_position_deltas": deltas}


def minicpm_case(rng: random.Random, shapes: list[tuple[int, int]]) -> Case:
    marks = MINICPM_MARKERS
    rows, sizes = [], []
    for _ in range(rng.randint(1, 3)):
        row = [7] * rng.randint(1, 5)
        for _ in range(rng.randint(1, 2)):
            h, w = rng.choice(shapes)
            row += [marks["image_start"], *[8] * (h * w), marks["image_end"]]
            sizes.append([4 * h, 4 * w])
            for grid_row in range(rng.randint(0, 2)):
                for _ in range(2):
                    row += [marks["slice_start"], *[8] * (h * w), marks["slice_end"]]
                    sizes.append([4 * h, 4 * w])
                row += [marks["newline"]] if grid_row == 0 else []
            row += [7] * rng.randint(1, 3)
        rows.append(row)
    ids, mask = _left_padded(rows, 7)
    types = (ids == 8).long() * mask
    case = {"ids": ids, "types": types, "mask": mask, "sizes": {1: torch.tensor(sizes), 2: None}, "mode": "16x"}
    expected, deltas = hf_minicpmv(case)
    body = {
        "family": "minicpmv4_7",
        "input_ids": ids.tolist(),
        "mm_token_type_ids": types.tolist(),
        "attention_mask": mask.tolist(),
        "target_sizes": sizes,
        "marker_ids": marks,
    }
    return body, {"position_ids": expected, "mrope_position_deltas": deltas}


def omni_case(rng: random.Random, shapes: list[tuple[int, int]]) -> Case:
    """Qwen2.5-Omni or Qwen3-Omni (int64 and float32 patterns): images, a video with its audio, an audio clip."""
    qwen3 = rng.random() < 0.5
    rows = []
    for _ in range(rng.randint(1, 2)):
        h, w = rng.choice(shapes)
        video = {"video": [rng.randint(1, 3), 2 * h, 2 * w], "second_per_grid_t": rng.choice([0.5, 0.7, 1.0])}
        rows.append(
            [
                {"text": rng.randint(2, 5)},
                {"image": [1, 2 * h, 2 * w]},
                {"text": 2},
                {**video, "audio_seqlen": rng.randint(50, 300)},
                {"text": 2},
                {"audio_seqlen": rng.randint(20, 120)},
                {"text": rng.randint(2, 4)},
            ]
        )
    tokens_of = {"tokens_of": audio_tokens_qwen3} if qwen3 else {}
    batch = render_omni(rows, 2, use_audio_in_video=True, pads=[0] * len(rows), left=True, **tokens_of)
    if qwen3:
        expected, deltas = hf_qwen3_omni_get_rope_index(batch, merge=2, pps=25)
    else:
        expected, deltas = hf_omni_get_rope_index(batch, merge=2, pps=25, seconds_per_chunk=2)
    body = batch.token_form("qwen3_omni_moe" if qwen3 else "qwen2_5_omni")
    return body, {"position_ids": expected, "mrope_position_deltas": deltas}


BUILDERS: list[Callable[[random.Random, list[tuple[int, int]]], Case]] = [
    glm_case,
    hunyuan_case,
    minicpm_case,
    omni_case,
]


def cases(seed: int) -> list[Case]:
    """A client's requests: half on the grid shapes every client shares, half on shapes of its own."""
    rng = random.Random(seed)
    shared = [(2, 3), (3, 3)]
    own = [(2 + seed % 3, 4 + seed), (5, 2 + seed)]
    return [BUILDERS[k % len(BUILDERS)](rng, shared if (k // 2) % 2 else own) for k in range(REQUESTS_PER_CLIENT)]


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_patterns, "PATTERNS", _patterns.PatternCache(max_bytes=64 * 1024, max_entry_bytes=32 * 1024))
        with serving() as server:
            yield server


def exchange(port: int, body: dict[str, Any], *, leave: bool = False) -> dict[str, Any] | None:
    """POST ``body`` to M-RoPE positions; read the answer a few bytes at a time (``leave``: close before reading)."""
    answer = slow_json_exchange(port, "/v1/mrope/positions", body, leave=leave)
    return None if answer is None else json.loads(answer)


def test_concurrent_requests_get_their_own_positions_while_the_cache_churns(served: Served) -> None:
    failures: list[str] = []

    def client(seed: int) -> None:
        for k, (body, expected) in enumerate(cases(seed)):
            answer = exchange(served.port, body)
            assert answer is not None
            for name, tensor in expected.items():
                if not torch.equal(torch.tensor(answer[name], dtype=tensor.dtype), tensor):
                    failures.append(f"client {seed} request {k} ({body['family']}): {name} is not its answer")

    def leaver(seed: int) -> None:
        for body, _ in cases(100 + seed):
            exchange(served.port, body, leave=True)

    run_concurrently(
        [(client, seed) for seed in range(CLIENTS)] + [(leaver, seed) for seed in range(LEAVERS)], failures
    )
    assert not failures, failures[:5]
    assert 0 < _patterns.PATTERNS.nbytes <= 64 * 1024
