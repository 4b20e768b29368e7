"""M-RoPE model families (temporal rule and defaults) and the text-after-vision compatibility choice.

Every family shares one ``get_rope_index`` skeleton in transformers 5.24; they differ only in how a video's
temporal axis is laid out, which one of the four :class:`TemporalRule` values captures as data, so the position code
never branches on a family name. The per-family data (token ids, temporal rule name, merge size, aliases) lives in
``ropeserve.config.families``; this module turns it into :class:`MRopeFamily` entries.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from ropeserve.config.families import FAMILIES, MROPE_POSITIONS, POSITION_ALIASES, MropePositions
from ropeserve.errors import InvalidInput

__all__ = [
    "COMPAT_RULES",
    "DEFAULT_COMPAT",
    "FRAME_BLOCKS",
    "FRAME_INDEX",
    "FRAME_STRIDE",
    "MROPE_FAMILIES",
    "MROPE_FAMILY_ALIASES",
    "SECONDS",
    "CompatRule",
    "MRopeCompat",
    "MRopeFamily",
    "TemporalRule",
    "get_mrope_family",
    "parse_compat",
]


@dataclass(frozen=True)
class TemporalRule:
    """How a video's frames map onto the temporal (T) position axis. Images always step T by 1 per frame."""

    name: str
    scales_by_seconds: bool
    """Video T index of frame k is ``floor(k * tokens_per_second * second_per_grid_t)`` (float32, no truncation
    of the interval itself) instead of ``k``."""
    splits_video_frames: bool
    """Each video frame is its own ``(1, h, w)`` block, separated from the next frame by timestamp text."""
    description: str
    row_end_tokens: int = 0
    """Extra tokens closing each row of a vision block (HY-V4-VL: a newline token, ``w + 1`` columns)."""
    frame_stride_all_axes: bool = False
    """Frame ``k`` of a vision block is offset by ``k * max(h, w + row_end_tokens)`` on all three axes (each frame
    a new square block, HY-V4-VL) instead of on T alone by ``k``."""
    always_after_max: bool = False
    """The block after a vision block starts at its largest position + 1 under every compat choice."""


FRAME_INDEX = TemporalRule(
    name="frame_index",
    scales_by_seconds=False,
    splits_video_frames=False,
    description="one block per video; T = start + frame index (Qwen2-VL)",
)
SECONDS = TemporalRule(
    name="seconds",
    scales_by_seconds=True,
    splits_video_frames=False,
    description="one block per video; T = start + floor(k * tokens_per_second * second_per_grid_t) (Qwen2.5-VL)",
)
FRAME_STRIDE = TemporalRule(
    name="frame_stride",
    scales_by_seconds=False,
    splits_video_frames=False,
    description="one block per video, rows end with a newline token; frame k offset by k * max(h, w + 1) on all "
    "axes; next block at max + 1 (HY-V4-VL)",
    row_end_tokens=1,
    frame_stride_all_axes=True,
    always_after_max=True,
)
FRAME_BLOCKS = TemporalRule(
    name="frame_blocks",
    scales_by_seconds=False,
    splits_video_frames=True,
    description="one (1, h, w) block per frame between timestamp text; time only as text (Qwen3-VL, GLM-4V)",
)


@dataclass(frozen=True)
class MRopeFamily:
    """Defaults of one model family (override per request with the function arguments)."""

    name: str
    temporal_rule: TemporalRule
    spatial_merge_size: int
    image_token_id: int
    video_token_id: int
    tokens_per_second: float | None = None
    """Only read when ``temporal_rule.scales_by_seconds``."""
    video_temporal_merge_size: int = 1
    """A video's merged ``t`` is ``t // video_temporal_merge_size`` (ERNIE-4.5-VL: 2); images always keep ``t``."""


TEMPORAL_RULES: dict[str, TemporalRule] = {
    rule.name: rule for rule in (FRAME_INDEX, SECONDS, FRAME_BLOCKS, FRAME_STRIDE)
}


def _from_config(spec: MropePositions) -> MRopeFamily:
    return MRopeFamily(
        spec.name,
        TEMPORAL_RULES[spec.temporal_rule],
        spec.spatial_merge_size,
        spec.image_token_id,
        spec.video_token_id,
        spec.tokens_per_second,
        spec.video_temporal_merge_size,
    )


MROPE_FAMILIES: dict[str, MRopeFamily] = {name: _from_config(spec) for name, spec in MROPE_POSITIONS.items()}
"""Family name -> defaults, built from the model-family table (``ropeserve.config.families``), the one place
that says which model types have M-RoPE and how their positions run."""

MROPE_FAMILY_ALIASES: dict[str, str] = {
    **{
        model_type: family.positions.name
        for model_type, family in FAMILIES.items()
        if family.positions is not None and model_type != family.positions.name
    },
    **POSITION_ALIASES,
}
"""Other model types and transformers modules (``qwen3_vl_moe``, ``qwen3_5_text``, ``glm46v``...) -> their
family."""


