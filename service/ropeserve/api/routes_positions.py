"""Position ids (1-D and M-RoPE), M-RoPE cos/sin and the vision tower's 2-D rotary."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Annotated, Any, Literal, NamedTuple

import numpy as np
import torch
from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, ValidationError, model_validator

from ropeserve.api.docs import operation_id
from ropeserve.api.inline import run_sized, total
from ropeserve.api.json_route import JSONRoute
from ropeserve.api.negotiation import TENSOR_RESPONSES, tensor_response
from ropeserve.api.problems import problem_responses
from ropeserve.api.runtime import Runtime, RuntimeDep
from ropeserve.api.schemas import (
    DTYPES,
    DtypeName,
    Int64,
    PairingName,
    RopeSource,
    StrictModel,
    require_exactly_one,
)
from ropeserve.config import preset_config
from ropeserve.config.validate import MAX_HEAD_DIM
from ropeserve.errors import InvalidInput, check_limit
from ropeserve.positions import (
    DEFAULT_COMPAT,
    INT64_MAX,
    MAX_TOKENS_PER_SECOND,
    decode_position_array,
    mrope_decode_array,
    mrope_positions_from_tokens,
    packed_position_array,
    positions_from_attention_mask,
    segment_layout,
    slice_prefill_positions,
    vision_position_ids,
)
from ropeserve.positions.glm_image import glm_image_positions, glm_image_positions_from_segments
from ropeserve.positions.hunyuan_vl import hunyuan_vl_positions, hunyuan_vl_positions_from_segments
from ropeserve.positions.minicpm_v import MiniCpmMarkers, minicpmv_positions
from ropeserve.positions.omni import omni_positions_from_segments, omni_positions_from_tokens
from ropeserve.rope import mrope_cos_sin, vision_cos_sin

GRID_AXES = 3


def check_decode_size(cache_lengths: list[int], num_new: int, limit: int) -> None:
    """Decode positions: rows × ``num_new`` within ``limit``, and ``num_new`` alone too (``arange(num_new)`` is
    built even for zero rows)."""
    check_limit(max(len(cache_lengths), 1) * num_new, limit, "positions", "num_new")


VISION_HEAD_DIM_MIN = 4
"""Smallest vision head size: the 2-D rotary splits it into (h, w) halves of cos/sin pairs."""
router = APIRouter(tags=["positions"], route_class=JSONRoute, generate_unique_id_function=operation_id)
ERRORS = problem_responses(406, 413, 422)
IntMatrix = list[list[Int64]]
Compat = Literal["transformers5", "transformers4", "vllm", "sglang"]


class PositionsRequest(StrictModel):
    """1-D positions. Modes: ``attention_mask`` (padded batch), ``segment_lengths``/``cu_seqlens`` (packed),
    ``cache_lengths`` (the next ``num_new`` decode positions)."""

    attention_mask: IntMatrix | None = Field(None, description="[B, T] 0/1; left, right or interior padding.")
    segment_lengths: list[Int64] | None = Field(None, description="Packed sequence lengths; positions restart.")
    cu_seqlens: list[Int64] | None = Field(None, description="Packed boundaries [0, l0, l0+l1, ...].")
    cache_lengths: list[Int64] | None = Field(None, description="Decode: tokens already cached per row.")
    past_lengths: list[Int64] | None = Field(None, description="Continuation: cache length per row / segment.")
    num_new: Int64 = Field(1, ge=1, description="Decode: positions per row (>1 for speculative decoding).")
    total_length: Int64 | None = Field(None, ge=0, description="Packed: pad the output to this many tokens.")
    fill_value: Int64 = Field(0, description="Value of padded slots (transformers uses 0).")

    @model_validator(mode="after")
    def _one_mode(self) -> PositionsRequest:
        require_exactly_one(self, ("attention_mask", "segment_lengths", "cu_seqlens", "cache_lengths"))
        return self


def _positions_1d(body: PositionsRequest, limit: int) -> tuple[str, torch.Tensor | np.ndarray]:
    """The mode and its positions: a tensor for an attention mask (torch), else a numpy array (packed and decode
    positions are computed in numpy: the answer needs no tensor)."""
    if body.attention_mask is not None:
        check_limit(sum(len(row) for row in body.attention_mask), limit, "positions", "attention_mask")
        return "attention_mask", positions_from_attention_mask(
            body.attention_mask, past_lengths=body.past_lengths, fill_value=body.fill_value
        )
    if body.cache_lengths is not None:
        check_decode_size(body.cache_lengths, body.num_new, limit)
        return "decode", decode_position_array(body.cache_lengths, body.num_new)
    positions = packed_position_array(
        segment_lengths=body.segment_lengths,
        cu_seqlens=body.cu_seqlens,
        past_lengths=body.past_lengths,
        total_length=body.total_length,
        fill_value=body.fill_value,
        max_tokens=limit,
    )
    return "packed", positions


@router.post(
    "/v1/positions",
    summary="1-D position ids: padding, packing, continuation, decode",
    responses={**TENSOR_RESPONSES, **ERRORS},
    response_class=Response,
)
async def positions(body: PositionsRequest, request: Request, runtime: RuntimeDep) -> Response:
    uses_torch = body.attention_mask is not None  # the other modes run in numpy (``_positions_1d``)
    return await run_sized(_positions_bound(body), lambda: _positions(body, request, runtime), uses_torch=uses_torch)


def _positions_bound(body: PositionsRequest) -> int:
    """At least as many positions as the answer holds (the inline/threadpool choice)."""
    if body.attention_mask is not None:
        return sum(len(row) for row in body.attention_mask)
    if body.cache_lengths is not None:
        return max(len(body.cache_lengths), 1) * body.num_new
    ends = [body.total_length, total(body.segment_lengths or ()), *(body.cu_seqlens or ())[-1:]]
    return total(ends) + total(body.past_lengths or ())


def _positions(body: PositionsRequest, request: Request, runtime: Runtime) -> Response:
    mode, ids = _positions_1d(body, runtime.settings.max_positions)
    meta = {"mode": mode, "shape": list(ids.shape), "fill_value": body.fill_value}
    return tensor_response(request, {"positions": ids}, meta, runtime.settings.json_response_max_elements)


class VisionConfig(BaseModel):
    """The keys of a config's ``vision_config`` these routes read, bounded like the explicit request fields."""

    model_config = ConfigDict(extra="ignore", strict=True, allow_inf_nan=False, frozen=True)
    spatial_merge_size: Int64 | None = Field(None, ge=1, le=64)
    tokens_per_second: float | None = Field(None, gt=0)
    hidden_size: Int64 | None = Field(None, ge=1)
    embed_dim: Int64 | None = Field(None, ge=1)
    num_heads: Int64 | None = Field(None, ge=1)

    def head_dim(self) -> int | None:
        """``hidden_size // num_heads`` (``embed_dim`` for Qwen2-VL), in the explicit ``head_dim``'s range."""
        hidden = self.hidden_size or self.embed_dim
        if hidden is None or self.num_heads is None:
            return None
        head_dim = hidden // self.num_heads
        if not VISION_HEAD_DIM_MIN <= head_dim <= MAX_HEAD_DIM:
            raise InvalidInput(
                f"vision_config gives head_dim {head_dim}; it must be in {VISION_HEAD_DIM_MIN}..{MAX_HEAD_DIM}",
                field="/config/vision_config/num_heads",
            )
        return head_dim


