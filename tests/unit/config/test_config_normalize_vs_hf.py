"""Config normalisation agrees with what transformers 5.24's config classes resolve (spec §3).

For every real fixture config, every preset and a table of synthetic forms (v5 flat / per-layer-type,
legacy ``rope_scaling`` + ``rope_theta``, ``type`` alias, ``mrope``, nested ``text_config``, alias keys,
explicit ``head_dim``, Gemma-3 class defaults, Phi-3's top-level ``original_max_position_embeddings``,
DeepSeek's ``qk_rope_head_dim``) the normalised ``RopeParams`` equal the resolved ``rope_parameters``, and
the registry's ``inv_freq`` equals the buffer the model's own rotary module registers (bit for bit).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from config_oracle import (
    MROPE_SECTION_DEFAULTS,
    ROTARY_BY_TEXT_MODEL_TYPE,
    assert_params_match_hf,
    full_config_fixtures,
    hf_init_inv_freq,
    hf_rope_entries,
    hf_text_config,
    load_fixture,
    with_rope_scaling,
)
from transformers import CONFIG_MAPPING

from ropeserve.config import FAMILIES, normalize_config, preset_catalog
from ropeserve.config.families import REMOTE_CONFIG_KEYS
from ropeserve.errors import InvalidInput
from ropeserve.rope import compute_inv_freq

SMALL = {"hidden_size": 256, "num_attention_heads": 4, "max_position_embeddings": 4096}
"""A tiny Llama-shaped text model: head_dim 64."""

YARN_SNIPPETS = {
    "Qwen2.5-7B-Instruct+yarn": ("Qwen__Qwen2.5-7B-Instruct.json", "Qwen__Qwen2.5-7B-Instruct.yarn-snippet.json"),
    "Qwen2.5-VL-7B-Instruct+yarn": (
        "Qwen__Qwen2.5-VL-7B-Instruct.json",
        "Qwen__Qwen2.5-VL-7B-Instruct.yarn-snippet.json",
    ),
    "Qwen3-8B+yarn": ("Qwen__Qwen3-8B.json", "Qwen__Qwen3-8B.yarn-snippet.json"),
}


def real_configs() -> dict[str, dict[str, Any]]:
    configs = {name: load_fixture(name) for name in full_config_fixtures()}
    configs.update({name: with_rope_scaling(*files) for name, files in YARN_SNIPPETS.items()})
    return configs


def llama(**overrides: Any) -> dict[str, Any]:
    return {"model_type": "llama", **SMALL, **overrides}


FORMS: dict[str, dict[str, Any]] = {
    "v5 flat rope_parameters": llama(
        rope_parameters={
            "rope_type": "yarn",
            "factor": 4.0,
            "rope_theta": 1e6,
            "original_max_position_embeddings": 1024,
        }
    ),
    "v5 flat, no original_max -> max_position_embeddings": llama(
        rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e6}
    ),
    "legacy rope_scaling + top-level rope_theta": llama(rope_theta=5e5, rope_scaling={"type": "linear", "factor": 2.0}),
    "legacy type alias (dynamic)": llama(rope_scaling={"type": "dynamic", "factor": 2.0}),
    "both type and rope_type": llama(rope_scaling={"type": "linear", "rope_type": "linear", "factor": 3.0}),
    "theta inside the dict beats top-level": llama(
        rope_theta=1234.0, rope_parameters={"rope_type": "default", "rope_theta": 5e5}
    ),
    "truthy rope_scaling replaces rope_parameters": llama(
        rope_parameters={"rope_type": "linear", "factor": 8.0, "rope_theta": 5e5},
        rope_scaling={"rope_type": "dynamic", "factor": 2.0},
    ),
    "null rope_scaling keeps rope_parameters": llama(
        rope_scaling=None, rope_parameters={"rope_type": "linear", "factor": 8.0, "rope_theta": 5e5}
    ),
    "empty rope_scaling -> default": llama(rope_scaling={}, rope_theta=5e5),
    "no rope keys at all -> default theta": llama(),
    "top-level partial_rotary_factor": llama(partial_rotary_factor=0.5, rope_scaling={"type": "linear", "factor": 2.0}),
    "dict partial_rotary_factor beats top-level": llama(
        partial_rotary_factor=0.5, rope_parameters={"rope_type": "linear", "factor": 2.0, "partial_rotary_factor": 0.25}
    ),
    "explicit head_dim (not hidden/heads)": llama(head_dim=96, rope_theta=1e6),
    "llama3 without original_max": llama(
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}
    ),
    "yarn explicit null factor": llama(
        max_position_embeddings=16384,
        rope_scaling={"rope_type": "yarn", "factor": None, "original_max_position_embeddings": 4096},
    ),
    "yarn all optional keys": llama(
        rope_scaling={
            "rope_type": "yarn",
            "factor": 8.0,
            "original_max_position_embeddings": 1024,
            "attention_factor": 0.9,
            "beta_fast": 16,
            "beta_slow": 2,
            "mscale": 0.8,
            "mscale_all_dim": 0.5,
            "truncate": False,
        }
    ),
    "top-level original_max overrides the dict (llama)": llama(
        original_max_position_embeddings=2048,
        rope_scaling={"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 1024},
    ),
    "phi3 top-level original_max": {
        "model_type": "phi3",
        **SMALL,
        "original_max_position_embeddings": 1024,
        "rope_scaling": {"type": "longrope", "short_factor": [1.0] * 32, "long_factor": [2.0] * 32},
    },
    "phi3 class default original_max 4096 beats the dict": {
        "model_type": "phi3",
        **SMALL,
        "max_position_embeddings": 16384,
        "rope_scaling": {
            "rope_type": "longrope",
            "short_factor": [1.0] * 32,
            "long_factor": [2.0] * 32,
            "original_max_position_embeddings": 2048,
        },
    },
    "phi3 legacy su keeps the dict's original_max": {
        "model_type": "phi3",
        **SMALL,
        "original_max_position_embeddings": 1024,
        "rope_scaling": {
            "type": "su",
            "short_factor": [1.0] * 32,
            "long_factor": [1.5] * 32,
            "original_max_position_embeddings": 2048,
        },
    },
    "phi3 legacy yarn means longrope": {
        "model_type": "phi3",
        **SMALL,
        "rope_scaling": {"type": "yarn", "short_factor": [1.0] * 32, "long_factor": [1.5] * 32},
    },
    "phi3 partial rotary": {"model_type": "phi3", **SMALL, "partial_rotary_factor": 0.5},
    "gpt_neox rotary_emb_base + rotary_pct": {
        "model_type": "gpt_neox",
        **SMALL,
        "rotary_emb_base": 20000,
        "rotary_pct": 0.5,
    },
    "gpt_neox class default rotary_pct": {"model_type": "gpt_neox", **SMALL},
    "glm class defaults (prf 0.5, head_dim 128)": {"model_type": "glm", **SMALL},
    "cohere class default theta": {"model_type": "cohere", **SMALL},
    "qwen2_vl mrope type (flat hub file)": {
        "model_type": "qwen2_vl",
        **SMALL,
        "rope_theta": 1e6,
        "rope_scaling": {"type": "mrope", "mrope_section": [8, 12, 12]},
    },
    "qwen2_vl text_config": {
        "model_type": "qwen2_vl",
        "text_config": {
            "model_type": "qwen2_vl_text",
            **SMALL,
            "rope_parameters": {"rope_type": "default", "rope_theta": 2e6, "mrope_section": [8, 12, 12]},
        },
    },
    "text_config ignores top-level rope keys": {
        "model_type": "qwen2_vl",
        "rope_theta": 12345.0,
        "rope_scaling": {"rope_type": "linear", "factor": 3.0},
        "text_config": {"model_type": "qwen2_vl_text", **SMALL, "head_dim": 128},
    },
    "qwen3_vl class default theta and section": {
        "model_type": "qwen3_vl",
        "text_config": {"model_type": "qwen3_vl_text", **SMALL, "head_dim": 128},
    },
    "qwen3_vl yarn + mrope_section": {
        "model_type": "qwen3_vl",
        "text_config": {
            "model_type": "qwen3_vl_text",
            **SMALL,
            "head_dim": 128,
            "rope_parameters": {
                "rope_type": "yarn",
                "factor": 4.0,
                "rope_theta": 5e6,
                "mrope_section": [24, 20, 20],
                "mrope_interleaved": True,
            },
        },
    },
    "glm4v partial rotary + sections": {
        "model_type": "glm4v",
        "text_config": {
            "model_type": "glm4v_text",
            **SMALL,
            "head_dim": 128,
            "partial_rotary_factor": 0.5,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [8, 12, 12]},
        },
    },
    "gemma3 sparse text_config (class defaults)": {
        "model_type": "gemma3",
        "text_config": {"model_type": "gemma3_text", "hidden_size": 640},
    },
    "gemma3 local base + rope_theta": {
        "model_type": "gemma3_text",
        "hidden_size": 640,
        "head_dim": 64,
        "rope_theta": 2e6,
        "rope_local_base_freq": 20000.0,
        "rope_scaling": {"rope_type": "linear", "factor": 4.0},
    },
    "gemma3 v5 per-layer-type rope_parameters": {
        "model_type": "gemma3_text",
        "hidden_size": 640,
        "head_dim": 64,
        "rope_parameters": {
            "full_attention": {"rope_type": "yarn", "factor": 8.0, "rope_theta": 1e6},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        },
    },
    "deepseek qk_rope_head_dim": {
        "model_type": "deepseek_v3",
        **SMALL,
        "qk_rope_head_dim": 32,
        "qk_nope_head_dim": 64,
        "rope_scaling": {
            "type": "yarn",
            "factor": 40,
            "mscale": 1.0,
            "mscale_all_dim": 1.0,
            "original_max_position_embeddings": 256,
        },
    },
}


def assert_config_matches_hf(config: dict[str, Any]) -> None:
    normalized = normalize_config(config)
    text = hf_text_config(config)
    entries = hf_rope_entries(text)
    assert {name for name, entry in entries.items() if entry is not None} == {
        name for name, params in normalized.layers.items() if params is not None
    }
    for layer_type, entry in entries.items():
        if entry is not None:
            assert_params_match_hf(normalized.params(layer_type), entry, text)
    if text.model_type in ROTARY_BY_TEXT_MODEL_TYPE:
        for layer_type, (inv_freq, attention_scaling) in hf_init_inv_freq(text).items():
            ours, attention_factor = compute_inv_freq(normalized.params(layer_type), None)
            assert torch.equal(ours, inv_freq), layer_type
            assert attention_factor == attention_scaling


@pytest.mark.parametrize("name", list(real_configs()))
def test_real_config_matches_transformers(name: str) -> None:
    config = real_configs()[name]
    if config.get("model_type") not in CONFIG_MAPPING:
        pytest.skip(f"{config.get('model_type')!r} is remote code: transformers 5.24 has no config class for it")
    if config.get("model_type") in WITHOUT_ROPE_PARAMETERS:
        pytest.skip(f"transformers 5.24's {config['model_type']!r} config class has no rope_parameters")
    if reads_remote_gpt_style_keys(config):
        pytest.skip("its remote config class maps n_embd/n_head/...; the in-library class of that model_type does not")
    assert_config_matches_hf(config)


def reads_remote_gpt_style_keys(config: dict[str, Any]) -> bool:
    """A file loaded through a remote config class (``auto_map.AutoConfig``) that writes the GPT-style keys only
    that class maps (REMOTE_CONFIG_KEYS): transformers' in-library class of the same model_type is no oracle."""
    auto_map = config.get("auto_map")
    remote = isinstance(auto_map, dict) and "AutoConfig" in auto_map
    return remote and any(alias in config and key not in config for key, alias in REMOTE_CONFIG_KEYS.items())


