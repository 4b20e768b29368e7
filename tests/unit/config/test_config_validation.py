"""Validation of normalised parameters: every rejection is an InvalidInput that names the offending field
(a JSON pointer into the config, or ``rope.<key>`` for explicit parameters); ``from_explicit`` builds the same
``RopeParams`` as the equivalent config.

Where transformers only warns (spec §3.3) we are stricter on purpose: a value no rope computation can serve
(θ ≤ 0, NaN, a section that does not cover the slots, factor lists of the wrong length) is refused up front
instead of failing, or silently computing garbage, at the first forward.
"""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers import LlamaConfig

from ropeserve.config import ROPE_TYPE_KEYS, RopeParams, from_explicit, normalize_config
from ropeserve.config.normalize import factor_for_rotary_dim
from ropeserve.config.params import FIELD_NAMES
from ropeserve.config.validate import NON_NEGATIVE, POSITIVE
from ropeserve.errors import InvalidInput

BASE = {"hidden_size": 256, "num_attention_heads": 4, "max_position_embeddings": 4096}
SHAPE_ONLY = {"hidden_size": 256, "num_attention_heads": 4}
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024}


def with_rope(rope: dict[str, Any]) -> dict[str, Any]:
    return {**BASE, "rope_scaling": rope}


REJECTED_CONFIGS: list[tuple[str, dict[str, Any], str]] = [
    ("unknown rope_type", with_rope({"rope_type": "foo"}), "/rope_scaling/rope_type"),
    ("rope_type not a string", with_rope({"rope_type": 3}), "/rope_scaling/rope_type"),
    ("linear without factor", with_rope({"rope_type": "linear"}), "/rope_scaling/factor"),
    ("yarn without factor", with_rope({"rope_type": "yarn"}), "/rope_scaling/factor"),
    (
        "llama3 without low_freq_factor",
        with_rope({"rope_type": "llama3", "factor": 8.0, "high_freq_factor": 4.0}),
        "/rope_scaling/low_freq_factor",
    ),
    ("odd head_dim", {**BASE, "head_dim": 7}, "/head_dim"),
    ("odd rotary width", {**BASE, "head_dim": 64, "partial_rotary_factor": 0.3}, "/partial_rotary_factor"),
    ("partial_rotary_factor 0", {**BASE, "partial_rotary_factor": 0.0}, "/partial_rotary_factor"),
    ("partial_rotary_factor > 1", {**BASE, "partial_rotary_factor": 1.5}, "/partial_rotary_factor"),
    ("theta 0", {**BASE, "rope_theta": 0}, "/rope_theta"),
    ("theta negative", {**BASE, "rope_theta": -1.0}, "/rope_theta"),
    ("theta NaN", {**BASE, "rope_theta": math.nan}, "/rope_theta"),
    ("theta infinite", {**BASE, "rope_theta": math.inf}, "/rope_theta"),
    ("theta a string", {**BASE, "rope_theta": "1e4"}, "/rope_theta"),
    ("theta in the dict", with_rope({"rope_type": "default", "rope_theta": -5.0}), "/rope_scaling/rope_theta"),
    ("factor NaN", with_rope({"rope_type": "linear", "factor": math.nan}), "/rope_scaling/factor"),
    ("factor infinite", with_rope({"rope_type": "linear", "factor": math.inf}), "/rope_scaling/factor"),
    ("factor 0", with_rope({"rope_type": "linear", "factor": 0}), "/rope_scaling/factor"),
    ("factor a bool", with_rope({"rope_type": "linear", "factor": True}), "/rope_scaling/factor"),
    ("beta_fast negative", with_rope({"rope_type": "yarn", "factor": 2.0, "beta_fast": -1}), "/rope_scaling/beta_fast"),
    (
        "original_max 0",
        with_rope({"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 0}),
        "/rope_scaling/original_max_position_embeddings",
    ),
    (
        "short_factor too short",
        with_rope({"rope_type": "longrope", "short_factor": [1.0] * 3, "long_factor": [1.0] * 32}),
        "/rope_scaling/short_factor",
    ),
    (
        "long_factor negative entry",
        with_rope({"rope_type": "longrope", "short_factor": [1.0] * 32, "long_factor": [1.0] * 31 + [-1.0]}),
        "/rope_scaling/long_factor",
    ),
    (
        "short_factor not a list",
        with_rope({"rope_type": "longrope", "short_factor": "x", "long_factor": [1.0] * 32}),
        "/rope_scaling/short_factor",
    ),
    (
        "llama3 high <= low",
        with_rope({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 4.0, "high_freq_factor": 1.0}),
        "/rope_scaling/high_freq_factor",
    ),
    (
        "mrope_section wrong sum",
        with_rope({"rope_type": "default", "mrope_section": [1, 2, 3]}),
        "/rope_scaling/mrope_section",
    ),
    (
        "mrope_section two entries",
        with_rope({"rope_type": "default", "mrope_section": [16, 16]}),
        "/rope_scaling/mrope_section",
    ),
    (
        "mrope_section negative",
        with_rope({"rope_type": "default", "mrope_section": [-1, 17, 16]}),
        "/rope_scaling/mrope_section",
    ),
    ("rope_scaling not an object", {**BASE, "rope_scaling": [1]}, "/rope_scaling"),
    (
        "per-layer entry not an object",
        {**BASE, "rope_parameters": {"full_attention": 3}},
        "/rope_parameters/full_attention",
    ),
    ("no head size at all", {"rope_theta": 1e4}, "/head_dim"),
    ("fractional head_dim", {**BASE, "head_dim": 64.5}, "/head_dim"),
    ("negative max_position_embeddings", {**BASE, "max_position_embeddings": -1}, "/max_position_embeddings"),
    (
        "dynamic without max_position_embeddings",
        {**SHAPE_ONLY, "rope_scaling": {"rope_type": "dynamic", "factor": 2}},
        "/max_position_embeddings",
    ),
    (
        "yarn null factor without max_position_embeddings",
        {**SHAPE_ONLY, "rope_scaling": {"rope_type": "yarn", "factor": None, "original_max_position_embeddings": 64}},
        "/rope_scaling/factor",
    ),
    ("every layer NoPE", {**BASE, "rope_parameters": {"full_attention": None}}, "layer_type"),
    ("text_config keys wrong", {"text_config": {**BASE, "rope_theta": "x"}}, "/text_config/rope_theta"),
    # issue 13: numbers no float holds, and finite values a formula cannot take
    ("rope_theta 10**400", {**BASE, "rope_theta": 10**400}, "/rope_theta"),
    ("hidden_size 10**400", {**BASE, "hidden_size": 10**400}, "/hidden_size"),
    ("max_position_embeddings -10**400", {**BASE, "max_position_embeddings": -(10**400)}, "/max_position_embeddings"),
    ("factor 10**400 deep in a list", {**BASE, "extra": [{"x": [10**400]}]}, "/extra/0/x/0"),
    ("nested 65 levels", {**BASE, "extra": json.loads("[" * 65 + "]" * 65)}, "/extra" + "/0" * 63),
    ("yarn beta_fast 1e308", with_rope({**YARN, "beta_fast": 1e308}), "/rope_scaling/beta_fast"),
    ("yarn beta_slow 5e-324", with_rope({**YARN, "beta_slow": 5e-324}), "/rope_scaling/beta_slow"),
    ("yarn rope_theta 1", {**with_rope(YARN), "rope_theta": 1}, "/rope_theta"),
    (
        "llama3 low_freq_factor 0",
        with_rope(
            {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8192}
            | {"low_freq_factor": 0.0, "high_freq_factor": 4.0}
        ),
        "/rope_scaling/low_freq_factor",
    ),
    (
        "dynamic rotary_dim 2",
        {**BASE, "head_dim": 2, "rope_scaling": {"rope_type": "dynamic", "factor": 2}},
        "/head_dim",
    ),
    (
        "longrope original 1",
        {
            **BASE,
            "head_dim": 4,
            "rope_scaling": {"rope_type": "longrope", "short_factor": [1, 1], "long_factor": [2, 2], "factor": 4}
            | {"original_max_position_embeddings": 1},
        },
        "/rope_scaling/original_max_position_embeddings",
    ),
    (
        "max_position_embeddings 1e308 (an integral float past int64)",
        {**BASE, "max_position_embeddings": 1e308},
        "/max_position_embeddings",
    ),
    ("max_position_embeddings 2**63", {**BASE, "max_position_embeddings": 2**63}, "/max_position_embeddings"),
    ("hidden_size 2**70: a head_dim of 2**68", {**BASE, "hidden_size": 2**70}, "/hidden_size"),
]


@pytest.mark.parametrize(
    ("config", "field"), [case[1:] for case in REJECTED_CONFIGS], ids=[c[0] for c in REJECTED_CONFIGS]
)
def test_invalid_config_names_the_field(config: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidInput) as error:
        normalize_config(config).params()
    assert error.value.field == field
    assert error.value.status == 422


def test_config_must_be_an_object() -> None:
    with pytest.raises(InvalidInput) as error:
        normalize_config([1, 2])  # type: ignore[arg-type]
    assert error.value.field == "config"


def test_transformers_rejects_what_it_cannot_build_and_so_do_we() -> None:
    """The errors transformers raises at config construction (spec §3.3 rows 6 and 10) are errors here too."""
    with pytest.raises(Exception, match="even"):
        LlamaConfig(**BASE, head_dim=7)
    with pytest.raises(KeyError, match="factor"):
        LlamaConfig(**BASE, rope_parameters={"rope_type": "yarn", "rope_theta": 1e4})
    for config in ({**BASE, "head_dim": 7}, with_rope({"rope_type": "yarn", "rope_theta": 1e4})):
        with pytest.raises(InvalidInput):
            normalize_config(config)


def test_factor_below_one_is_accepted_as_transformers_accepts_it() -> None:
    """transformers warns for factor < 1 (§3.3 row 13) but computes; so do we."""
    params = normalize_config(with_rope({"rope_type": "linear", "factor": 0.5})).params()
    assert params.factor == 0.5


REJECTED_EXPLICIT: list[tuple[str, dict[str, Any], str]] = [
    ("rotary_dim > head_dim", {"rope_theta": 1e4, "head_dim": 8, "rotary_dim": 10}, "rope.rotary_dim"),
    ("rotary_dim odd", {"rope_theta": 1e4, "head_dim": 8, "rotary_dim": 3}, "rope.rotary_dim"),
    ("rotary_dim a bool", {"rope_theta": 1e4, "head_dim": 8, "rotary_dim": True}, "rope.rotary_dim"),
    ("rotary_dim without head_dim", {"rope_theta": 1e4, "rotary_dim": 4}, "rope.rotary_dim"),
    ("no head_dim", {"rope_theta": 1e4}, "rope.head_dim"),
    ("odd head_dim", {"rope_theta": 1e4, "head_dim": 7}, "rope.head_dim"),
    ("unknown rope_type", {"rope_type": "bogus", "head_dim": 8}, "rope.rope_type"),
    ("theta <= 0", {"rope_theta": 0, "head_dim": 8}, "rope.rope_theta"),
    ("NaN factor", {"rope_type": "linear", "rope_theta": 1e4, "head_dim": 8, "factor": math.nan}, "rope.factor"),
    (
        "dynamic without max_position_embeddings",
        {"rope_type": "dynamic", "head_dim": 8, "factor": 2.0},
        "rope.max_position_embeddings",
    ),
    ("yarn without factor", {"rope_type": "yarn", "head_dim": 8, "max_position_embeddings": 64}, "rope.factor"),
    # issue 13 item 10: a key that is no parameter, or not one of the type's, is an error (not silently ignored)
    ("typo rope_thetaa", {"rope_thetaa": 5e5, "head_dim": 8}, "rope.rope_thetaa"),
    ("typo rope_typ", {"rope_typ": "linear", "factor": 4.0, "head_dim": 8}, "rope.rope_typ"),
    ("factor on default", {"rope_type": "default", "factor": 4.0, "head_dim": 8}, "rope.factor"),
    ("beta_fast on linear", {"rope_type": "linear", "factor": 4.0, "beta_fast": 32, "head_dim": 8}, "rope.beta_fast"),
    ("head_dim 10**400", {"head_dim": 10**400, "rotary_dim": 8}, "rope.head_dim"),
    ("factor 10**400", {"rope_type": "linear", "factor": 10**400, "head_dim": 8}, "rope.factor"),
    (
        "short_factor entry 10**400",
        {"rope_type": "longrope", "head_dim": 4, "short_factor": [10**400, 1], "long_factor": [1, 1]}
        | {"original_max_position_embeddings": 16},
        "rope.short_factor[0]",
    ),
]


@pytest.mark.parametrize(("rope", "field"), [c[1:] for c in REJECTED_EXPLICIT], ids=[c[0] for c in REJECTED_EXPLICIT])
def test_invalid_explicit_params_name_the_rope_key(rope: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidInput) as error:
        from_explicit(rope)
    assert error.value.field == field


def test_explicit_params_accept_every_key_of_their_type() -> None:
    """The key check refuses typos only: the explicit-only keys and each type's own keys still build."""
    params = from_explicit(
        {**YARN, "rope_theta": 1e4, "head_dim": 8, "rotary_dim": 8, "max_position_embeddings": 4096}
        | {"beta_fast": 16.0, "beta_slow": 2.0, "mscale": 1.0, "mscale_all_dim": 1.0, "truncate": False}
        | {"type": "yarn", "partial_rotary_factor": 1.0, "model_type": "llama"}
    )
    assert (params.rope_type, params.beta_fast, params.truncate) == ("yarn", 16.0, False)


def test_a_config_stays_lenient_about_unknown_rope_keys() -> None:
    """A Hugging Face config keeps transformers' leniency (the linter reports such keys as RS107)."""
    params = normalize_config(with_rope({"rope_type": "linear", "factor": 4.0, "rope_thetaa": 5e5})).params()
    assert (params.rope_type, params.factor, params.rope_theta) == ("linear", 4.0, 10000.0)


def test_explicit_params_must_be_an_object() -> None:
    with pytest.raises(InvalidInput) as error:
        from_explicit("yarn")  # type: ignore[arg-type]
    assert error.value.field == "rope"


EXPLICIT_EQUIVALENTS: list[tuple[dict[str, Any], dict[str, Any]]] = [
    (
        {"rope_type": "default", "rope_theta": 1e4, "head_dim": 64},
        {"head_dim": 64, "rope_parameters": {"rope_type": "default", "rope_theta": 1e4}},
    ),
    (
        {
            "rope_type": "yarn",
            "rope_theta": 1e6,
            "head_dim": 128,
            "factor": 4.0,
            "original_max_position_embeddings": 32768,
            "max_position_embeddings": 131072,
        },
        {
            "head_dim": 128,
            "max_position_embeddings": 131072,
            "rope_parameters": {
                "rope_type": "yarn",
                "rope_theta": 1e6,
                "factor": 4.0,
                "original_max_position_embeddings": 32768,
            },
        },
    ),
    (
        {"rope_type": "default", "rope_theta": 1e4, "head_dim": 128, "rotary_dim": 64},
        {"head_dim": 128, "rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5}},
    ),
    (
        {"type": "mrope", "rope_theta": 1e6, "head_dim": 128, "mrope_section": [16, 24, 24]},
        {"head_dim": 128, "rope_scaling": {"type": "mrope", "rope_theta": 1e6, "mrope_section": [16, 24, 24]}},
    ),
]


@pytest.mark.parametrize(("explicit", "config"), EXPLICIT_EQUIVALENTS)
def test_explicit_params_equal_the_equivalent_config(explicit: dict[str, Any], config: dict[str, Any]) -> None:
    assert from_explicit(explicit) == normalize_config(config).params()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(head_dim=st.integers(2, 4096), data=st.data())
def test_rotary_dim_round_trips_through_the_partial_rotary_factor(head_dim: int, data: st.DataObject) -> None:
    """``int(head_dim * (r / head_dim))`` can truncate to ``r − 1`` (e.g. 30/44); the factor we store never does."""
    rotary_dim = data.draw(st.integers(1, head_dim // 2)) * 2
    factor = factor_for_rotary_dim(rotary_dim, head_dim)
    assert 0 < factor <= 1
    assert int(head_dim * factor) == rotary_dim


def test_explicit_original_max_wins_over_a_family_class_default() -> None:
    """Phi-3's class default (4096) overrides a config's rope-dict value, but never an explicit parameter."""
    longrope = {"rope_type": "longrope", "short_factor": [1.0] * 4, "long_factor": [2.0] * 4, "factor": 4.0}
    explicit = {**longrope, "model_type": "phi3", "head_dim": 8, "original_max_position_embeddings": 8192}
    assert from_explicit(explicit).original_max_position_embeddings == 8192
    assert from_explicit({**explicit, "model_type": "llama"}).original_max_position_embeddings == 8192


def test_rotary_dim_30_of_44_is_kept() -> None:
    assert int(44 * (30 / 44)) == 29  # the naive quotient loses a channel
    params = from_explicit({"rope_theta": 1e4, "head_dim": 44, "rotary_dim": 30})
    assert params.rotary_dim == 30


def test_every_rope_type_has_a_key_schema_and_as_dict_is_json_ready() -> None:
    assert set(ROPE_TYPE_KEYS) == {"default", "linear", "dynamic", "yarn", "longrope", "llama3", "proportional", "ntk"}
    params = normalize_config(
        with_rope({"rope_type": "longrope", "short_factor": [1.0] * 32, "long_factor": [2.0] * 32})
    ).params()
    as_dict = params.as_dict()
    assert as_dict["short_factor"] == [1.0] * 32
    assert as_dict["rotary_dim"] == 64
    assert "attention_factor" not in as_dict
    assert isinstance(hash(params), int)
    assert RopeParams(**vars(params)) == params


def test_range_checked_keys_are_rope_params_fields() -> None:
    """``range_problems`` reads these keys as attributes of ``RopeParams`` (a key kept in ``extras`` would not be)."""
    assert set(POSITIVE + NON_NEGATIVE) <= set(FIELD_NAMES)