def vision_config(config: Mapping[str, Any]) -> VisionConfig:
    """The config's ``vision_config`` (absent: empty), checked; InvalidInput names ``/config/vision_config/<key>``."""
    vision = config.get("vision_config") or {}
    if not isinstance(vision, Mapping):
        raise InvalidInput(
            f"vision_config must be a JSON object, got {type(vision).__name__}", field="/config/vision_config"
        )
    try:
        return VisionConfig.model_validate(vision)
    except ValidationError as error:
        first = error.errors()[0]
        key = "/".join(str(part) for part in first["loc"])
        raise InvalidInput(f"vision_config.{key}: {first['msg']}", field=f"/config/vision_config/{key}") from None


@functools.cache
def preset_vision_config(name: str) -> VisionConfig:
    """A preset's checked ``vision_config``, checked once per preset (presets are constants; an unknown name raises
    and is not cached)."""
    return vision_config(preset_config(name))


def source_vision_config(config: Mapping[str, Any] | None, preset: str | None) -> VisionConfig:
    """The checked ``vision_config`` of the request's config, else of its preset, else an empty one."""
    if config is not None:
        return vision_config(config)
    return preset_vision_config(preset) if preset else VisionConfig()


class MRopeModel(StrictModel):
    """Which M-RoPE family and vision settings: ``family`` and/or a ``preset``/``config`` to read them from."""

    family: str | None = Field(
        None, description="A transformers module name: qwen2_vl, qwen2_5_vl, qwen3_vl, qwen3_5, glm4v, ... (README)."
    )
    preset: str | None = Field(None, description="A preset whose model_type and vision_config give the family.")
    config: dict[str, Any] | None = Field(None, description="A config.json giving model_type and vision_config.")
    spatial_merge_size: Int64 | None = Field(None, ge=1, le=64, description="Default: the config's, else the family's.")
    tokens_per_second: float | None = Field(
        None, gt=0, le=MAX_TOKENS_PER_SECOND, description="Qwen2.5-VL video time scale (default 2)."
    )

    def resolve(self) -> tuple[str, int | None, float | None]:
        """``(family, spatial_merge_size, tokens_per_second)`` with explicit fields winning over the config."""
        config = self.config if self.config is not None else (preset_config(self.preset) if self.preset else None)
        if config is None:
            if self.family is None:
                raise InvalidInput("give family, preset or config", field="family")
            return self.family, self.spatial_merge_size, self.tokens_per_second
        vision = source_vision_config(self.config, self.preset)
        family = self.family or config.get("model_type")
        if not isinstance(family, str):
            raise InvalidInput("the config has no model_type; give family", field="family")
        return (
            family,
            self.spatial_merge_size or vision.spatial_merge_size,
            self.tokens_per_second or vision.tokens_per_second,
        )


