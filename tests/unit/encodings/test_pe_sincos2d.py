"""2-D sin-cos tables against transformers' ViTMAE builder and an independent port of MAE's numpy code."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers.models.vit_mae.modeling_vit_mae import build_2d_sinusoidal_position_embedding

from ropeserve.encodings import sincos_2d_table
from ropeserve.errors import InvalidInput

GRIDS = [(1, 1), (4, 4), (14, 14), (3, 7), (7, 3), (16, 9)]


def mae_numpy(embed_dim: int, grid_h: int, grid_w: int, cls_token: bool) -> np.ndarray:
    """facebookresearch/mae ``get_2d_sincos_pos_embed`` generalised to H x W (its meshgrid puts w first)."""

    def one_axis(dim: int, positions: np.ndarray) -> np.ndarray:
        omega = np.arange(dim // 2, dtype=np.float64) / (dim / 2.0)
        omega = 1.0 / 10000**omega
        out = np.einsum("m,d->md", positions.reshape(-1), omega)
        return np.concatenate([np.sin(out), np.cos(out)], axis=1)

    grid = np.meshgrid(np.arange(grid_w, dtype=np.float32), np.arange(grid_h, dtype=np.float32))
    grid = np.stack(grid, axis=0).reshape([2, 1, grid_h, grid_w])
    table = np.concatenate([one_axis(embed_dim // 2, grid[0]), one_axis(embed_dim // 2, grid[1])], axis=1)
    if cls_token:
        table = np.concatenate([np.zeros([1, embed_dim]), table], axis=0)
    return table


@pytest.mark.parametrize(("grid_h", "grid_w"), GRIDS)
@pytest.mark.parametrize("cls_token", [False, True])
@pytest.mark.parametrize("dim", [4, 16, 768])
def test_height_first_equals_transformers(grid_h: int, grid_w: int, cls_token: bool, dim: int) -> None:
    expected = build_2d_sinusoidal_position_embedding(grid_h, grid_w, dim, cls_token=cls_token)
    assert torch.equal(sincos_2d_table(grid_h, grid_w, dim, cls_token=cls_token), expected)


@pytest.mark.parametrize(("grid_h", "grid_w"), GRIDS)
@pytest.mark.parametrize("cls_token", [False, True])
def test_width_first_matches_original_mae(grid_h: int, grid_w: int, cls_token: bool) -> None:
    expected = torch.from_numpy(mae_numpy(64, grid_h, grid_w, cls_token))
    ours = sincos_2d_table(grid_h, grid_w, 64, cls_token=cls_token, first_axis="w", dtype=torch.float64)
    torch.testing.assert_close(ours, expected, rtol=0, atol=1e-12)


@settings(max_examples=30, deadline=None)
@given(grid_h=st.integers(1, 12), grid_w=st.integers(1, 12), quarter=st.integers(1, 16))
def test_halves_encode_their_axis(grid_h: int, grid_w: int, quarter: int) -> None:
    dim = 4 * quarter
    table = sincos_2d_table(grid_h, grid_w, dim, dtype=torch.float64).reshape(grid_h, grid_w, dim)
    half = dim // 2
    assert torch.equal(table[:, :, :half], table[:, :1, :half].expand(-1, grid_w, -1))  # depends on h only
    assert torch.equal(table[:, :, half:], table[:1, :, half:].expand(grid_h, -1, -1))  # depends on w only
    swapped = sincos_2d_table(grid_h, grid_w, dim, first_axis="w", dtype=torch.float64).reshape(grid_h, grid_w, dim)
    assert torch.equal(swapped, torch.cat([table[..., half:], table[..., :half]], dim=-1))


@pytest.mark.parametrize("dim", [0, 2, 6, 18])
def test_dim_must_be_a_multiple_of_four(dim: int) -> None:
    with pytest.raises(InvalidInput) as raised:
        sincos_2d_table(2, 2, dim)
    assert raised.value.field == "dim"
