"""Model-family facts that a ``config.json`` leaves implicit (torch-free).

Each ``FAMILIES`` entry mirrors what the transformers 5.24 config class of that ``model_type`` supplies when the
hub file omits a key: the default ``rope_theta``, class defaults such as Gemma-3's sparse text config, how M-RoPE
frequencies are laid out, which key holds the rotary head size, the channel pairing (NeoX or GPT-J), the class's
``attribute_map`` and the legacy longrope aliases. ``MROPE_POSITIONS`` and ``POSITION_ALIASES`` are the data of
``/v1/mrope/positions`` (token ids, temporal rule, merge size per family), read by ``ropeserve.positions.families``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

from ropeserve.config.jsonsafe import is_json_object

MropeLayout = Literal["chunked", "interleaved"]


TemporalRuleName = Literal["frame_index", "seconds", "frame_blocks", "frame_stride"]


@dataclass(frozen=True)
class MropePositions:
    """How a vision-language family builds M-RoPE position ids (read by ``ropeserve.positions``).

    ``name`` is the canonical family name of ``/v1/mrope/positions``; ``temporal_rule`` names how video frames map
    onto the temporal axis (``positions.families.TemporalRule``); token ids and ``tokens_per_second`` are the
    released checkpoints' defaults."""

    name: str
    temporal_rule: TemporalRuleName
    image_token_id: int
    video_token_id: int
    spatial_merge_size: int = 2
    tokens_per_second: float | None = None
    video_temporal_merge_size: int = 1
    """A video's merged ``t`` is ``t // video_temporal_merge_size`` (ERNIE-4.5-VL: 2); images keep ``t``."""


Pairing = Literal["neox", "gptj"]
"""How channels pair up for rotation: NeoX halves or GPT-J adjacent channels."""