class MRopePositionsRequest(MRopeModel):
    """Prefill M-RoPE positions from segment lists (``rows``) or from what a serving stack holds (token form)."""

    rows: list[list[dict[str, Any]]] | None = Field(
        None,
        description='Segment list per row, e.g. [{"text": 12}, {"image": [1, 28, 28]}, '
        '{"video": [8, 16, 16], "second_per_grid_t": 0.5}, {"text": 5}].',
    )
    mm_token_type_ids: IntMatrix | None = Field(None, description="[B, L]: 0 text, 1 image pad, 2 video pad.")
    input_ids: IntMatrix | None = Field(None, description="[B, L] token ids (image/video pad ids from the family).")
    image_token_id: Int64 | None = None
    video_token_id: Int64 | None = None
    image_grid_thw: IntMatrix | None = Field(None, description="[N_img, 3] (t, h, w) in patches, batch order.")
    video_grid_thw: IntMatrix | None = Field(None, description="[N_vid, 3] (t, h, w) in patches, batch order.")
    second_per_grid_ts: list[float] | None = Field(None, description="Qwen2.5-VL: seconds per temporal patch.")
    attention_mask: IntMatrix | None = Field(None, description="[B, L] 0/1 (token form).")
    images_per_sample: list[Int64] | None = Field(None, description="GLM-Image: how many grids each row owns.")
    num_axes: int = Field(4, ge=3, le=16, description="HunYuan-VL: position axes (len of its mrope_section).")
    target_sizes: IntMatrix | None = Field(None, description="MiniCPM-V 4.7: [H, W] of each image crop, in order.")
    target_sizes_videos: IntMatrix | None = Field(None, description="MiniCPM-V 4.7: [H, W] of each video crop.")
    downsample_mode: Literal["16x", "4x"] = Field("16x", description="MiniCPM-V 4.7: patches merged per token.")
    marker_ids: dict[str, Int64] | None = Field(
        None,
        description="MiniCPM-V 4.7: slice_start, slice_end, image_start, image_end, newline token ids (default: "
        "the config's *_id keys).",
    )
    audio_seqlens: list[Int64] | None = Field(None, description="Qwen2.5-Omni token form: audio feature frames each.")
    use_audio_in_video: bool = Field(False, description="Qwen2.5-Omni token form: videos carry their audio.")
    position_id_per_seconds: float | None = Field(None, description="Qwen2.5-Omni time scale (default 25).")
    seconds_per_chunk: float | None = Field(None, description="Qwen2.5-Omni audio/video chunk (default 2 s).")
    compat: Compat = Field(
        DEFAULT_COMPAT.value,
        description="Which implementation to reproduce: transformers5 (the pinned oracle, default), transformers4, "
        "vllm or sglang (README: where transformers versions or engines disagree).",
    )
    padding_side: Literal["left", "right"] = Field("right", description="Segment form: where shorter rows pad.")
    fill_value: Int64 = Field(0, description="Value of padded slots (transformers 5 uses 0).")
    context_len: Int64 | None = Field(None, ge=0, description="Chunked prefill: return columns [context_len:seq_len].")
    seq_len: Int64 | None = Field(None, ge=0, description="Chunked prefill: end of the slice (default: all).")

    @model_validator(mode="after")
    def _one_form(self) -> MRopePositionsRequest:
        family = self.family or (self.config or {}).get("model_type")
        if self.mm_token_type_ids is not None and self.input_ids is not None and family == "minicpmv4_7":
            return self  # MiniCPM-V 4.7 needs both (types for the crops, ids for the markers)
        require_exactly_one(self, ("rows", "mm_token_type_ids", "input_ids"))
        return self

    def tokens(self) -> int:
        matrix = self.mm_token_type_ids or self.input_ids or []
        return sum(len(row) for row in matrix)


