"""Resampling learned position tables: parity with ``F.interpolate`` and ViT's ``interpolate_pos_encoding``."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import ViTConfig
from transformers.models.vit.modeling_vit import ViTEmbeddings

from ropeserve.encodings import RESAMPLE_MODES, resample_table
from ropeserve.errors import InvalidInput

GRID_PAIRS = [((4, 6), (7, 9)), ((7, 9), (4, 6)), ((5, 3), (3, 8)), ((14, 14), (24, 10)), ((6, 6), (6, 6))]
SMOOTH = ["bicubic", "bilinear"]


def reference_grid(grid: torch.Tensor, source: tuple[int, int], target: tuple[int, int], **options) -> torch.Tensor:
    """[H·W, D] -> [H'·W', D] through ``F.interpolate`` directly (float32)."""
    image = grid.float().reshape(1, *source, -1).permute(0, 3, 1, 2)
    resized = F.interpolate(image, size=target, **options)
    return resized.permute(0, 2, 3, 1).reshape(target[0] * target[1], -1)


@pytest.mark.parametrize(("source", "target"), GRID_PAIRS)
@pytest.mark.parametrize("mode", SMOOTH)
@pytest.mark.parametrize("antialias", [False, True])
@pytest.mark.parametrize("align_corners", [False, True])
def test_smooth_modes_equal_interpolate(source, target, mode: str, antialias: bool, align_corners: bool) -> None:
    prefix, dim = 2, 12
    table = torch.randn(prefix + source[0] * source[1], dim)
    ours = resample_table(
        table, source, target, prefix_rows=prefix, mode=mode, antialias=antialias, align_corners=align_corners
    )
    options = {"mode": mode, "antialias": antialias, "align_corners": align_corners}
    assert torch.equal(ours[prefix:], reference_grid(table[prefix:], source, target, **options))
    assert torch.equal(ours[:prefix], table[:prefix])


@pytest.mark.parametrize(("source", "target"), GRID_PAIRS)
@pytest.mark.parametrize("mode", ["nearest", "nearest-exact"])
def test_nearest_modes_copy_rows(source, target, mode: str) -> None:
    table = torch.randn(source[0] * source[1], 5)
    ours = resample_table(table, source, target, mode=mode)
    assert torch.equal(ours, reference_grid(table, source, target, mode=mode))
    assert set(map(tuple, ours.tolist())) <= set(map(tuple, table.tolist()))


def test_bicubic_is_the_default_for_grids() -> None:
    table = torch.randn(1 + 12, 4)
    assert torch.equal(
        resample_table(table, [3, 4], [5, 5], prefix_rows=1),
        resample_table(table, [3, 4], [5, 5], prefix_rows=1, mode="bicubic", align_corners=False),
    )


@pytest.mark.parametrize("target", [(7, 5), (20, 20), (3, 11)])
def test_matches_vit_interpolate_pos_encoding(target: tuple[int, int]) -> None:
    config = ViTConfig(image_size=40, patch_size=4, hidden_size=16, num_channels=3)  # 10 x 10 source grid
    embeddings = ViTEmbeddings(config)
    expected = embeddings.interpolate_pos_encoding(
        torch.zeros(1, target[0] * target[1] + 1, 16), target[0] * 4, target[1] * 4
    )
    table = embeddings.position_embeddings.detach()
    ours = resample_table(table, [10, 10], list(target), prefix_rows=1)
    assert ours.shape == expected.shape == (1, 1 + target[0] * target[1], 16)
    assert torch.equal(ours, expected.detach())


@pytest.mark.parametrize(("length", "target"), [(512, 1024), (512, 300), (7, 8), (1, 4)])
@pytest.mark.parametrize("align_corners", [False, True])
def test_one_dimensional_tables_use_linear_interpolation(length: int, target: int, align_corners: bool) -> None:
    table = torch.randn(length, 24)
    ours = resample_table(table, [length], [target], align_corners=align_corners)
    image = table.T[None]  # [1, D, N]
    expected = F.interpolate(image, size=target, mode="linear", align_corners=align_corners)[0].T
    assert torch.equal(ours, expected)


def test_one_dimensional_nearest_equals_interpolate() -> None:
    table = torch.randn(50, 8)
    expected = F.interpolate(table.T[None], size=77, mode="nearest")[0].T
    assert torch.equal(resample_table(table, [50], [77], mode="nearest"), expected)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_dtype_is_preserved_and_prefix_is_bit_exact(dtype: torch.dtype) -> None:
    table = torch.randn(1 + 6 * 4, 8).to(dtype)
    ours = resample_table(table, [6, 4], [3, 9], prefix_rows=1)
    assert ours.dtype == dtype
    assert torch.equal(ours[0], table[0])
    compute = torch.float64 if dtype == torch.float64 else torch.float32
    expected = F.interpolate(
        table[1:].to(compute).reshape(1, 6, 4, 8).permute(0, 3, 1, 2), size=(3, 9), mode="bicubic"
    ).permute(0, 2, 3, 1)
    assert torch.equal(ours[1:], expected.reshape(27, 8).to(dtype))


@settings(max_examples=30, deadline=None)
@given(
    source=st.tuples(st.integers(1, 9), st.integers(1, 9)),
    target=st.tuples(st.integers(1, 12), st.integers(1, 12)),
    prefix=st.integers(0, 3),
    dim=st.integers(1, 8),
    mode=st.sampled_from(sorted(RESAMPLE_MODES)),
    batched=st.booleans(),
)
def test_random_shapes(source, target, prefix: int, dim: int, mode: str, batched: bool) -> None:
    table = torch.randn(prefix + source[0] * source[1], dim)
    ours = resample_table(table[None] if batched else table, source, target, prefix_rows=prefix, mode=mode)
    assert ours.shape == ((1,) if batched else ()) + (prefix + target[0] * target[1], dim)
    torch_mode = RESAMPLE_MODES[mode].torch_mode
    options = {"mode": torch_mode} | ({"align_corners": False} if RESAMPLE_MODES[mode].smooth else {})
    assert torch.equal(ours.reshape(-1, dim)[prefix:], reference_grid(table[prefix:], source, target, **options))


def test_identity_resize_returns_the_table() -> None:
    table = torch.randn(3 + 20, 6)
    for mode in ["bilinear", "bicubic", "nearest"]:
        torch.testing.assert_close(resample_table(table, [4, 5], [4, 5], prefix_rows=3, mode=mode), table)


@pytest.mark.parametrize(
    ("table", "options", "field"),
    [
        (torch.randn(17, 4), {"source_grid": [4, 4]}, "table"),
        (torch.randn(2, 16, 4), {"source_grid": [4, 4]}, "table"),
        (torch.ones(16, 4, dtype=torch.int64), {"source_grid": [4, 4]}, "table"),
        (torch.full((16, 4), float("nan")), {"source_grid": [4, 4]}, "table"),
        (torch.full((16, 4), float("inf")), {"source_grid": [4, 4]}, "table"),
        (torch.randn(16, 4), {"source_grid": [4, 4], "mode": "lanczos"}, "mode"),
        (torch.randn(16, 4), {"source_grid": [4, 4], "mode": "nearest", "antialias": True}, "antialias"),
        (torch.randn(16, 4), {"source_grid": [4, 4], "mode": "nearest", "align_corners": False}, "align_corners"),
        (torch.randn(16, 4), {"source_grid": [4, 4], "target_grid": [16]}, "target_grid"),
        (torch.randn(16, 4), {"source_grid": [2, 2, 4], "target_grid": [2, 2, 4]}, "source_grid"),
        (torch.randn(16, 4), {"source_grid": [4, 4], "target_grid": [0, 4]}, "target_grid"),
        (torch.randn(16, 4), {"source_grid": [4, 4], "prefix_rows": -1}, "prefix_rows"),
    ],
)
def test_invalid_inputs_name_the_field(table: torch.Tensor, options: dict, field: str) -> None:
    options = {"target_grid": [5, 5]} | options
    with pytest.raises(InvalidInput) as raised:
        resample_table(table, options.pop("source_grid"), options.pop("target_grid"), **options)
    assert raised.value.field == field