@pytest.mark.parametrize("name", sorted(preset_catalog()))
def test_preset_matches_transformers(name: str) -> None:
    assert_config_matches_hf(preset_catalog()[name]["config"])


@pytest.mark.parametrize("form", list(FORMS))
def test_config_form_matches_transformers(form: str) -> None:
    assert_config_matches_hf(FORMS[form])


def minimal_config(model_type: str) -> dict[str, Any]:
    """Only the shape keys the class would default anyway, so every rope value comes from class defaults."""
    text = CONFIG_MAPPING[model_type]().get_text_config()
    shape = {key: getattr(text, key) for key in ("hidden_size", "num_attention_heads", "max_position_embeddings")}
    return {"model_type": text.model_type, **shape}


WITHOUT_ROPE_PARAMETERS = {"gptj", "codegen", "mixformer-sequential", "phi-msft", "hunyuan"}
"""Families whose transformers 5.24 config class has no rope_parameters (GPT-J era, rotary_dim) or that exist only
as remote code (MixFormer, Tencent-Hunyuan-Large's ``hunyuan``): the family table holds their key aliases, pairing
and model-read keys, nothing to compare."""


@pytest.mark.parametrize("model_type", sorted(set(FAMILIES) - {"glm4v", "glm4v_text"} - WITHOUT_ROPE_PARAMETERS))
def test_family_class_defaults_match_transformers(model_type: str) -> None:
    """What our family table fills in for an omitted key is what the transformers config class fills in."""
    assert_config_matches_hf(minimal_config(model_type))