def _required_input_ids(body: MRopePositionsRequest, limit: int, missing: str) -> list[list[int]]:
    """``input_ids`` (a 422 saying ``missing`` when absent), its tokens within ``limit``."""
    if body.input_ids is None:
        raise InvalidInput(missing, field="input_ids")
    check_limit(body.tokens(), limit, "tokens", "input_ids")
    return body.input_ids


def _omni_prefill(body: MRopePositionsRequest, family: str, merge: int | None, limit: int) -> Any:
    """Qwen2.5-Omni: segment rows or ``input_ids`` + grids + ``audio_seqlens`` (no ``mm_token_type_ids``)."""
    options: dict[str, Any] = {
        "family": family,
        "spatial_merge_size": merge,
        "position_id_per_seconds": body.position_id_per_seconds,
        "seconds_per_chunk": body.seconds_per_chunk,
        "fill_value": body.fill_value if "fill_value" in body.model_fields_set else None,
    }
    if body.rows is not None:
        return omni_positions_from_segments(body.rows, padding_side=body.padding_side, max_tokens=limit, **options)
    input_ids = _required_input_ids(
        body, limit, "Omni models take input_ids (their token ids say which tokens are audio)"
    )
    return omni_positions_from_tokens(
        input_ids=input_ids,
        image_grid_thw=body.image_grid_thw,
        video_grid_thw=body.video_grid_thw,
        second_per_grid_ts=body.second_per_grid_ts,
        audio_seqlens=body.audio_seqlens,
        attention_mask=body.attention_mask,
        use_audio_in_video=body.use_audio_in_video,
        image_token_id=body.image_token_id,
        video_token_id=body.video_token_id,
        **options,
    )


def _glm_image_prefill(body: MRopePositionsRequest, family: str, merge: int | None, limit: int) -> Any:
    """GLM-Image: segment rows, or ``input_ids`` with its image start/end markers + grids + ``images_per_sample``."""
    if body.rows is not None:
        return glm_image_positions_from_segments(body.rows, padding_side=body.padding_side, max_tokens=limit)
    input_ids = _required_input_ids(body, limit, "GLM-Image takes rows or input_ids (with its image start/end markers)")
    return glm_image_positions(
        input_ids=input_ids,
        image_grid_thw=body.image_grid_thw,
        images_per_sample=body.images_per_sample,
        attention_mask=body.attention_mask,
        max_tokens=limit,
    )


def _hunyuan_vl_prefill(body: MRopePositionsRequest, family: str, merge: int | None, limit: int) -> Any:
    """HunYuan-VL (XD-RoPE): segment rows, or ``mm_token_type_ids`` + ``image_grid_thw``; ``num_axes`` rows."""
    merge = 2 if merge is None else merge
    if body.rows is not None:
        return hunyuan_vl_positions_from_segments(
            body.rows,
            spatial_merge_size=merge,
            num_axes=body.num_axes,
            padding_side=body.padding_side,
            max_tokens=limit // body.num_axes,
        )
    if body.mm_token_type_ids is None:
        raise InvalidInput("HunYuan-VL takes mm_token_type_ids and image_grid_thw", field="mm_token_type_ids")
    check_limit(body.tokens() * body.num_axes, limit, "positions", "mm_token_type_ids")
    return hunyuan_vl_positions(
        mm_token_type_ids=body.mm_token_type_ids,
        image_grid_thw=body.image_grid_thw,
        attention_mask=body.attention_mask,
        spatial_merge_size=merge,
        num_axes=body.num_axes,
    )


