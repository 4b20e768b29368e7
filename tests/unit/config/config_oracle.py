"""transformers 5.24 as the oracle for config normalisation: what its config classes resolve from a config.json.

Helpers only (no tests): build the text config the model would see, read its resolved rope dict per layer type,
and the ``inv_freq``/attention factor its rotary module registers at init.
"""

from __future__ import annotations

import copy
import json
from functools import cache
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, PreTrainedConfig
from transformers.models.cohere.modeling_cohere import CohereRotaryEmbedding
from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3RotaryEmbedding
from transformers.models.gemma3.modeling_gemma3 import Gemma3RotaryEmbedding
from transformers.models.glm.modeling_glm import GlmRotaryEmbedding
from transformers.models.glm4v.modeling_glm4v import Glm4vTextRotaryEmbedding
from transformers.models.gpt_neox.modeling_gpt_neox import GPTNeoXRotaryEmbedding
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
from transformers.models.mistral.modeling_mistral import MistralRotaryEmbedding
from transformers.models.phi3.modeling_phi3 import Phi3RotaryEmbedding
from transformers.models.qwen2.modeling_qwen2 import Qwen2RotaryEmbedding
from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLRotaryEmbedding
from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLRotaryEmbedding
from transformers.models.qwen3.modeling_qwen3 import Qwen3RotaryEmbedding
from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5TextRotaryEmbedding
from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLTextRotaryEmbedding

from ropeserve.config import RopeParams

FIXTURE_DIR = Path(__file__).resolve().parents[2] / "fixtures" / "configs"
LONG_CONTEXT_TYPES = {"llama3", "yarn", "longrope"}

ROTARY_BY_TEXT_MODEL_TYPE: dict[str, type[torch.nn.Module]] = {
    "llama": LlamaRotaryEmbedding,
    "mistral": MistralRotaryEmbedding,
    "qwen2": Qwen2RotaryEmbedding,
    "qwen3": Qwen3RotaryEmbedding,
    "phi3": Phi3RotaryEmbedding,
    "glm": GlmRotaryEmbedding,
    "cohere": CohereRotaryEmbedding,
    "gpt_neox": GPTNeoXRotaryEmbedding,
    "deepseek_v3": DeepseekV3RotaryEmbedding,
    "gemma3_text": Gemma3RotaryEmbedding,
    "qwen2_vl_text": Qwen2VLRotaryEmbedding,
    "qwen2_5_vl_text": Qwen2_5_VLRotaryEmbedding,
    "qwen3_vl_text": Qwen3VLTextRotaryEmbedding,
    "qwen3_5_text": Qwen3_5TextRotaryEmbedding,
    "glm4v_text": Glm4vTextRotaryEmbedding,
}
MROPE_SECTION_DEFAULTS = {
    "qwen2_vl_text": [16, 24, 24],
    "qwen2_5_vl_text": [16, 24, 24],
    "qwen2_5_omni_text": [16, 24, 24],
    "qwen3_vl_text": [24, 20, 20],
    "qwen3_vl_moe_text": [24, 20, 20],
    "qwen3_5_text": [11, 11, 10],
    "glm4v_text": [8, 12, 12],
}


@cache
def _fixture_text(name: str) -> str:
    return (FIXTURE_DIR / name).read_text(encoding="utf-8")


def load_fixture(name: str) -> dict[str, Any]:
    """A fresh copy of ``tests/fixtures/configs/<name>``."""
    return json.loads(_fixture_text(name))


def full_config_fixtures() -> list[str]:
    """Names of the fixture files that are whole config.json files (not snippets)."""
    return sorted(path.name for path in FIXTURE_DIR.glob("*.json") if "snippet" not in path.name)


def with_yarn_snippet(base_name: str, snippet_name: str) -> dict[str, Any]:
    """A base config with a model card's long-context block added (as the card tells users to do)."""
    config = load_fixture(base_name)
    snippet = load_fixture(snippet_name)
    config["rope_scaling"] = snippet.get("rope_scaling", snippet)
    return config


def hf_text_config(config: dict[str, Any]) -> PreTrainedConfig:
    """The text-model config transformers builds from ``config`` (``AutoConfig.for_model``)."""
    kwargs = copy.deepcopy(config)
    model_type = kwargs.pop("model_type", "llama")
    return AutoConfig.for_model(model_type, **kwargs).get_text_config()


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


def hf_rotary(text: PreTrainedConfig) -> torch.nn.Module:
    """The text model's rotary embedding module, freshly built (its buffers hold the init values)."""
    return ROTARY_BY_TEXT_MODEL_TYPE[text.model_type](text)


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
