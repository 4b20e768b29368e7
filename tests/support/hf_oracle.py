"""transformers 5.24 as the oracle: the fixture configs, the text config transformers builds from a config.json,
and the model's own rotary module. Shared by the config, rope and API tests (``tests/conftest.py`` puts this
folder on ``sys.path``)."""

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
from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import Qwen2_5OmniRotaryEmbedding
from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLRotaryEmbedding
from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLRotaryEmbedding
from transformers.models.qwen3.modeling_qwen3 import Qwen3RotaryEmbedding
from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5TextRotaryEmbedding
from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLTextRotaryEmbedding

FIXTURE_DIR = Path(__file__).resolve().parents[1] / "fixtures" / "configs"

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
    "qwen2_5_omni_text": Qwen2_5OmniRotaryEmbedding,
    "qwen3_vl_text": Qwen3VLTextRotaryEmbedding,
    "qwen3_5_text": Qwen3_5TextRotaryEmbedding,
    "glm4v_text": Glm4vTextRotaryEmbedding,
}


@cache
def _fixture_text(name: str) -> str:
    return (FIXTURE_DIR / name).read_text(encoding="utf-8")


def load_fixture(name: str) -> dict[str, Any]:
    return json.loads(_fixture_text(name))


def with_rope_scaling(base_name: str, snippet_name: str) -> dict[str, Any]:
    """A fixture config with a model card's ``rope_scaling`` block put in (the snippet may be the bare block)."""
    config = load_fixture(base_name)
    snippet = load_fixture(snippet_name)
    config["rope_scaling"] = snippet.get("rope_scaling", snippet)
    return config


def hf_text_config(config: dict[str, Any]) -> PreTrainedConfig:
    """The text-model config transformers builds from the config.json dict ``config``."""
    kwargs = copy.deepcopy(config)
    model_type = kwargs.pop("model_type", "llama")
    return AutoConfig.for_model(model_type, **kwargs).get_text_config()


def hf_rotary(text: PreTrainedConfig) -> torch.nn.Module:
    """A fresh rotary module for ``text`` (fresh: dynamic/longrope modules are stateful)."""
    return ROTARY_BY_TEXT_MODEL_TYPE[text.model_type](text)