def test_glm4v_class_defaults_are_rejected_like_transformers_fails() -> None:
    """Glm4vTextConfig's defaults (prf 1.0, head_dim 128 -> 64 slots) cannot take its own default mrope_section
    [8, 12, 12]: transformers fails in ``torch.split`` at the first forward; we refuse at normalisation."""
    text = hf_text_config(minimal_config("glm4v"))
    module = ROTARY_BY_TEXT_MODEL_TYPE["glm4v_text"](text)
    assert module.mrope_section == MROPE_SECTION_DEFAULTS["glm4v_text"]
    with pytest.raises(RuntimeError):
        module(torch.zeros(1), torch.zeros(3, 1, 1, dtype=torch.long))
    with pytest.raises(InvalidInput, match="mrope_section"):
        normalize_config(minimal_config("glm4v"))


def test_phi3_su_without_original_max_is_accepted_unlike_transformers() -> None:
    """Documented difference: Phi3Config renames ``su`` to ``longrope`` after standardising, so validation finds
    no ``original_max_position_embeddings`` in the dict and raises KeyError. Its own next pass (the one every
    init function runs) would take the top-level value; we take that value right away."""
    config = {
        "model_type": "phi3",
        **SMALL,
        "original_max_position_embeddings": 1024,
        "rope_scaling": {"type": "su", "short_factor": [1.0] * 32, "long_factor": [1.5] * 32},
    }
    with pytest.raises(KeyError, match="original_max_position_embeddings"):
        hf_text_config(config)
    params = normalize_config(config).params()
    assert (params.rope_type, params.original_max_position_embeddings) == ("longrope", 1024)


