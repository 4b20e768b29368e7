"""transformers 5.24 as the oracle for config normalisation: what its config classes resolve from a config.json.

Helpers only (no tests): build the text config the model would see, read its resolved rope dict per layer type,
and the ``inv_freq``/attention factor its rotary module registers at init.
"""

from __future__ import annotations

from typing import Any

import torch
from hf_oracle import (
    FIXTURE_DIR,
    ROTARY_BY_TEXT_MODEL_TYPE,
    hf_rotary,
    hf_text_config,
    load_fixture,
    with_rope_scaling,
)
from transformers import PreTrainedConfig

from ropeserve.config import RopeParams

__all__ = [
    "FIXTURE_DIR",
    "LONG_CONTEXT_TYPES",
    "MROPE_SECTION_DEFAULTS",
    "ROTARY_BY_TEXT_MODEL_TYPE",
    "assert_params_match_hf",
    "full_config_fixtures",
    "hf_head_dim",
    "hf_init_inv_freq",
    "hf_rope_entries",
    "hf_text_config",
    "load_fixture",
    "with_rope_scaling",
]

LONG_CONTEXT_TYPES = {"llama3", "yarn", "longrope"}

MROPE_SECTION_DEFAULTS = {
    "qwen2_vl_text": [16, 24, 24],
    "qwen2_5_vl_text": [16, 24, 24],
    "qwen2_5_omni_text": [16, 24, 24],
    "qwen3_vl_text": [24, 20, 20],
    "qwen3_vl_moe_text": [24, 20, 20],
    "qwen3_5_text": [11, 11, 10],
    "glm4v_text": [8, 12, 12],
}


def full_config_fixtures() -> list[str]:
    """Names of the fixture files that are whole config.json files (not snippets)."""
    return sorted(path.name for path in FIXTURE_DIR.glob("*.json") if "snippet" not in path.name)


def hf_rope_entries(text: PreTrainedConfig) -> dict[str, dict[str, Any] | None]:
    """The resolved rope dict per layer type (a flat dict is reported as ``full_attention``).

    Standardised once more first, as every rope init function does: extra config.json keys become attributes
    only after the constructor's own pass, so e.g. a top-level ``original_max_position_embeddings`` takes
    effect at this second pass (which is the one the model's rotary module sees).
    """
    text.standardize_rope_params()
    rope = text.rope_parameters
    nested = text.nested_rope_parameter_keys(rope)
    if nested:
        return {key: rope[key] for key in nested}
    return {"full_attention": rope}


def hf_head_dim(text: PreTrainedConfig) -> int:
    """The head size the rotary init functions read (``head_dim`` if truthy, else ``hidden // heads``)."""
    return getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads


def hf_init_inv_freq(text: PreTrainedConfig) -> dict[str, tuple[torch.Tensor, float]]:
    """``(inv_freq, attention_scaling)`` per layer type as the rotary module registers them at init."""
    module = hf_rotary(text)
    if isinstance(module.rope_type, dict):
        return {
            layer: (getattr(module, f"{layer}_inv_freq"), getattr(module, f"{layer}_attention_scaling"))
            for layer in module.rope_type
        }
    return {"full_attention": (module.inv_freq, module.attention_scaling)}


def assert_params_match_hf(params: RopeParams, entry: dict[str, Any], text: PreTrainedConfig) -> None:
    """Every field of ``params`` equals what transformers resolved for that layer entry."""
    assert params.rope_type == entry["rope_type"]
    assert params.rope_theta == entry["rope_theta"]
    assert params.partial_rotary_factor == entry.get("partial_rotary_factor", 1.0)
    assert params.head_dim == hf_head_dim(text)
    assert params.max_position_embeddings == text.max_position_embeddings
    for key in ("factor", "attention_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim"):
        assert getattr(params, key) == entry.get(key), key
    for key in ("low_freq_factor", "high_freq_factor"):
        assert getattr(params, key) == entry.get(key), key
    for key in ("short_factor", "long_factor"):
        expected = entry.get(key)
        assert getattr(params, key) == (tuple(expected) if expected is not None else None), key
    if params.rope_type in LONG_CONTEXT_TYPES:
        assert params.original_max_position_embeddings == entry["original_max_position_embeddings"]
    assert params.truncate == entry.get("truncate", True)
    default_section = MROPE_SECTION_DEFAULTS.get(text.model_type)
    expected_section = entry.get("mrope_section", default_section)
    assert params.mrope_section == (tuple(expected_section) if expected_section is not None else None)
