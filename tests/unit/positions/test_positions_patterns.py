"""The per-grid pattern cache behind GLM-Image, HunYuan-VL, MiniCPM-V and Omni positions: bounded in bytes,
read-only, and never visible through an answer (a caller mutating its answer in place cannot change the next one)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch

from ropeserve.positions import _patterns
from ropeserve.positions._patterns import (
    ENTRY_OVERHEAD_BYTES,
    PatternCache,
    add_blocks,
    copy_blocks,
    grid_pattern,
    key_bytes,
    real_runs,
)
from ropeserve.positions.glm_image import glm_image_positions
from ropeserve.positions.hunyuan_vl import hunyuan_vl_positions, hunyuan_vl_positions_from_segments
from ropeserve.positions.minicpm_v import MiniCpmMarkers, minicpmv_positions
from ropeserve.positions.omni import omni_positions_from_segments


def test_cache_stays_within_its_byte_budget_and_drops_the_oldest_first() -> None:
    cache = PatternCache(max_bytes=10_000, max_entry_bytes=4_000)
    for size in range(1, 40):
        cache.get(("arange", size * 10), lambda size=size: np.arange(size * 10, dtype=np.int64))
        assert cache.nbytes <= 10_000
    charged = [entry.nbytes + key_bytes(key) + ENTRY_OVERHEAD_BYTES for key, (entry, _) in cache._patterns.items()]
    assert cache.nbytes == sum(charged)
    kept = list(cache._patterns)
    assert kept == sorted(kept)  # the newest survive
    assert ("arange", 390) in cache._patterns and ("arange", 10) not in cache._patterns


def test_an_oversized_pattern_is_built_but_not_kept() -> None:
    cache = PatternCache(max_bytes=10_000, max_entry_bytes=4_000)
    built = cache.get("big", lambda: np.zeros(1_000, dtype=np.int64))  # 8,000 bytes
    assert built.shape == (1_000,) and not built.flags.writeable
    assert len(cache) == 0 and cache.nbytes == 0


def test_empty_patterns_are_charged_so_their_count_stays_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """A HunYuan-VL image with fewer rows than the merge size has an empty grid: its patterns hold no data, and
    charged by their data alone every new width stayed in the cache for good (two entries per image)."""
    cache = PatternCache(max_bytes=64 * 1024, max_entry_bytes=32 * 1024)
    monkeypatch.setattr(_patterns, "PATTERNS", cache)
    for first in range(0, 4000, 500):
        images = [{"image": [1, 1, 2 * width], "markers": True} for width in range(first + 1, first + 501)]
        row = [segment for image in images for segment in ({"text": 1}, image)]
        result = hunyuan_vl_positions_from_segments([row], spatial_merge_size=2)
        assert result.position_ids.shape == (4, 1, 1500)
    assert 0 < len(cache) <= 64 * 1024 // ENTRY_OVERHEAD_BYTES and 0 < cache.nbytes <= 64 * 1024


def test_a_pattern_is_charged_its_key() -> None:
    """GLM-Image keys a decode pattern by the generated grids: a key can be larger than its pattern's data."""
    cache = PatternCache(max_bytes=10_000, max_entry_bytes=4_000)
    grids = tuple((1, 1, width) for width in range(1, 201))
    cache.get(("glm-image-decode", grids), lambda: np.zeros(3, dtype=np.int64))
    assert len(cache) == 0 and cache.nbytes == 0  # 24 bytes of data, a key of more than 4,000
    cache.get(("small", 1), lambda: np.zeros(3, dtype=np.int64))
    assert cache.nbytes == 24 + key_bytes(("small", 1)) + ENTRY_OVERHEAD_BYTES


