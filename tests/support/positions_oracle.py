"""Test helpers: the transformers 5.24 oracle, an independent per-token reference, segment -> token rendering,
and hypothesis strategies for M-RoPE batches."""

from __future__ import annotations

import importlib
import types
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from hypothesis import strategies as st

FAMILIES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "glm4v")
MODULE_MODEL_CLASSES = {
    "qwen2_vl": "Qwen2VLModel",
    "qwen2_5_vl": "Qwen2_5_VLModel",
    "qwen3_vl": "Qwen3VLModel",
    "glm4v": "Glm4vModel",
    "qwen3_vl_moe": "Qwen3VLMoeModel",
    "qwen3_5": "Qwen3_5Model",
    "qwen3_5_moe": "Qwen3_5MoeModel",
    "qwen4_exp": "Qwen4ExpModel",
    "glm4v_moe": "Glm4vMoeModel",
    "glm46v": "Glm46VModel",
    "glm_ocr": "GlmOcrModel",
    "cohere_compass": "CohereCompassModel",
    "cosmos3_edge": "Cosmos3EdgeModel",
    "cosmos3_omni": "Cosmos3OmniModel",
    "paddleocr_vl": "PaddleOCRVLModel",
    "ernie4_5_vl_moe": "Ernie4_5_VLMoeModel",
    "hy_v4_vl": "HYV4VLModel",
}
"""transformers 5.24 module -> the class whose ``get_rope_index`` is the oracle."""
SPLIT_FAMILIES = {
    "qwen3_vl",
    "glm4v",
    "qwen3_vl_moe",
    "qwen3_5",
    "qwen3_5_moe",
    "qwen4_exp",
    "glm4v_moe",
    "glm46v",
    "glm_ocr",
    "cohere_compass",
    "cosmos3_edge",
    "cosmos3_omni",
}
"""Modules that split a video into one block per frame (their get_rope_index repeats the grid t times)."""
VIDEO_T_MERGE = {"ernie4_5_vl_moe": 2}
"""Modules whose videos merge frames in time (``t // temporal_merge_size`` LLM frames)."""
ROW_END_TOKENS = {"hy_v4_vl": 1}
"""Modules whose vision rows end with extra tokens (HY-V4-VL: a newline per row, ``w + 1`` columns)."""


def hf_model_class(module: str) -> Any:
    """The transformers 5.24 class of ``module`` (imported on first use)."""
    loaded = importlib.import_module(f"transformers.models.{module}.modeling_{module}")
    return getattr(loaded, MODULE_MODEL_CLASSES[module])


TEXT_ID, IMAGE_ID, VIDEO_ID = 100, 151655, 151656


