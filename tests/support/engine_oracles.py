"""Ports of the serving engines' M-RoPE and dynamic-NTK reference functions, for the ``compat`` / ``dynamic_ntk``
parity tests. Each keeps the engine's arithmetic (operation order, dtypes, what it scans for) and drops the rest.

- vLLM ``Qwen2_5_VLForConditionalGeneration.get_mrope_input_positions``
  (vllm/model_executor/models/qwen2_5_vl.py at vllm-project/vllm@002d181a55a03803d7d69547846630069d2378b8):
  one sequence of token ids; vision blocks found by ``vision_start`` + next token; images pass
  ``second_per_grid_t = 0.0``, videos ``second_per_grid_ts[i]`` (a Python float list; 1.0 when absent); the
  temporal index is ``(arange(t) * second_per_grid_t * tokens_per_second).long()``; every block starts at the
  previous block's max + 1. The Qwen2-VL model's twin uses ``arange(t)`` as the temporal index.
- SGLang ``MRotaryEmbedding.get_rope_index`` (python/sglang/srt/layers/rotary_embedding.py at
  sgl-project/sglang@00a66ebe136b90479f9ccf9fc4f3d1c08251981c): the same scan over a ``[B, L]`` batch without
  padding; images ``second_per_grid_t = 0``, videos ``second_per_grid_ts[i]`` (a 0-d float32 tensor);
  ``model_type`` ``qwen2_5_vl`` scales time, ``qwen2_vl`` uses ``arange(t)``.
- vLLM ``DynamicNTKScalingRotaryEmbedding._compute_cos_sin_cache``
  (vllm/model_executor/layers/rotary_embedding/dynamic_ntk_scaling_rope.py at
  vllm-project/vllm@50feac95f9e53a97d6ed27fee6bfe3b163d18594) with ``RotaryEmbedding._compute_inv_freq``
  (base.py at vllm-project/vllm@04458da08417899fc04046216c986d28abeb85af).
"""

from __future__ import annotations

from typing import Any

import torch

VISION_START_ID = 151652


def _find(tokens: list[int], token: int, start: int, remaining: int) -> int:
    if remaining > 0 and token in tokens[start:]:
        return tokens.index(token, start)
    return len(tokens) + 1


