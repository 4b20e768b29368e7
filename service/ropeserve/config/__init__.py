"""Config normalisation: every Hugging Face config form -> ``RopeParams`` (torch-free)."""

from ropeserve.config.families import FAMILIES, ModelFamily, family_of
from ropeserve.config.normalize import NormalizedConfig, from_explicit, normalize_config
from ropeserve.config.params import RopeParams
from ropeserve.config.presets import preset_catalog, preset_config
from ropeserve.config.rope_types import ROPE_TYPES
from ropeserve.config.schema import ROPE_TYPE_KEYS
from ropeserve.config.validate import validate_params

__all__ = [
    "FAMILIES",
    "ROPE_TYPES",
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
