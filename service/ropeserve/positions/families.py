"""M-RoPE model families (temporal rule and defaults) and the text-after-vision compatibility choice.

The four families share one ``get_rope_index`` skeleton in transformers 5.24; they differ only in how a video's
temporal axis is laid out, which :class:`TemporalRule` captures as data, so the position code never branches on a
family name.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from ropeserve.config.families import FAMILIES, POSITION_ALIASES, MropePositions
from ropeserve.errors import InvalidInput

__all__ = [
    "DEFAULT_COMPAT",
    "FRAME_BLOCKS",
    "FRAME_INDEX",
    "MROPE_FAMILIES",
    "MROPE_FAMILY_ALIASES",
    "SECONDS",
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


TEMPORAL_RULES: dict[str, TemporalRule] = {rule.name: rule for rule in (FRAME_INDEX, SECONDS, FRAME_BLOCKS)}


def _from_config(spec: MropePositions) -> MRopeFamily:
    return MRopeFamily(
        spec.name,
        TEMPORAL_RULES[spec.temporal_rule],
        spec.spatial_merge_size,
        spec.image_token_id,
        spec.video_token_id,
        spec.tokens_per_second,
    )


MROPE_FAMILIES: dict[str, MRopeFamily] = {
    spec.name: _from_config(spec)
    for spec in dict.fromkeys(family.positions for family in FAMILIES.values() if family.positions is not None)
}
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
"""Other model types (``qwen3_vl_moe``, ``qwen3_5_text``, ``glm46v``...) -> their family."""


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
    """Where the block after a vision block starts. The two rules differ only when a Qwen2-VL / Qwen2.5-VL video's
    temporal extent exceeds its spatial one; images and Qwen3-VL / GLM-4V frames give the same positions."""

    TRANSFORMERS5 = "transformers5"
    """transformers >= 5.3 (5.24 is the oracle): next start = start + max(h, w) // merge; the temporal extent is
    ignored, so text may overlap the video's T range."""
    TRANSFORMERS4 = "transformers4"
    """transformers 4.x (and 5.2), Qwen's original code and vLLM: next start = max position of the block + 1.

    Only the continuation rule changes: the temporal index stays transformers 5's ``floor(k * (tokens_per_second *
    second_per_grid_t))`` in float32 (4.x truncated ``second_per_grid_t`` to an int first, a bug not reproduced)."""


DEFAULT_COMPAT = MRopeCompat.TRANSFORMERS5
"""Default: transformers 5.24, the executable oracle this service is pinned to and tested against bit-for-bit.
Pass ``"transformers4"`` to reproduce vLLM / the original Qwen code (what the Qwen2/2.5-VL checkpoints were
trained with)."""


def parse_compat(compat: str | MRopeCompat) -> MRopeCompat:
    """Validate a compat choice given as a string or enum member."""
    try:
        return MRopeCompat(compat)
    except ValueError:
        choices = ", ".join(member.value for member in MRopeCompat)
        raise InvalidInput(f"unknown compat {compat!r}; choose one of: {choices}", field="compat") from None