def test_cached_patterns_are_read_only_and_hits_return_the_same_array() -> None:
    cache = PatternCache()
    calls = []
    first = cache.get("k", lambda: calls.append(1) or np.arange(6, dtype=np.int64))
    again = cache.get("k", lambda: calls.append(1) or np.arange(6, dtype=np.int64))
    assert again is first and calls == [1]
    with pytest.raises(ValueError, match="read-only"):
        first[0] = 5
    with pytest.raises(ValueError, match="read-only"):
        grid_pattern(2, 3, 4)[1, 0] = 7


def test_grid_pattern_is_frame_row_column_of_a_frame_major_grid() -> None:
    t, h, w = torch.meshgrid(torch.arange(2), torch.arange(3), torch.arange(4), indexing="ij")
    expected = torch.stack([t, h, w]).reshape(3, -1).numpy()
    assert np.array_equal(grid_pattern(2, 3, 4), expected)


@pytest.mark.parametrize("size", [3, 600])  # one strided assignment per pattern / one add per block
def test_add_blocks_writes_each_block_at_its_start_with_its_offset(size: int) -> None:
    out = np.full((3, 5 * size), -1, dtype=np.int64)
    block = np.arange(3 * size, dtype=np.int64).reshape(3, size)
    starts = np.array([0, 2 * size + 1, 4 * size])
    offsets = np.array([[10, 20, 30], [0, 0, 0], [1, 2, 3]])
    add_blocks(out, starts, block, offsets)
    expected = np.full_like(out, -1)
    for start, offset in zip(starts, offsets.T, strict=True):
        expected[:, start : start + size] = block + offset[:, None]
    assert np.array_equal(out, expected)


@pytest.mark.parametrize("starts", [[0], [3, 11], [0, 5, 15]])
def test_copy_blocks_writes_the_block_at_each_start_and_nothing_else(starts: list[int]) -> None:
    out = np.full((3, 20), -1, dtype=np.int64)
    block = np.arange(15, dtype=np.int64).reshape(3, 5)
    copy_blocks(out, starts, block)
    expected = np.full_like(out, -1)
    for start in starts:
        expected[:, start : start + 5] = block
    assert np.array_equal(out, expected)


@pytest.mark.parametrize("seed", range(4))
def test_real_runs_agrees_with_a_row_by_row_reading(seed: int) -> None:
    """Left-padded, right-padded, holed, empty and full rows, alone and mixed (each fast path and the general
    one): the first real slot of each row and whether its real slots are one run."""
    rng = np.random.default_rng(seed)
    width = 7
    for _ in range(300):
        rows = []
        for _ in range(rng.integers(1, 5)):
            kind = rng.integers(0, 5)
            length = int(rng.integers(0, width + 1))
            row = np.zeros(width, dtype=bool)
            if kind == 0:
                row[width - length :] = True  # left padding
            elif kind == 1:
                row[:length] = True  # right padding
            elif kind == 2:
                row[:] = rng.random(width) < 0.5  # holes, maybe
            elif kind == 3:
                row[:] = True
            rows.append(row)
        mask = np.stack(rows)
        for lengths in (None, mask.sum(axis=1)):
            first, one_run = real_runs(mask, lengths)
            for b, row in enumerate(mask):
                real = np.flatnonzero(row)
                assert first[b] == (real[0] if real.size else 0)
                assert one_run[b] == (real.size == 0 or real[-1] - real[0] + 1 == real.size)


MARKERS = MiniCpmMarkers(slice_start=901, slice_end=902, image_start=903, image_end=904, newline=905)


def _glm() -> tuple[torch.Tensor, ...]:
    ids = torch.tensor([[7, 16384, *[5] * 6, 16385, 7, 16384], [7, 7, 16384, *[5] * 6, 16385, 16384]])
    grids = torch.tensor([[1, 2, 3], [1, 2, 2], [1, 2, 3], [1, 3, 2]])
    result = glm_image_positions(input_ids=ids, image_grid_thw=grids, images_per_sample=torch.tensor([2, 2]))
    assert result.decode_position_ids is not None
    return result.position_ids, result.mrope_position_deltas, result.decode_position_ids