@dataclass(frozen=True)
class ModelFamily:
    """What a model type implies beyond its config file."""

    default_theta: float = 10_000.0
    class_defaults: MappingProxyType[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    mrope_section: tuple[int, ...] | None = None
    mrope_layout: MropeLayout | None = None
    head_dim_key: str | None = None
    legacy_longrope_aliases: frozenset[str] = frozenset({"su"})
    pairing: Pairing = "neox"
    positions: MropePositions | None = None
    attribute_map: MappingProxyType[str, str] = field(default_factory=lambda: MappingProxyType({}))
    """The config class's ``attribute_map``: canonical key -> the key this family's files write (GPT-J's n_embd)."""
    rope_keys_read: frozenset[str] = frozenset()
    """Rope-dict keys outside the rope-type schema that this family's model class reads itself (HunYuan's ``alpha``)."""


def _family(**kwargs: Any) -> ModelFamily:
    defaults = kwargs.pop("class_defaults", {})
    aliases = kwargs.pop("attribute_map", {})
    return ModelFamily(class_defaults=MappingProxyType(defaults), attribute_map=MappingProxyType(aliases), **kwargs)


_QWEN_VISION_IDS = (151655, 151656)
_QWEN2_VL_ROPE = {"default_theta": 1e6, "mrope_section": (16, 24, 24), "mrope_layout": "chunked"}
_QWEN2_VL = _family(**_QWEN2_VL_ROPE, positions=MropePositions("qwen2_vl", "frame_index", *_QWEN_VISION_IDS))
# Released Qwen2.5-VL checkpoints set vision_config.tokens_per_second = 2 (the config class default is 4).
_QWEN2_5_VL = _family(
    **_QWEN2_VL_ROPE, positions=MropePositions("qwen2_5_vl", "seconds", *_QWEN_VISION_IDS, tokens_per_second=2.0)
)
_QWEN2_5_OMNI = _family(**_QWEN2_VL_ROPE)
"""Omni's position ids also interleave audio: not served by /v1/mrope/positions."""
_QWEN3_VL = _family(
    default_theta=5e5,
    mrope_section=(24, 20, 20),
    mrope_layout="interleaved",
    positions=MropePositions("qwen3_vl", "frame_blocks", *_QWEN_VISION_IDS),
)
_GLM4V = _family(
    mrope_section=(8, 12, 12),
    mrope_layout="chunked",
    pairing="gptj",
    positions=MropePositions("glm4v", "frame_blocks", 151343, 151344),
)
_GEMMA3_TEXT = _family(
    default_theta=1e6,
    class_defaults={
        "rope_theta": 1e6,
        "rope_local_base_freq": 10_000.0,
        "head_dim": 256,
        "max_position_embeddings": 131_072,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "sliding_window_pattern": 6,
    },
)
_DEEPSEEK = _family(class_defaults={"qk_rope_head_dim": 64}, head_dim_key="qk_rope_head_dim", pairing="gptj")
_GPT2_STYLE_KEYS = {
    "hidden_size": "n_embd",
    "num_attention_heads": "n_head",
    "max_position_embeddings": "n_positions",
    "num_hidden_layers": "n_layer",
}
"""GPT2Config / GPTJConfig / CodeGenConfig ``attribute_map``; the remote-code MixFormer configs of the first
phi-1.5/phi-2 releases write the same keys. Their ``rotary_dim`` (the rotating channels) sits next to them."""
REMOTE_CONFIG_KEYS = MappingProxyType(_GPT2_STYLE_KEYS)
"""Aliases read when the file names a remote config class (``auto_map.AutoConfig``, trust_remote_code): the remote
classes of the GPT-style releases in the corpus (phi-1.5's ``PhiConfig`` of Oct 2023 under ``model_type`` "phi",
the first granite-code ``GraniteConfig``, Falcon's ``RWConfig``) all map these keys, and the in-library class of
the same ``model_type`` does not apply to such a file."""
_GPTJ = _family(attribute_map=_GPT2_STYLE_KEYS, pairing="gptj")
"""GPT-J and CodeGen rotate interleaved pairs (rotate_every_two)."""
_MIXFORMER = _family(attribute_map=_GPT2_STYLE_KEYS)
_FALCON = _family(
    attribute_map={"num_attention_heads": "n_head", "num_hidden_layers": "n_layer"},
    class_defaults={"max_position_embeddings": 2048},
)
"""FalconConfig: ``attribute_map`` of the RW-era keys (HF staff re-saves of falcon-7b write ``n_head``); no length
key in the falcon-7b/40b files, the class default (2048) is their trained context."""
_LLAMA = _family(class_defaults={"hidden_size": 4096, "num_attention_heads": 32, "max_position_embeddings": 2048})
"""LlamaConfig's defaults: a sparse ``text_config`` (llava-1.5) leaves them out."""
_HUNYUAN = _family(rope_keys_read=frozenset({"alpha"}))
"""HunYuan's NTK-alpha, base ``rope_theta * alpha ** (d / (d - 2))``: transformers' HunYuan classes compute it
model-locally (``ntk_alpha``) and vLLM's DynamicNTKAlphaRotaryEmbedding was written for it; the key is outside the
generic rope schema. ``hunyuan`` is the remote-code type of Tencent-Hunyuan-Large (alpha 1000, factor 1.0)."""
_QWEN3_5 = _family(
    class_defaults={"partial_rotary_factor": 0.25, "head_dim": 256},
    mrope_section=(11, 11, 10),
    mrope_layout="interleaved",
    positions=MropePositions("qwen3_5", "frame_blocks", 248056, 248057),
)

FAMILIES: dict[str, ModelFamily] = {
    "qwen2_vl": _QWEN2_VL,
    "qwen2_vl_text": _QWEN2_VL,
    "qwen2_5_vl": _QWEN2_5_VL,
    "qwen2_5_vl_text": _QWEN2_5_VL,
    "qwen2_5_omni": _QWEN2_5_OMNI,
    "qwen2_5_omni_thinker": _QWEN2_5_OMNI,
    "qwen2_5_omni_text": _QWEN2_5_OMNI,
    "qwen3_vl": _QWEN3_VL,
    "qwen3_vl_text": _QWEN3_VL,
    "qwen3_vl_moe": _QWEN3_VL,
    "qwen3_vl_moe_text": _QWEN3_VL,
    "qwen3_5": _QWEN3_5,
    "qwen3_5_text": _QWEN3_5,
    "glm4v": _GLM4V,
    "glm4v_text": _GLM4V,
    "gemma3": _GEMMA3_TEXT,
    "gemma3_text": _GEMMA3_TEXT,
    "deepseek_v2": _DEEPSEEK,
    "deepseek_v3": _DEEPSEEK,
    "phi3": _family(
        class_defaults={"original_max_position_embeddings": 4096}, legacy_longrope_aliases=frozenset({"su", "yarn"})
    ),
    "glm": _family(class_defaults={"partial_rotary_factor": 0.5, "head_dim": 128}, pairing="gptj"),
    "cohere": _family(default_theta=500_000.0, pairing="gptj"),
    "gpt_neox": _family(class_defaults={"partial_rotary_factor": 0.25}),
    "persimmon": _family(class_defaults={"partial_rotary_factor": 0.5}),
    "llama": _LLAMA,
    "falcon": _FALCON,
    "gptj": _GPTJ,
    "codegen": _GPTJ,
    "mixformer-sequential": _MIXFORMER,
    "phi-msft": _MIXFORMER,
    "minicpm3": _family(class_defaults={"qk_rope_head_dim": 32}, head_dim_key="qk_rope_head_dim"),
    "hunyuan": _HUNYUAN,
    "hunyuan_v1_dense": _HUNYUAN,
    "hunyuan_v1_moe": _HUNYUAN,
}


_POSITION_ONLY = (
    MropePositions("paddleocr_vl", "frame_index", 100295, 100296),
    MropePositions("ernie4_5_vl_moe", "frame_index", 100295, 103367, video_temporal_merge_size=2),
    MropePositions("glm4v_moe", "frame_blocks", 151363, 151364),
    MropePositions("glm_ocr", "frame_blocks", 59280, 59281),
    MropePositions("cohere_compass", "frame_blocks", 255031, 255032),
    MropePositions("cosmos3_edge", "frame_blocks", 19, 18),
    MropePositions("hy_v4_vl", "frame_stride", 120120, 120124),
)
"""M-RoPE position rules of model types whose rope parameters need no family entry above."""

MROPE_POSITIONS: dict[str, MropePositions] = {
    spec.name: spec
    for spec in (*(family.positions for family in FAMILIES.values() if family.positions is not None), *_POSITION_ONLY)
}
"""Family name -> how its M-RoPE position ids run (token ids and merge size: the transformers 5.24 config class
defaults). Each entry is one transformers module whose ``get_rope_index`` follows the entry's temporal rule."""

POSITION_ALIASES: dict[str, str] = {
    "glm46v": "glm4v",
    "qwen3_vl_moe": "qwen3_vl",
    "cosmos3_omni": "qwen3_vl",
    "qwen3_5_moe": "qwen3_5",
    "qwen4_exp": "qwen3_5",
}
"""transformers modules whose ``get_rope_index``, token ids and merge size are another family's."""

GENERIC = ModelFamily()


def attribute_map_of(family: ModelFamily, section: Mapping[str, Any]) -> Mapping[str, str]:
    """The aliases the class that loads ``section`` maps: the family's, plus REMOTE_CONFIG_KEYS when the file names
    a remote config class (its own keys win)."""
    auto_map = section.get("auto_map")
    if is_json_object(auto_map) and "AutoConfig" in auto_map:
        return {**REMOTE_CONFIG_KEYS, **family.attribute_map}
    return family.attribute_map


def family_of(model_type: str | None) -> ModelFamily:
    """The family entry for ``model_type``; the generic Llama-like family when unknown."""
    return FAMILIES.get(model_type or "", GENERIC)
