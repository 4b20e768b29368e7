"""Small JSON requests run on the event loop; large ones in the threadpool (``ropeserve.api.inline``)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from ropeserve.api.inline import INLINE_MAX_POSITIONS, run_sized
from ropeserve.api.routes_positions import (
    MRopePositionsRequest,
    PositionsRequest,
    _positions_bound,
    _prefill_bound,
)


def test_small_work_runs_on_the_loop_thread_and_large_work_elsewhere() -> None:
    async def threads() -> tuple[int, int, int]:
        here = threading.get_ident()
        small = await run_sized(INLINE_MAX_POSITIONS, threading.get_ident)
        large = await run_sized(INLINE_MAX_POSITIONS + 1, threading.get_ident)
        return here, small, large

    here, small, large = asyncio.run(threads())
    assert small == here
    assert large != here


@pytest.mark.parametrize(
    ("body", "bound"),
    [
        ({"cache_lengths": [5, 6], "num_new": 3}, 6),
        ({"cache_lengths": [], "num_new": 4}, 4),
        ({"attention_mask": [[1, 1, 0], [1, 1, 1]]}, 6),
        ({"segment_lengths": [3, 4]}, 7),
        ({"segment_lengths": [3, 4], "total_length": 100}, 107),
        ({"cu_seqlens": [0, 3, 7]}, 7),
        ({"segment_lengths": [2**63 - 1]}, 2**63 - 1),  # refused later; the bound only picks the thread
    ],
)
def test_positions_bound_covers_the_answer(body: dict[str, Any], bound: int) -> None:
    assert _positions_bound(PositionsRequest.model_validate(body)) == bound


def test_prefill_bound_counts_grids_and_ignores_malformed_segments() -> None:
    rows = [[{"text": 12}, {"image": [1, 28, 28]}, {"video": [8, 16, 16], "second_per_grid_t": 0.5}, {"text": "x"}]]
    body = MRopePositionsRequest.model_validate({"family": "qwen2_vl", "rows": rows})
    assert _prefill_bound(body) == 12 + 28 * 28 + 8 * 16 * 16
    tokens = MRopePositionsRequest.model_validate({"family": "qwen2_vl", "mm_token_type_ids": [[0, 1, 1], [0, 0]]})
    assert _prefill_bound(tokens) == 5


@pytest.mark.parametrize(
    ("segment", "bound"),
    [
        ({"image": [1, 2.0, 4]}, 0),
        ({"image": [1, 2, 4, 1]}, 0),
        ({"image": [True, 2, 4]}, 8),  # bools are ints to the bound (refused later)
        ({"video": [2, 4, 4], "frame_gaps": 3, "second_per_grid_t": 2}, 32 + 3 + 2),
        ({"video": [2, 4, 4], "frame_gaps": [1, 2]}, 32),
        ({"text": 10**400}, 10**400),
    ],
)
def test_prefill_bound_of_one_segment(segment: dict[str, Any], bound: int) -> None:
    body = MRopePositionsRequest.model_validate({"family": "qwen2_vl", "rows": [[segment]]})
    assert _prefill_bound(body) == bound


def test_an_inline_cos_sin_answers_while_another_thread_grows_its_table() -> None:
    """A small cos/sin request is answered on the event loop; when another thread holds the table's growth lock
    (growing it, up to its byte cap), the request computes its few positions directly instead of making the
    event loop wait for that growth. Here a helper thread holds the lock until the answer has come (or, on the
    old code, where the answer waited for the lock, until its safety release)."""
    from fastapi.testclient import TestClient

    from ropeserve.api import create_app
    from ropeserve.settings import Settings

    rope = {"rope_theta": 12_345.0, "head_dim": 64}
    with TestClient(create_app(Settings(access_log=False))) as client:
        tables = client.app.state.runtime.tables._tables  # type: ignore[attr-defined]
        before = set(tables)
        assert client.post("/v1/rope/cos-sin", json={"rope": rope, "positions": [0, 1, 2]}).status_code == 200
        (table,) = (tables[key] for key in set(tables) - before)
        held, answered, outcome = threading.Event(), threading.Event(), {}

        def hold() -> None:
            with table._growth_lock:
                held.set()
                outcome["answered_while_held"] = answered.wait(60)

        holder = threading.Thread(target=hold)
        holder.start()
        assert held.wait(60)
        inline = client.post("/v1/rope/cos-sin", json={"rope": rope, "positions": [0, 500, 7]})
        answered.set()
        holder.join()
        assert outcome["answered_while_held"] and inline.status_code == 200
        cached = client.post("/v1/rope/cos-sin", json={"rope": rope, "positions": [0, 500, 7]}).json()
        assert table.rows[0].shape[0] == 512  # grown by the second request, once the lock was free
        assert inline.json()["cos"] == cached["cos"] and inline.json()["sin"] == cached["sin"]


def test_run_inline_restores_the_thread_count_and_the_growth_wait_when_the_work_raises() -> None:
    """``serial_torch`` and ``without_growth_wait`` (classes entered per inline call) undo their setting on the way
    out, also when the work raises, and nest."""
    import torch

    from ropeserve.api.inline import run_inline
    from ropeserve.kernels.threads import serial_torch
    from ropeserve.rope.tables import _WAIT_FOR_GROWTH

    threads = torch.get_num_threads()

    def fails() -> None:
        assert not _WAIT_FOR_GROWTH.get()
        with serial_torch():
            assert torch.get_num_threads() in (1, threads)
        raise ValueError("work failed")

    with pytest.raises(ValueError, match="work failed"):
        run_inline(fails)
    assert _WAIT_FOR_GROWTH.get() and torch.get_num_threads() == threads