def _hunyuan() -> tuple[torch.Tensor, ...]:
    types = torch.tensor([[0, *[1] * 6, 0, 0, *[1] * 8, 0], [0, 0, 0, *[1] * 6, 0, *[1] * 6, 0, 0]])
    grids = torch.tensor([[1, 4, 4], [1, 4, 6], [1, 4, 4], [1, 4, 4]])
    result = hunyuan_vl_positions(mm_token_type_ids=types, image_grid_thw=grids)
    return result.position_ids, result.mrope_position_deltas


def _minicpm() -> tuple[torch.Tensor, ...]:
    crop = [8] * 4
    row = [7, 903, *crop, 904, 901, *crop, 902, 901, *crop, 902, 905, 7]
    ids = torch.tensor([row, row])
    result = minicpmv_positions(
        input_ids=ids, mm_token_type_ids=(ids == 8).long(), markers=MARKERS, target_sizes=[[8, 8]] * 6
    )
    return result.position_ids, result.mrope_position_deltas


OMNI_ROWS = [
    [
        {"text": 2},
        {"image": [1, 4, 4]},
        {"text": 2},
        {"image": [2, 4, 6]},
        {"text": 2},
        {"video": [2, 4, 4], "second_per_grid_t": 0.5, "audio": 30},
        {"text": 1},
    ],
    [{"text": 3}, {"image": [1, 4, 4]}, {"text": 1}],
]
"""Single- and two-frame images and a video with its audio, in two rows of different lengths."""


def _omni() -> tuple[torch.Tensor, ...]:
    result = omni_positions_from_segments(OMNI_ROWS, padding_side="left")
    return result.position_ids, result.mrope_position_deltas


def _qwen3_omni() -> tuple[torch.Tensor, ...]:
    result = omni_positions_from_segments(OMNI_ROWS, family="qwen3_omni_moe", padding_side="left")
    return result.position_ids, result.mrope_position_deltas


@pytest.mark.parametrize(
    "positions",
    [_glm, _hunyuan, _minicpm, _omni, _qwen3_omni],
    ids=["glm_image", "hunyuan_vl", "minicpmv4_7", "qwen2_5_omni", "qwen3_omni_moe"],
)
def test_a_mutated_answer_does_not_change_the_next_one(positions: Callable[[], tuple[torch.Tensor, ...]]) -> None:
    first = positions()
    kept = [tensor.clone() for tensor in first]
    for tensor in first:
        tensor.add_(1000)  # a caller writing into its answer in place
    for again, expected in zip(positions(), kept, strict=True):
        assert torch.equal(again, expected)


def test_answers_hold_no_cached_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every answer tensor owns fresh memory: none shares storage with a cached pattern."""
    monkeypatch.setattr(_patterns, "PATTERNS", PatternCache())
    answers = [*_glm(), *_hunyuan(), *_minicpm(), *_omni(), *_qwen3_omni()]
    cached = [pattern for pattern, _ in _patterns.PATTERNS._patterns.values()]
    assert cached  # the families did use the cache
    for tensor in answers:
        for pattern in cached:
            assert not np.shares_memory(tensor.numpy(), pattern)


def test_minicpm_frames_of_many_sizes_stay_within_the_cache_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each frame layout is cached; distinct layouts (here 30 crop sizes) stay within the byte budget (the canvases
    used to sit in an ``lru_cache`` of 4096 entries of any size)."""
    monkeypatch.setattr(_patterns, "PATTERNS", PatternCache(max_bytes=256 * 1024))
    for side in range(20, 50):
        crop = [8] * (side * side)
        ids = torch.tensor([[7, 903, *crop, 904, 7]])
        minicpmv_positions(
            input_ids=ids, mm_token_type_ids=(ids == 8).long(), markers=MARKERS, target_sizes=[[4 * side, 4 * side]]
        )
        assert _patterns.PATTERNS.nbytes <= 256 * 1024
    assert len(_patterns.PATTERNS) < 30
