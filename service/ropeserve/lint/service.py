"""The JSON request/response of ``POST /v1/config/validate`` (framework-free)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ropeserve.config.jsonsafe import is_json_object
from ropeserve.errors import InvalidInput
from ropeserve.lint.intent import DeploymentIntent
from ropeserve.lint.linter import lint_config

REQUEST_KEYS = frozenset({"config", "intent", "tokenizer_config", "draft_config"})


def validate_config_request(request: Mapping[str, Any]) -> dict[str, Any]:
    """Lint the config in a JSON request body and return the report as a JSON-able dict.

    Request (JSON object)::

        {
          "config": {...},                       # required: a Hugging Face config.json object
          "intent": {                            # optional; every key optional
            "engines": ["vllm==0.9.1", "sglang", {"name": "tgi", "version": ">=3.0"}],
            "max_model_len": 131072,             # or "context_length" / "n_ctx" (one of them)
            "dtype": "bf16",                     # bf16|bfloat16|fp16|float16|fp32|float32
            "phase_dtype": "float32",
            "env": {"VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"},
            "disable_sliding_window": false,     # vLLM --disable-sliding-window (caps the length at the window)
            "pairing": "neox",                   # neox|gptj: what the kernels / converted weights expect
            "mrope_layout": "interleaved",       # chunked|interleaved
            "rope_override": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768},
            "video_fps": 2.0, "max_video_seconds": 600,
            "positions": {"padding_side": "left", "position_ids": "per_row",
                          "chunked_prefill": "slice", "mrope_decode": "delta"}
          },
          "tokenizer_config": {...},             # optional: tokenizer_config.json (model_max_length)
          "draft_config": {...}                  # optional: the speculative draft model's config.json
        }

    Response: ``LintReport.as_dict()``: ``findings`` (rule, name, family, severity, artifact, pointer, engine,
    message, fix, reference), ``engines`` (derived_max_len, default_max_len, rope_cache_rows, length_check,
    override_env per target), ``numerics``, ``model``, ``intent`` and ``summary`` (counts per severity and
    ``by_rule``: what the service's findings counter is incremented with).

    Raises InvalidInput (``field`` = JSON pointer into the request) for a malformed request; problems in the
    config itself are findings, not errors.
    """
    if not is_json_object(request):
        raise InvalidInput("the request body must be a JSON object", field="")
    unknown = sorted(set(request) - REQUEST_KEYS)
    if unknown:
        raise InvalidInput(f"unknown keys {unknown}; known: {sorted(REQUEST_KEYS)}", field=f"/{unknown[0]}")
    config = request.get("config")
    if not is_json_object(config):
        raise InvalidInput("config must be a JSON object (a config.json)", field="/config")
    extras = {key: request.get(key) for key in ("tokenizer_config", "draft_config")}
    for key, value in extras.items():
        if value is not None and not is_json_object(value):
            raise InvalidInput(f"{key} must be a JSON object", field=f"/{key}")
    intent = DeploymentIntent.from_mapping(request.get("intent"), "/intent")
    return lint_config(config, intent, **extras).as_dict()