def test_top_level_rope_keys_next_to_text_config_are_ignored() -> None:
    """The wrapper builds the text model from ``text_config`` alone (spec §3.2.5 moves only flat hub keys)."""
    config = FORMS["text_config ignores top-level rope keys"]
    params = normalize_config(config).params()
    assert (params.rope_type, params.rope_theta) == ("default", 1e6)
    assert hf_rope_entries(hf_text_config(config))["full_attention"]["rope_theta"] == 1e6


def test_phi3_class_default_original_max_overrides_the_rope_dict() -> None:
    """Phi3Config always has the attribute (default 4096), and a flat dict's value is overwritten by it (§3.2.4)."""
    params = normalize_config(FORMS["phi3 class default original_max 4096 beats the dict"]).params()
    assert params.original_max_position_embeddings == 4096
    assert normalize_config(FORMS["phi3 class default original_max 4096 beats the dict"]).sources["full_attention"][
        "original_max_position_embeddings"
    ] == ("default:class:original_max_position_embeddings")


def test_nested_yarn_truncate_is_read_per_layer_unlike_transformers() -> None:
    """Documented quirk (spec §2.4, §7.6): transformers reads yarn ``truncate`` from the top-level rope dict,
    so a per-layer ``truncate: false`` is ignored (it always truncates). We honour the layer's own value."""
    config = {
        "model_type": "gemma3_text",
        "hidden_size": 640,
        "head_dim": 64,
        "rope_parameters": {
            "full_attention": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e6, "truncate": False},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        },
    }
    params = normalize_config(config).params("full_attention")
    assert params.truncate is False
    hf_inv_freq, _ = hf_init_inv_freq(hf_text_config(config))["full_attention"]
    truncated, _ = compute_inv_freq(normalize_config(_with_truncate(config, True)).params("full_attention"), None)
    ours, _ = compute_inv_freq(params, None)
    assert torch.equal(hf_inv_freq, truncated)
    assert not torch.equal(ours, truncated)


def _with_truncate(config: dict[str, Any], truncate: bool) -> dict[str, Any]:
    full = {**config["rope_parameters"]["full_attention"], "truncate": truncate}
    return {**config, "rope_parameters": {**config["rope_parameters"], "full_attention": full}}


def test_nope_layers_are_kept_as_none() -> None:
    config = llama(
        layer_types=["full_attention", "sliding_attention"],
        rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1e6}, "sliding_attention": None},
    )
    normalized = normalize_config(config)
    assert normalized.layers["sliding_attention"] is None
    assert normalized.params().rope_theta == 1e6
    with pytest.raises(InvalidInput) as error:
        normalized.params("sliding_attention")
    assert error.value.field == "layer_type"


def test_sources_name_where_each_value_came_from() -> None:
    sources = normalize_config(FORMS["legacy rope_scaling + top-level rope_theta"]).sources["full_attention"]
    assert sources["rope_theta"] == "/rope_theta"
    assert sources["rope_type"] == "/rope_scaling/type"
    assert sources["factor"] == "/rope_scaling/factor"
    assert sources["head_dim"] == "/hidden_size"
    gemma = normalize_config(load_fixture("google__gemma-3-4b-it.json"))
    assert gemma.text_pointer == "/text_config"
    assert gemma.sources["full_attention"]["rope_type"] == "/text_config/rope_scaling/rope_type"
    assert gemma.sources["full_attention"]["rope_theta"] == "default:class:rope_theta"
    assert gemma.sources["sliding_attention"]["rope_theta"] == "default:class:rope_local_base_freq/rope_theta"