def get_mrope_family(family: str | MRopeFamily) -> MRopeFamily:
    """Look up a family by name (or alias); a :class:`MRopeFamily` passes through."""
    if isinstance(family, MRopeFamily):
        return family
    name = MROPE_FAMILY_ALIASES.get(family, family)
    if name not in MROPE_FAMILIES:
        known = sorted([*MROPE_FAMILIES, *MROPE_FAMILY_ALIASES])
        raise InvalidInput(f"unknown M-RoPE family {family!r}; known: {', '.join(known)}", field="family")
    return MROPE_FAMILIES[name]


class MRopeCompat(StrEnum):
    """Which implementation's ``get_rope_index`` to reproduce. They differ only for Qwen2-VL / Qwen2.5-VL style
    families (one block per video): where the block after a video starts, and how a Qwen2.5-VL frame's time is
    rounded. Images with ``t == 1`` and frame-split families (Qwen3-VL, GLM-4V, ...) get the same positions under
    every choice. :data:`COMPAT_RULES` holds each choice's rule and the function it follows."""

    TRANSFORMERS5 = "transformers5"
    TRANSFORMERS4 = "transformers4"
    VLLM = "vllm"
    SGLANG = "sglang"


@dataclass(frozen=True)
class CompatRule:
    """What one :class:`MRopeCompat` choice changes, as data."""

    next_start_after_max: bool
    """True: the block after a vision block starts at the block's largest position + 1; False (transformers 5):
    at ``start + max(h, w) // merge``, ignoring the temporal extent (text may overlap the video's T range)."""
    seconds_first: bool
    """Qwen2.5-VL frame ``k`` of a video: True gives ``floor((k * second_per_grid_t) * tokens_per_second)``, two
    float32 multiplies in that order (vLLM, SGLang); False gives ``floor(k * (tokens_per_second *
    second_per_grid_t))`` with the product rounded to float32 first (transformers 5). They differ by 1 where the
    float32 roundings fall on either side of an integer (tokens_per_second 25, second_per_grid_t 0.7: frames 6,
    12, 24, 26)."""
    image_time_step: float
    """Qwen2.5-VL temporal step of an image's frames: 1 (transformers) or 0 (vLLM and SGLang pass
    ``second_per_grid_t = 0`` for images, so a ``t > 1`` image keeps T at its start)."""
    follows: str
    """The function this choice reproduces (also in the README's "Where transformers versions or engines
    disagree")."""


COMPAT_RULES: dict[MRopeCompat, CompatRule] = {
    MRopeCompat.TRANSFORMERS5: CompatRule(
        next_start_after_max=False,
        seconds_first=False,
        image_time_step=1.0,
        follows="transformers 5.24 <Model>.get_rope_index (models/*/modeling_*.py), the pinned oracle",
    ),
    MRopeCompat.TRANSFORMERS4: CompatRule(
        next_start_after_max=True,
        seconds_first=False,
        image_time_step=1.0,
        follows="transformers 4.x get_rope_index's continuation (max position + 1) with transformers 5's float "
        "timing (4.x truncated second_per_grid_t to an int before multiplying, a bug not reproduced)",
    ),
    MRopeCompat.VLLM: CompatRule(
        next_start_after_max=True,
        seconds_first=True,
        image_time_step=0.0,
        follows="vLLM Qwen2_5_VLForConditionalGeneration.get_mrope_input_positions "
        "(vllm/model_executor/models/qwen2_5_vl.py, commit 002d181a55a0) and the Qwen2-VL twin",
    ),
    MRopeCompat.SGLANG: CompatRule(
        next_start_after_max=True,
        seconds_first=True,
        image_time_step=0.0,
        follows="SGLang MRotaryEmbedding.get_rope_index (python/sglang/srt/layers/rotary_embedding.py, "
        "commit 00a66ebe136b)",
    ),
}
"""compat -> its rule. vLLM and SGLang agree on every input these families express; they are separate choices
because they are separate code bases (a future divergence gets its own row here)."""


DEFAULT_COMPAT = MRopeCompat.TRANSFORMERS5
"""Default: transformers 5.24, the executable oracle this service is pinned to and tested against bit-for-bit.
Pass ``"vllm"`` / ``"sglang"`` to reproduce a serving engine, ``"transformers4"`` for the 4.x continuation (what
the Qwen2/2.5-VL checkpoints were trained with)."""


_COMPAT_BY_VALUE: dict[str, MRopeCompat] = {member.value: member for member in MRopeCompat}
"""Each compat choice by its string (a dict look-up: a tenth of the enum call's cost, paid every request)."""


def parse_compat(compat: str | MRopeCompat) -> MRopeCompat:
    """Validate a compat choice given as a string or enum member."""
    found = _COMPAT_BY_VALUE.get(compat) if isinstance(compat, str) else None
    if found is not None:
        return found
    try:
        return MRopeCompat(compat)
    except ValueError:
        choices = ", ".join(member.value for member in MRopeCompat)
        raise InvalidInput(f"unknown compat {compat!r}; choose one of: {choices}", field="compat") from None
