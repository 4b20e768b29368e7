"""Qwen2.5-Omni test helpers: the transformers 5.24 oracle, segment rows -> the processor's token ids, and a
hypothesis strategy for rows with images, videos, audio and (optionally) audio interleaved with its video."""

from __future__ import annotations

import types
from dataclasses import dataclass
from typing import Any

import torch
from hypothesis import strategies as st
from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import (
    Qwen2_5OmniPreTrainedModelForConditionalGeneration as OmniModel,
)
from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import (
    Qwen3OmniMoePreTrainedModelForConditionalGeneration as Omni3Model,
)

TEXT_ID, IMAGE_ID, VIDEO_ID, AUDIO_ID = 100, 151655, 151656, 151646
VISION_START, VISION_END, AUDIO_START, AUDIO_END = 151652, 151653, 151647, 151648


def audio_tokens(seqlen: int) -> int:
    """Written from the model code's formula, independently of ropeserve."""
    return ((seqlen - 1) // 2 + 1 - 2) // 2 + 1


def audio_tokens_qwen3(seqlen: int) -> int:
    """Qwen3-Omni's ``_get_feat_extract_output_lengths`` (n_window 50)."""
    leave = seqlen % 100
    feat = (leave - 1) // 2 + 1
    return ((feat - 1) // 2 + 1 - 1) // 2 + 1 + (seqlen // 100) * 13


def _call_get_rope_index(model: Any, batch: OmniBatch, merge: int, pps: int, **config: Any) -> tuple:
    """``model.get_rope_index`` on a stand-in ``self`` with the token ids above and ``config``'s extra keys."""
    ids = {"image_token_id": IMAGE_ID, "video_token_id": VIDEO_ID, "audio_token_id": AUDIO_ID}
    ids |= {"vision_start_token_id": VISION_START, "audio_start_token_id": AUDIO_START}
    stand_in = types.SimpleNamespace(
        config=types.SimpleNamespace(**ids, position_id_per_seconds=pps, **config), spatial_merge_size=merge
    )
    for helper in ("get_llm_pos_ids_for_vision", "get_chunked_index"):
        if hasattr(model, helper):
            setattr(stand_in, helper, types.MethodType(getattr(model, helper), stand_in))
    return model.get_rope_index(
        stand_in,
        batch.input_ids,
        image_grid_thw=batch.image_grid_thw,
        video_grid_thw=batch.video_grid_thw,
        attention_mask=batch.attention_mask,
        use_audio_in_video=batch.use_audio_in_video,
        audio_seqlens=batch.audio_seqlens,
        second_per_grids=batch.second_per_grid_ts,
    )


def hf_qwen3_omni_get_rope_index(batch: OmniBatch, *, merge: int, pps: int) -> tuple:
    """``Qwen3OmniMoePreTrainedModelForConditionalGeneration.get_rope_index`` (audio n_window 50)."""
    return _call_get_rope_index(Omni3Model, batch, merge, pps, audio_config=types.SimpleNamespace(n_window=50))


def hf_omni_get_rope_index(batch: OmniBatch, *, merge: int, pps: int, seconds_per_chunk: int) -> tuple:
    """``Qwen2_5OmniPreTrainedModelForConditionalGeneration.get_rope_index``."""
    return _call_get_rope_index(OmniModel, batch, merge, pps, seconds_per_chunk=seconds_per_chunk)


@dataclass
class OmniBatch:
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    image_grid_thw: torch.Tensor | None
    video_grid_thw: torch.Tensor | None
    second_per_grid_ts: torch.Tensor | None
    audio_seqlens: torch.Tensor | None
    use_audio_in_video: bool

    def token_form(self, family: str) -> dict[str, Any]:
        """The ``/v1/mrope/positions`` body of this batch in the token form (the grids the batch has)."""
        tensors = {
            "input_ids": self.input_ids,
            "attention_mask": self.attention_mask,
            "image_grid_thw": self.image_grid_thw,
            "video_grid_thw": self.video_grid_thw,
            "second_per_grid_ts": self.second_per_grid_ts,
            "audio_seqlens": self.audio_seqlens,
        }
        given = {name: tensor.tolist() for name, tensor in tensors.items() if tensor is not None}
        return {"family": family, **given, "use_audio_in_video": self.use_audio_in_video}


def _row_ids(row: list[dict[str, Any]], merge: int, tokens_of: Any = audio_tokens) -> list[int]:
    """Token ids of one row; a vision or audio segment's start/end markers are the last/first token of the text
    around it (segments with audio in their video carry their own four markers)."""
    ids: list[int] = []
    for segment in row:
        if "text" in segment:
            ids += [TEXT_ID] * segment["text"]
            continue
        kind = "image" if "image" in segment else "video" if "video" in segment else "audio"
        if kind == "audio":
            ids[-1] = AUDIO_START
            ids += [AUDIO_ID] * tokens_of(segment["audio_seqlen"])
            ids.append(AUDIO_END)
            continue
        t, h, w = segment[kind]
        vision = [IMAGE_ID if kind == "image" else VIDEO_ID] * (t * (h // merge) * (w // merge))
        if "audio_seqlen" in segment:
            ids += [VISION_START, AUDIO_START, *vision, *[AUDIO_ID] * tokens_of(segment["audio_seqlen"])]
            ids += [AUDIO_END, VISION_END]
        else:
            ids[-1] = VISION_START
            ids += [*vision, VISION_END]
    return ids


def render_omni(
    rows: list[list[dict[str, Any]]],
    merge: int,
    *,
    use_audio_in_video: bool,
    pads: list[int],
    left: bool,
    tokens_of: Any = audio_tokens,
) -> OmniBatch:
    id_rows = [_row_ids(row, merge, tokens_of) for row in rows]
    width = max(len(r) + p for r, p in zip(id_rows, pads, strict=True))
    ids = torch.full((len(rows), width), TEXT_ID, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for b, row in enumerate(id_rows):
        start = width - len(row) if left else 0
        ids[b, start : start + len(row)] = torch.tensor(row)
        mask[b, start : start + len(row)] = 1
    segments = [s for row in rows for s in row]
    images = [s["image"] for s in segments if "image" in s]
    videos = [s for s in segments if "video" in s]
    audios = [s["audio_seqlen"] for s in segments if "audio_seqlen" in s]
    return OmniBatch(
        input_ids=ids,
        attention_mask=mask,
        image_grid_thw=torch.tensor(images) if images else None,
        video_grid_thw=torch.tensor([s["video"] for s in videos]) if videos else None,
        second_per_grid_ts=torch.tensor([s["second_per_grid_t"] for s in videos], dtype=torch.float32)
        if videos
        else None,
        audio_seqlens=torch.tensor(audios) if audios else None,
        use_audio_in_video=use_audio_in_video,
    )


def as_segments(
    rows: list[list[dict[str, Any]]], merge: int, tokens_of: Any = audio_tokens
) -> list[list[dict[str, Any]]]:
    """The ropeserve segment form of the rows (audio as token counts; markers of audio-in-video inside)."""
    out = []
    for row in rows:
        converted: list[dict[str, Any]] = []
        for segment in row:
            if "text" in segment:
                converted.append(segment)
                continue
            rest = {k: v for k, v in segment.items() if k != "audio_seqlen"}
            if "audio_seqlen" in segment:
                rest["audio"] = tokens_of(segment["audio_seqlen"])
            converted.append(rest)
            if "video" not in segment or "audio_seqlen" not in segment:
                converted.append({"text": 1})  # the end marker render_omni adds
        out.append(converted)
    return out


@st.composite
def omni_rows(draw: st.DrawFn, merge: int, use_audio_in_video: bool) -> list[list[dict[str, Any]]]:
    """Rows of text (at least 2 tokens between blocks: one block's end marker and the next one's start marker),
    images, videos (with their audio when ``use_audio_in_video``) and audio."""
    rows = []
    for _ in range(draw(st.integers(1, 3))):
        row: list[dict[str, Any]] = [{"text": draw(st.integers(2, 5))}]
        for _ in range(draw(st.integers(1, 4))):
            kind = draw(st.sampled_from(["image", "video", "audio"]))
            grid = [draw(st.integers(1, 4)), merge * draw(st.integers(1, 3)), merge * draw(st.integers(1, 3))]
            if kind == "image":
                row.append({"image": [draw(st.sampled_from([1, 1, 2, 3])), *grid[1:]]})
            elif kind == "audio":
                row.append({"audio_seqlen": draw(st.integers(3, 500))})
            else:
                seconds = draw(st.sampled_from([0.5, 1.0, 2.0, 0.7, 1 / 3, 3.0, 12.5]))
                segment: dict[str, Any] = {"video": grid, "second_per_grid_t": float(torch.tensor(seconds).float())}
                if use_audio_in_video:
                    segment["audio_seqlen"] = draw(st.integers(3, 800))
                row.append(segment)
            row.append({"text": draw(st.integers(2, 5))})
        rows.append(row)
    return rows