MARKER_NAMES = ("slice_start", "slice_end", "image_start", "image_end", "newline")


def _marker_ids(body: MRopePositionsRequest) -> dict[str, int]:
    """MiniCPM-V marker token ids by name, from ``marker_ids`` or else the config's ``*_id`` keys; each checked."""
    source: Mapping[str, object] = body.marker_ids or {
        name: (body.config or {}).get(f"{name}_id") for name in MARKER_NAMES
    }
    found = {name: source.get(name) for name in MARKER_NAMES}
    ids = {name: value for name, value in found.items() if isinstance(value, int) and not isinstance(value, bool)}
    missing = [name for name in MARKER_NAMES if name not in ids]
    if missing:
        raise InvalidInput(f"give marker_ids (or a config) with {', '.join(missing)}", field="marker_ids")
    for name, value in ids.items():
        if not 0 <= value <= INT64_MAX:
            raise InvalidInput(f"marker_ids.{name} must be a token id in [0, 2**63 - 1]", field=f"marker_ids.{name}")
    return ids


def _minicpmv_prefill(body: MRopePositionsRequest, family: str, merge: int | None, limit: int) -> Any:
    """MiniCPM-V 4.7: ``input_ids`` + ``mm_token_type_ids`` + target sizes; marker ids from the request or config."""
    if body.input_ids is None or body.mm_token_type_ids is None:
        raise InvalidInput("MiniCPM-V 4.7 takes input_ids and mm_token_type_ids", field="input_ids")
    check_limit(body.tokens(), limit, "tokens", "input_ids")
    return minicpmv_positions(
        input_ids=body.input_ids,
        mm_token_type_ids=body.mm_token_type_ids,
        markers=MiniCpmMarkers(**_marker_ids(body)),
        target_sizes=body.target_sizes,
        target_sizes_videos=body.target_sizes_videos,
        downsample_mode=body.downsample_mode,
        attention_mask=body.attention_mask,
    )


SPECIAL_PREFILLS = {
    "minicpmv4_7": _minicpmv_prefill,
    "qwen2_5_omni": _omni_prefill,
    "qwen3_omni_moe": _omni_prefill,
    "glm_image": _glm_image_prefill,
    "hunyuan_vl": _hunyuan_vl_prefill,
}
"""Families with their own position function (beyond the shared block engine)."""


class PrefillArrays(NamedTuple):
    """The segment form's answer, as numpy arrays (the other forms give ``MRopePositions``' tensors)."""

    position_ids: np.ndarray  # [3, B, T] int64
    mrope_position_deltas: np.ndarray  # [B, 1] int64


def _mrope_prefill(body: MRopePositionsRequest, limit: int) -> Any:
    family, merge, tokens_per_second = body.resolve()
    if family in SPECIAL_PREFILLS:
        return SPECIAL_PREFILLS[family](body, family, merge, limit)
    if body.rows is not None:
        layout = segment_layout(
            body.rows,
            family=family,
            spatial_merge_size=merge,
            tokens_per_second=tokens_per_second,
            compat=body.compat,
            padding_side=body.padding_side,
            fill_value=body.fill_value,
            max_tokens=limit,
        )
        return PrefillArrays(*layout.arrays())  # the answer needs no mask and no tensors
    check_limit(body.tokens(), limit, "tokens", "input_ids" if body.input_ids else "mm_token_type_ids")
    return mrope_positions_from_tokens(
        family=family,
        mm_token_type_ids=body.mm_token_type_ids,
        input_ids=body.input_ids,
        image_grid_thw=body.image_grid_thw,
        video_grid_thw=body.video_grid_thw,
        second_per_grid_ts=body.second_per_grid_ts,
        attention_mask=body.attention_mask,
        image_token_id=body.image_token_id,
        video_token_id=body.video_token_id,
        spatial_merge_size=merge,
        tokens_per_second=tokens_per_second,
        compat=body.compat,
        fill_value=body.fill_value,
    )


