"""Position engine: 1-D positions, M-RoPE (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, GLM-4V) and vision-tower 2-D ids.

torch and numpy (the M-RoPE layout runs in numpy on the CPU), no web imports. Every function takes plain Python
values or tensors, returns int64 tensors (or a small frozen dataclass of them) and raises
:class:`ropeserve.errors.InvalidInput` for inconsistent input, with ``field`` naming the offending row and segment
(``rows[b].segments[i]``) or argument.

Padded slots hold :data:`PAD_POSITION` (0, as transformers 5) unless ``fill_value`` says otherwise.

Where text after a Qwen2-VL / Qwen2.5-VL video continues is a ``compat`` choice (:class:`MRopeCompat`);
:data:`DEFAULT_COMPAT` is ``"transformers5"`` (bit-exact with transformers 5.24); ``"transformers4"`` follows
transformers 4.x, Qwen's original code and vLLM (max position + 1).

Endpoint map (one function per endpoint): ``positions_from_attention_mask`` (batch with mask and cache lengths),
``packed_positions`` (cu_seqlens / segment lengths), ``decode_positions`` (next k), ``mrope_positions_from_tokens``
(serving-stack form), ``mrope_positions_from_segments`` (segment lists), ``mrope_segments_from_tokens`` (token form
-> segment lists), ``mrope_decode_positions`` (next k from deltas), ``slice_prefill_positions`` (chunked prefill),
``vision_position_ids`` (ViT 2-D ids). The routes answer packed, decode and M-RoPE decode positions from
``packed_position_array``, ``decode_position_array`` and ``mrope_decode_array``: the same checks and values as new
int64 numpy arrays (the tensor functions wrap them), so a JSON answer never passes through a tensor.
"""

from ropeserve.config.jsonsafe import INT64_MAX, INT64_MIN
from ropeserve.positions._common import PAD_POSITION
from ropeserve.positions.families import (
    DEFAULT_COMPAT,
    FRAME_BLOCKS,
    FRAME_INDEX,
    FRAME_STRIDE,
    MROPE_FAMILIES,
    MROPE_FAMILY_ALIASES,
    SECONDS,
    MRopeCompat,
    MRopeFamily,
    TemporalRule,
    get_mrope_family,
)
from ropeserve.positions.mrope import (
    IMAGE_TOKEN,
    MAX_TOKENS_PER_SECOND,
    TEXT_TOKEN,
    VIDEO_TOKEN,
    MRopePositions,
    mrope_decode_array,
    mrope_decode_positions,
    mrope_positions_from_tokens,
    slice_prefill_positions,
)
from ropeserve.positions.segments import (
    ImageSegment,
    PaddingSide,
    Segment,
    TextSegment,
    VideoSegment,
    mrope_positions_from_segments,
    mrope_segments_from_tokens,
    segment_layout,
)
from ropeserve.positions.text import (
    decode_position_array,
    decode_positions,
    packed_position_array,
    packed_positions,
    positions_from_attention_mask,
)
from ropeserve.positions.vision import vision_position_ids

__all__ = [
    "INT64_MAX",
    "INT64_MIN",
    "DEFAULT_COMPAT",
    "FRAME_BLOCKS",
    "FRAME_INDEX",
    "FRAME_STRIDE",
    "IMAGE_TOKEN",
    "MAX_TOKENS_PER_SECOND",
    "MROPE_FAMILIES",
    "MROPE_FAMILY_ALIASES",
    "PAD_POSITION",
    "SECONDS",
    "TEXT_TOKEN",
    "VIDEO_TOKEN",
    "ImageSegment",
    "MRopeCompat",
    "MRopeFamily",
    "MRopePositions",
    "PaddingSide",
    "Segment",
    "TemporalRule",
    "TextSegment",
    "VideoSegment",
    "decode_position_array",
    "decode_positions",
    "get_mrope_family",
    "mrope_decode_array",
    "mrope_decode_positions",
    "mrope_positions_from_segments",
    "segment_layout",
    "mrope_positions_from_tokens",
    "mrope_segments_from_tokens",
    "packed_position_array",
    "packed_positions",
    "positions_from_attention_mask",
    "slice_prefill_positions",
    "vision_position_ids",
]
