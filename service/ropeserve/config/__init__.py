"""Config normalisation: every Hugging Face config form -> ``RopeParams`` (torch-free)."""

from ropeserve.config.families import FAMILIES, ModelFamily, family_of
from ropeserve.config.normalize import (
    NormalizedConfig,
    RopeParams,
    from_explicit,
    normalize_config,
    validate_params,
)
from ropeserve.config.presets import preset_catalog, preset_config
from ropeserve.config.schema import ROPE_TYPE_KEYS

__all__ = [
    "FAMILIES",
    "ROPE_TYPE_KEYS",
    "ModelFamily",
    "NormalizedConfig",
    "RopeParams",
    "family_of",
    "from_explicit",
    "normalize_config",
    "preset_catalog",
    "preset_config",
    "validate_params",
]