@router.post(
    "/v1/mrope/positions",
    summary="M-RoPE prefill position ids (3, B, T) and deltas (B, 1)",
    description="Every M-RoPE module of transformers 5.24 that ropeserve reproduces (README's family table), equal "
    "to its get_rope_index (compat=transformers5) or to transformers 4.x, vLLM or SGLang (compat). "
    "Inconsistent input (token counts vs grids, merge size, unused grids) is a 422 naming row and segment.",
    responses={**TENSOR_RESPONSES, **ERRORS},
    response_class=Response,
)
async def mrope_positions(body: MRopePositionsRequest, request: Request, runtime: RuntimeDep) -> Response:
    return await run_sized(_prefill_bound(body), lambda: _mrope_positions(body, request, runtime))


def _prefill_bound(body: MRopePositionsRequest) -> int:
    """At least the tokens of the answer: token form as sent; segment form text + image/video grid products."""
    if body.rows is None:
        return body.tokens()
    return sum(_segment_tokens(segment) for row in body.rows for segment in row)


def _segment_tokens(segment: dict[str, Any]) -> int:
    """Text length, or a grid's t·h·w (a bound: merging divides it); other values (rejected later) count 0."""
    tokens = 0
    for value in segment.values():
        if isinstance(value, int):
            tokens += value
        elif isinstance(value, list) and len(value) == GRID_AXES:
            frames, height, width = value
            if isinstance(frames, int) and isinstance(height, int) and isinstance(width, int):
                tokens += frames * height * width
    return tokens


def _mrope_positions(body: MRopePositionsRequest, request: Request, runtime: Runtime) -> Response:
    result = _mrope_prefill(body, runtime.settings.max_positions)
    position_ids = result.position_ids
    if body.context_len is not None or body.seq_len is not None:
        seq_len = body.seq_len if body.seq_len is not None else position_ids.shape[-1]
        position_ids = slice_prefill_positions(position_ids, body.context_len or 0, seq_len)
    tensors = {"position_ids": position_ids, "mrope_position_deltas": result.mrope_position_deltas}
    if getattr(result, "decode_position_ids", None) is not None:  # GLM-Image: positions of generated images
        tensors["decode_position_ids"] = result.decode_position_ids
    meta = {"compat": body.compat, "shape": list(position_ids.shape)}
    return tensor_response(request, tensors, meta, runtime.settings.json_response_max_elements)


class MRopeDecodeRequest(StrictModel):
    mrope_position_deltas: list[Int64] | IntMatrix = Field(..., description="[B] or [B, 1] from the prefill.")
    cache_lengths: list[Int64] = Field(..., description="Tokens already in the cache per row.")
    num_new: Int64 = Field(1, ge=1, description="Positions per row (>1 for speculative decoding).")


@router.post(
    "/v1/mrope/decode-positions",
    summary="M-RoPE decode positions (3, B, num_new): cache length + delta, equal on all three rows",
    responses={**TENSOR_RESPONSES, **ERRORS},
    response_class=Response,
    operation_id="mrope_decode_positions",
)
async def mrope_decode(body: MRopeDecodeRequest, request: Request, runtime: RuntimeDep) -> Response:
    bound = 3 * max(len(body.cache_lengths), 1) * body.num_new
    return await run_sized(bound, lambda: _mrope_decode(body, request, runtime), uses_torch=False)


def _mrope_decode(body: MRopeDecodeRequest, request: Request, runtime: Runtime) -> Response:
    """Numpy only (``mrope_decode_array``): inline without ``run_inline``'s torch guards."""
    check_decode_size(body.cache_lengths, body.num_new, runtime.settings.max_positions)
    ids = mrope_decode_array(body.mrope_position_deltas, body.cache_lengths, body.num_new)
    meta = {"shape": list(ids.shape)}
    return tensor_response(request, {"position_ids": ids}, meta, runtime.settings.json_response_max_elements)


def _rows_rank(value: Any) -> str:
    """The union member a ``position_ids`` value is validated as (so errors name one shape, not both)."""
    blocks = value if isinstance(value, list) else []
    rows = blocks[0] if blocks and isinstance(blocks[0], list) else []
    return "[3, B, T]" if rows and isinstance(rows[0], list) else "[3, T]"


PositionRows = Annotated[
    Annotated[list[IntMatrix], Tag("[3, B, T]")] | Annotated[IntMatrix, Tag("[3, T]")],
    Discriminator(_rows_rank),
]


class MRopeCosSinRequest(RopeSource):
    position_ids: PositionRows = Field(
        ..., description="[3, B, T] or [3, T] (T, H, W rows), e.g. from /v1/mrope/positions."
    )
    dtype: DtypeName = "float32"
    pairing: PairingName | None = Field(None, description="Default: the model's (GLM-4V pairs adjacent channels).")