# ------------------------------------------------------------------------------------------------ transformers oracle
def hf_get_rope_index(
    family: str,
    *,
    input_ids: torch.Tensor,
    mm_token_type_ids: torch.Tensor,
    image_grid_thw: torch.Tensor | None,
    video_grid_thw: torch.Tensor | None,
    attention_mask: torch.Tensor | None,
    second_per_grid_ts: torch.Tensor | None = None,
    spatial_merge_size: int = 2,
    tokens_per_second: float = 2,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``XModel.get_rope_index`` called unbound on a stand-in ``self`` (spec §8 S3)."""
    cls = hf_model_class(family)
    vision_config = types.SimpleNamespace(
        spatial_merge_size=spatial_merge_size,
        tokens_per_second=tokens_per_second,
        temporal_merge_size=VIDEO_T_MERGE.get(family, 1),
    )
    stand_in = types.SimpleNamespace(config=types.SimpleNamespace(vision_config=vision_config))
    stand_in.get_vision_position_ids = types.MethodType(cls.get_vision_position_ids, stand_in)
    kwargs: dict[str, Any] = {}
    if family == "qwen2_5_vl":
        kwargs["second_per_grid_ts"] = second_per_grid_ts
    return cls.get_rope_index(
        stand_in,
        input_ids,
        mm_token_type_ids,
        image_grid_thw=image_grid_thw,
        video_grid_thw=video_grid_thw,
        attention_mask=attention_mask,
        **kwargs,
    )


# ------------------------------------------------------------------------------------------------ segments -> tokens
@dataclass
class TokenBatch:
    input_ids: torch.Tensor
    mm_token_type_ids: torch.Tensor
    attention_mask: torch.Tensor
    image_grid_thw: torch.Tensor | None
    video_grid_thw: torch.Tensor | None
    second_per_grid_ts: torch.Tensor | None

    def kwargs(self) -> dict[str, Any]:
        return {
            "mm_token_type_ids": self.mm_token_type_ids,
            "image_grid_thw": self.image_grid_thw,
            "video_grid_thw": self.video_grid_thw,
            "second_per_grid_ts": self.second_per_grid_ts,
            "attention_mask": self.attention_mask,
        }


def _row_types(segments: list[dict[str, Any]], family: str, merge: int) -> list[int]:
    out: list[int] = []
    row_end = ROW_END_TOKENS.get(family, 0)
    for segment in segments:
        if "text" in segment:
            out += [0] * segment["text"]
        elif "image" in segment:
            t, h, w = segment["image"]
            out += [1] * (t * (h // merge) * (w // merge + row_end))
        else:
            t, h, w = segment["video"]
            if family in SPLIT_FAMILIES:
                gaps = segment.get("frame_gaps", 0)
                gaps = [gaps] * (t - 1) if isinstance(gaps, int) else gaps
                for frame in range(t):
                    if frame:
                        out += [0] * gaps[frame - 1]
                    out += [2] * ((h // merge) * (w // merge))
            else:
                out += [2] * ((t // VIDEO_T_MERGE.get(family, 1)) * (h // merge) * (w // merge + row_end))
    return out


def render_tokens(
    rows: list[list[dict[str, Any]]],
    family: str,
    merge: int,
    *,
    pads: list[int] | None = None,
    left: bool = True,
    with_seconds: bool = True,
) -> TokenBatch:
    """What a serving stack would hold for these segment rows (global grids in row order, padded batch)."""
    type_rows = [_row_types(segments, family, merge) for segments in rows]
    pads = pads or [0] * len(rows)
    width = max(len(r) + p for r, p in zip(type_rows, pads, strict=True))
    types_t = torch.zeros((len(rows), width), dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for b, row in enumerate(type_rows):
        start = width - len(row) if left else 0
        types_t[b, start : start + len(row)] = torch.tensor(row, dtype=torch.long)
        mask[b, start : start + len(row)] = 1
    images = [s["image"] for r in rows for s in r if "image" in s]
    videos = [s["video"] for r in rows for s in r if "video" in s]
    seconds = [s.get("second_per_grid_t", 1.0) for r in rows for s in r if "video" in s]
    ids = torch.full_like(types_t, TEXT_ID)
    ids[types_t == 1] = IMAGE_ID
    ids[types_t == 2] = VIDEO_ID
    return TokenBatch(
        input_ids=ids,
        mm_token_type_ids=types_t,
        attention_mask=mask,
        image_grid_thw=torch.tensor(images, dtype=torch.long) if images else None,
        video_grid_thw=torch.tensor(videos, dtype=torch.long) if videos else None,
        second_per_grid_ts=torch.tensor(seconds, dtype=torch.float32) if (videos and with_seconds) else None,
    )


# ------------------------------------------------------------------------------------------------ reference
def reference_row(
    segments: list[dict[str, Any]], family: str, merge: int, tokens_per_second: float, compat: str
) -> tuple[list[list[int]], int]:
    """Straightforward per-token M-RoPE positions of one row: ``([T, H, W] lists, delta)``.

    Written from the spec (§5.2, §7.9) independently of the library: the block after a vision block starts at
    ``start + max(h', w')`` (transformers5) or at the block's largest position + 1 (transformers4).
    """
    axes: list[list[int]] = [[], [], []]
    current = 0
    scaled = family == "qwen2_5_vl"

    def vision(t: int, h: int, w: int, step: np.float32 | None) -> None:
        nonlocal current
        block_max = current
        for ti in range(t):
            t_pos = current + (ti if step is None else int(np.float32(ti) * step))
            for hi in range(h):
                for wi in range(w):
                    for axis, value in zip(axes, (t_pos, current + hi, current + wi), strict=True):
                        axis.append(value)
                    block_max = max(block_max, t_pos, current + hi, current + wi)
        current = block_max + 1 if compat == "transformers4" else current + max(h, w)

    for segment in segments:
        if "text" in segment:
            for k in range(segment["text"]):
                for axis in axes:
                    axis.append(current + k)
            current += segment["text"]
        elif "image" in segment:
            t, h, w = segment["image"]
            vision(t, h // merge, w // merge, None)
        else:
            t, h, w = segment["video"]
            step = None
            if scaled:
                step = np.float32(np.float32(segment.get("second_per_grid_t", 1.0)) * np.float32(tokens_per_second))
            if family in SPLIT_FAMILIES:
                gaps = segment.get("frame_gaps", 0)
                gaps = [gaps] * (t - 1) if isinstance(gaps, int) else gaps
                for frame in range(t):
                    if frame:
                        for k in range(gaps[frame - 1]):
                            for axis in axes:
                                axis.append(current + k)
                        current += gaps[frame - 1]
                    vision(1, h // merge, w // merge, None)
            else:
                vision(t // VIDEO_T_MERGE.get(family, 1), h // merge, w // merge, step)
    count = len(axes[0])
    delta = (max(max(axis) for axis in axes) + 1 - count) if count else 0
    return axes, delta


# ------------------------------------------------------------------------------------------------ strategies
SECONDS_CHOICES = [1.0, 0.5, 0.25, 1 / 3, 2 / 3, 0.1, 0.75, 1.5, 2 / 2.4, 2 / 30]


@st.composite
def segment_rows(draw: st.DrawFn, family: str, merge: int, max_rows: int = 4) -> list[list[dict[str, Any]]]:
    """Rows of segments that a token sequence can express: several images and videos, t != h != w grids,
    empty text between vision blocks of different kinds, text-only rows, every row non-empty."""
    num_rows = draw(st.integers(1, max_rows))
    rows = []
    for _ in range(num_rows):
        if draw(st.integers(0, 4)) == 0:
            rows.append([{"text": draw(st.integers(1, 6))}])
            continue
        items: list[dict[str, Any]] = []
        for _ in range(draw(st.integers(1, 5))):
            kind = draw(st.sampled_from(["text", "text", "image", "video"]))
            if kind == "text":
                items.append({"text": draw(st.integers(0, 5))})
                continue
            h = merge * draw(st.integers(1, 4))
            w = merge * draw(st.integers(1, 4))
            if kind == "image":
                items.append({"image": [draw(st.sampled_from([1, 1, 1, 2])), h, w]})
                continue
            t_merge = VIDEO_T_MERGE.get(family, 1)
            segment: dict[str, Any] = {"video": [draw(st.integers(t_merge, 4 * t_merge)), h, w]}
            if family == "qwen2_5_vl":
                segment["second_per_grid_t"] = draw(
                    st.one_of(st.sampled_from(SECONDS_CHOICES), st.floats(0.015625, 3.0, width=32))
                )
            if family in SPLIT_FAMILIES and segment["video"][0] > 1:
                frames = segment["video"][0]
                segment["frame_gaps"] = draw(
                    st.one_of(st.integers(1, 4), st.lists(st.integers(1, 4), min_size=frames - 1, max_size=frames - 1))
                )
            items.append(segment)
        rows.append(_separate_same_kind(items))
    return rows


def _separate_same_kind(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Insert one text token between vision segments of the same kind (tokens would merge them into one run)."""
    out: list[dict[str, Any]] = []
    last_vision: str | None = None
    for item in items:
        kind = next(k for k in ("text", "image", "video") if k in item)
        if kind == "text":
            if item["text"] > 0:
                last_vision = None
        elif kind == last_vision:
            out.append({"text": 1})
        else:
            last_vision = kind
        if kind != "text":
            last_vision = kind
        out.append(item)
    if not any(_row_types_nonempty(item) for item in out):
        out.append({"text": 1})
    return out


def _row_types_nonempty(item: dict[str, Any]) -> bool:
    return "text" not in item or item["text"] > 0


def padded_with_holes(
    draw: st.DrawFn,
    rows: list[list[tuple[int, ...]]],
    pads: list[int],
    left: bool,
    fillers: list[tuple[int, ...]],
) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Rows of tokens (each a tuple of channels, e.g. ``(id,)`` or ``(id, type)``) as ``[B, L]`` tensors, one per
    channel, and the ``[B, L]`` mask: padded on one side (``pads`` slots per row), and sometimes with masked-out
    slots inside a row holding any of ``fillers`` (markers and image tokens included), which transformers drops
    before laying the row out."""
    slots = []
    for row in rows:
        row_slots = [(token, 1) for token in row]
        for _ in range(draw(st.integers(1, 2)) if draw(st.integers(0, 3)) == 0 else 0):
            row_slots.insert(draw(st.integers(0, len(row_slots))), (draw(st.sampled_from(fillers)), 0))
        slots.append(row_slots)
    width = max(len(r) + p for r, p in zip(slots, pads, strict=True))
    channels = [torch.full((len(rows), width), value, dtype=torch.long) for value in fillers[0]]
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for b, row_slots in enumerate(slots):
        start = width - len(row_slots) if left else 0
        for c, channel in enumerate(channels):
            channel[b, start : start + len(row_slots)] = torch.tensor([token[c] for token, _ in row_slots])
        mask[b, start : start + len(row_slots)] = torch.tensor([real for _, real in row_slots])
    return channels, mask


MINICPM_MARKERS = {"slice_start": 901, "slice_end": 902, "image_start": 903, "image_end": 904, "newline": 905}
"""MiniCPM-V 4.7 marker ids of the tests (the released tokenizer's are set by the checkpoint)."""


def _model(module: str, name: str) -> Any:
    return getattr(importlib.import_module(f"transformers.models.{module}.modeling_{module}"), name)


def hf_glm_image(
    ids: torch.Tensor, grids: torch.Tensor | None, per_sample: torch.Tensor | None, mask: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """transformers 5.24 ``GlmImageModel.get_rope_index`` (prefill ids, deltas) and its cached decode ids."""
    model = _model("glm_image", "GlmImageModel")
    config = types.SimpleNamespace(image_start_token_id=16384, image_end_token_id=16385)
    stand_in = types.SimpleNamespace(config=config)
    stand_in.get_vision_position_ids = types.MethodType(model.get_vision_position_ids, stand_in)
    ids_out, deltas = model.get_rope_index(
        stand_in, ids, image_grid_thw=grids, images_per_sample=per_sample, attention_mask=mask
    )
    return ids_out, deltas, stand_in._cached_decode_position_ids


def hf_hunyuan(case: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers 5.24 ``HunYuanVLModel.get_rope_index`` of ``case`` (types, grids, mask, merge, axes)."""
    model = _model("hunyuan_vl", "HunYuanVLModel")
    text_config = types.SimpleNamespace(rope_parameters={"mrope_section": [8] * case["axes"]})
    config = types.SimpleNamespace(
        text_config=text_config, vision_config=types.SimpleNamespace(spatial_merge_size=case["merge"])
    )
    stand_in = types.SimpleNamespace(config=config)
    stand_in.get_vision_position_ids = types.MethodType(model.get_vision_position_ids, stand_in)
    return model.get_rope_index(
        stand_in,
        case["types"],
        mm_token_type_ids=case["types"],
        image_grid_thw=case["grids"],
        attention_mask=case["mask"],
    )


def hf_minicpmv(case: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers 5.24 ``MiniCPMV4_7Model.get_rope_index`` of ``case`` (ids, types, sizes by modality, mode,
    mask), with :data:`MINICPM_MARKERS`."""
    model = _model("minicpmv4_7", "MiniCPMV4_7Model")
    markers = {f"{name}_id": value for name, value in MINICPM_MARKERS.items()}
    config = types.SimpleNamespace(downsample_mode=case["mode"], **markers)
    stand_in = types.SimpleNamespace(config=config, _frame_end_idx=model._frame_end_idx)
    for name in ("_group_visual_frames", "get_vision_position_ids"):
        setattr(stand_in, name, types.MethodType(getattr(model, name), stand_in))
    return model.get_rope_index(
        stand_in,
        case["ids"],
        mm_token_type_ids=case["types"],
        target_sizes=case["sizes"][1],
        target_sizes_videos=case["sizes"][2],
        attention_mask=case["mask"],
    )