def _block(
    st_idx: int, t: int, h: int, w: int, time: torch.Tensor | None, text_len: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(text positions, vision positions) of one text run followed by one vision block, engine style."""
    text = torch.arange(text_len).view(1, -1).expand(3, -1) + st_idx
    frames = torch.arange(t).view(-1, 1).expand(-1, h * w)
    t_index = (frames if time is None else time.long()).flatten()
    h_index = torch.arange(h).view(1, -1, 1).expand(t, -1, w).flatten()
    w_index = torch.arange(w).view(1, 1, -1).expand(t, h, -1).flatten()
    return text, torch.stack([t_index, h_index, w_index]) + text_len + st_idx


def _scan(
    tokens: list[int],
    image_grids: list[list[int]],
    video_grids: list[list[int]],
    seconds: list[Any],
    merge: int,
    time_of: Any,
    ids: tuple[int, int],
) -> tuple[torch.Tensor, int, int, int]:
    """The engines' loop over one sequence: ``(positions [3, L], delta, images used, videos used)``.

    ``time_of(t, h, w, second_per_grid_t or None for images)`` gives the float temporal tensor or None."""
    image_id, video_id = ids
    row = torch.tensor(tokens)
    starts = torch.argwhere(row == VISION_START_ID).squeeze(1)
    following = row[starts + 1]
    images, videos = int((following == image_id).sum()), int((following == video_id).sum())
    parts: list[torch.Tensor] = []
    st = image_index = video_index = 0
    remain_images, remain_videos = images, videos
    for _ in range(images + videos):
        ed_image = _find(tokens, image_id, st, remain_images)
        ed_video = _find(tokens, video_id, st, remain_videos)
        if ed_image < ed_video:
            t, h, w = image_grids[image_index]
            second = None
            image_index, remain_images, ed = image_index + 1, remain_images - 1, ed_image
        else:
            t, h, w = video_grids[video_index]
            second = seconds[video_index] if seconds else 1.0
            video_index, remain_videos, ed = video_index + 1, remain_videos - 1, ed_video
        h, w = h // merge, w // merge
        st_idx = int(parts[-1].max()) + 1 if parts else 0
        text, vision = _block(st_idx, t, h, w, time_of(t, h, w, second), ed - st)
        parts += [text, vision]
        st = ed + t * h * w
    if st < len(tokens):
        st_idx = int(parts[-1].max()) + 1 if parts else 0
        parts.append(torch.arange(len(tokens) - st).view(1, -1).expand(3, -1) + st_idx)
    positions = torch.cat(parts, dim=1).reshape(3, -1)
    return positions, int(positions.max()) + 1 - len(tokens), image_index, video_index


def vllm_mrope_input_positions(
    tokens: list[int],
    image_grids: list[list[int]],
    video_grids: list[list[int]],
    second_per_grid_ts: list[float],
    *,
    model: str,
    merge: int,
    tokens_per_second: float,
    ids: tuple[int, int],
) -> tuple[torch.Tensor, int]:
    """vLLM's ``get_mrope_input_positions`` for one sequence (``model``: ``qwen2_vl`` or ``qwen2_5_vl``)."""

    def time_of(t: int, h: int, w: int, second: float | None) -> torch.Tensor | None:
        if model == "qwen2_vl":
            return None
        value = 0.0 if second is None else second  # images: video_second_per_grid_t stays 0.0
        return torch.arange(t).view(-1, 1).expand(-1, h * w) * value * tokens_per_second

    positions, delta, _, _ = _scan(tokens, image_grids, video_grids, second_per_grid_ts, merge, time_of, ids)
    return positions, delta


def sglang_get_rope_index(
    input_ids: torch.Tensor,
    image_grid_thw: torch.Tensor | None,
    video_grid_thw: torch.Tensor | None,
    second_per_grid_ts: torch.Tensor | None,
    *,
    model_type: str,
    merge: int,
    tokens_per_second: float,
    ids: tuple[int, int],
) -> tuple[torch.Tensor, torch.Tensor]:
    """SGLang's static ``MRotaryEmbedding.get_rope_index`` over a ``[B, L]`` batch (grids global over the batch)."""
    position_ids = torch.ones(3, *input_ids.shape, dtype=input_ids.dtype)
    deltas = []
    images = image_grid_thw.tolist() if image_grid_thw is not None else []
    videos = video_grid_thw.tolist() if video_grid_thw is not None else []
    seconds = list(second_per_grid_ts) if second_per_grid_ts is not None else []  # 0-d float32 tensors

    def time_of(t: int, h: int, w: int, second: Any) -> torch.Tensor | None:
        if model_type == "qwen2_vl":
            return None
        value = 0 if second is None else second  # images: second_per_grid_t = 0
        return torch.arange(t).view(-1, 1).expand(-1, h * w) * value * tokens_per_second

    for i, row in enumerate(input_ids):
        positions, delta, used_images, used_videos = _scan(row.tolist(), images, videos, seconds, merge, time_of, ids)
        images, videos, seconds = images[used_images:], videos[used_videos:], seconds[used_videos:]
        position_ids[:, i, :] = positions
        deltas.append(delta)
    return position_ids, torch.tensor(deltas).unsqueeze(1)


def vllm_dynamic_ntk_cos_sin_cache(
    rotary_dim: int, max_position_embeddings: int, base: float, scaling_factor: float
) -> torch.Tensor:
    """vLLM's dynamic-NTK cos/sin cache ``[max_position_embeddings * factor, rotary_dim]`` (cos | sin halves)."""
    max_len = max_position_embeddings * scaling_factor
    scaled_base = base * ((scaling_factor * max_len / max_position_embeddings) - (scaling_factor - 1)) ** (
        rotary_dim / (rotary_dim - 2)
    )
    inv_freq = 1.0 / (scaled_base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float) / rotary_dim))
    t = torch.arange(max_len, dtype=torch.float)
    freqs = torch.einsum("i,j -> ij", t, inv_freq)
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1)


def vllm_rotary_cos_sin_cache(rotary_dim: int, max_position: int, base: float) -> torch.Tensor:
    """vLLM ``RotaryEmbedding._compute_cos_sin_cache`` (base.py at vllm@04458da08417): ``[max_position, rotary_dim]``
    float32, cos half then sin half (the module casts it to the model dtype)."""
    inv_freq = 1.0 / (base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float) / rotary_dim))
    t = torch.arange(max_position, dtype=torch.float)
    freqs = torch.einsum("i,j -> ij", t, inv_freq)
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1)


def _vllm_apply_rotary_emb_torch(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, neox: bool) -> torch.Tensor:
    cos, sin = cos.unsqueeze(-2).to(x.dtype), sin.unsqueeze(-2).to(x.dtype)
    if neox:
        x1, x2 = torch.chunk(x, 2, dim=-1)
    else:
        x1, x2 = x[..., ::2], x[..., 1::2]
    o1 = x1 * cos - x2 * sin
    o2 = x2 * cos + x1 * sin
    return torch.cat((o1, o2), dim=-1) if neox else torch.stack((o1, o2), dim=-1).flatten(-2)


def vllm_rotary_forward_native(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    *,
    head_size: int,
    rotary_dim: int,
    neox: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """vLLM ``RotaryEmbedding.forward_native`` (base.py at vllm@04458da08417) with ``apply_rotary_emb_torch``:
    ``query``/``key`` ``[tokens, heads * head_size]``, ``positions`` ``[tokens]``."""
    positions = positions.flatten()
    tokens = positions.shape[0]
    cos, sin = cos_sin_cache.index_select(0, positions).chunk(2, dim=-1)
    out = []
    for x in (query, key):
        shape = x.shape
        x = x.view(tokens, -1, head_size)
        rotated = _vllm_apply_rotary_emb_torch(x[..., :rotary_dim], cos, sin, neox)
        out.append(torch.cat((rotated, x[..., rotary_dim:]), dim=-1).reshape(shape))
    return out[0], out[1]