def _position_rows(value: list[IntMatrix] | IntMatrix, limit: int) -> torch.Tensor:
    flat = [row for block in value for row in (block if block and isinstance(block[0], list) else [block])]
    check_limit(sum(len(row) for row in flat), limit, "positions", "position_ids")
    if len(value) != 3 or len({len(row) for row in flat}) > 1:
        raise InvalidInput("position_ids must be [3, T] or [3, B, T] with equal row lengths", field="position_ids")
    tensor = torch.tensor(value, dtype=torch.int64)
    if tensor.numel() and int(tensor.min()) < 0:
        raise InvalidInput("position_ids must be >= 0", field="position_ids")
    return tensor


@router.post(
    "/v1/mrope/cos-sin",
    summary="M-RoPE cos/sin: per-axis angles merged by mrope_section (chunked or interleaved layout)",
    responses={**TENSOR_RESPONSES, **ERRORS},
    response_class=Response,
    operation_id="mrope_cos_sin",
)
def mrope_cos_sin_route(body: MRopeCosSinRequest, request: Request, runtime: RuntimeDep) -> Response:
    params, default_pairing = body.resolve()
    if params.mrope_section is None:
        raise InvalidInput("these rope parameters have no mrope_section", field="rope")
    position_ids = _position_rows(body.position_ids, runtime.settings.max_positions)
    check_limit(
        2 * (position_ids.numel() // 3) * params.rotary_dim, runtime.settings.max_table_elements, "table elements"
    )
    pairing = body.pairing or default_pairing
    result = mrope_cos_sin(params, position_ids, pairing=pairing, dtype=DTYPES[body.dtype], cache=runtime.tables)
    meta = {
        "rope_type": params.rope_type,
        "rotary_dim": params.rotary_dim,
        "mrope_section": list(params.mrope_section),
        "mrope_layout": params.mrope_layout,
        "attention_factor": result.attention_factor,
        "pairing": pairing,
        "dtype": body.dtype,
        "max_abs_error": result.max_abs_error,
    }
    tensors = {"cos": result.cos, "sin": result.sin}
    return tensor_response(request, tensors, meta, runtime.settings.json_response_max_elements)


class VisionRopeRequest(StrictModel):
    grid_thw: IntMatrix = Field(..., description="[N, 3] (t, h, w) patch grids of the images/videos, in order.")
    spatial_merge_size: Int64 | None = Field(None, ge=1, le=64, description="Default: the config's, else 2.")
    head_dim: Int64 | None = Field(
        None, ge=VISION_HEAD_DIM_MIN, le=MAX_HEAD_DIM, description="Vision head size; default: the config's."
    )
    theta: float = Field(10_000.0, gt=0)
    preset: str | None = None
    config: dict[str, Any] | None = None

    def resolve(self) -> tuple[int, int]:
        """``(spatial_merge_size, head_dim)``: explicit fields win over the vision_config."""
        vision = source_vision_config(self.config, self.preset)
        merge = self.spatial_merge_size or vision.spatial_merge_size or 2
        head_dim = self.head_dim or vision.head_dim()
        if head_dim is None:
            raise InvalidInput(
                "give head_dim, or a config whose vision_config has hidden_size and num_heads", field="head_dim"
            )
        return merge, head_dim


@router.post(
    "/v1/vision/rope",
    summary="Vision-tower 2-D rotary: (h, w) ids ordered by merge blocks, repeated per frame, and cos/sin",
    responses={**TENSOR_RESPONSES, **ERRORS},
    response_class=Response,
)
def vision_rope(body: VisionRopeRequest, request: Request, runtime: RuntimeDep) -> Response:
    merge, head_dim = body.resolve()
    hw_ids = vision_position_ids(body.grid_thw, merge, max_tokens=runtime.settings.max_positions)
    check_limit(2 * hw_ids.shape[0] * head_dim, runtime.settings.max_table_elements, "table elements", "grid_thw")
    cos, sin = vision_cos_sin(hw_ids, head_dim, body.theta)
    meta = {"spatial_merge_size": merge, "head_dim": head_dim, "theta": body.theta, "tokens": hw_ids.shape[0]}
    tensors = {"hw_ids": hw_ids, "cos": cos, "sin": sin}
    return tensor_response(request, tensors, meta, runtime.settings.json_response_max_elements)
